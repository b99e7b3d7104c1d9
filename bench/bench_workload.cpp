#include "bench/bench_workload.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <stdexcept>

namespace troupe::bench {

namespace {

void check_tokens(const token_space& t) {
  if (t.first_id < 0 || t.vocab_size <= t.first_id)
    throw std::invalid_argument("token ids: need 0 <= first id < vocab size (got " +
                                std::to_string(t.first_id) + ", " + std::to_string(t.vocab_size) +
                                ")");
}

int32_t token_at(const token_space& t, uint64_t k) {
  return t.first_id + static_cast<int32_t>(k % static_cast<uint64_t>(t.vocab_size - t.first_id));
}

// Times as offsets from the first (the schedules and traces send the first at 0).
void shift_to_zero(std::vector<double>& times) {
  if (times.empty()) return;
  const double t0 = times.front();
  for (auto& t : times) t -= t0;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, const token_space& t, int n) {
  std::uniform_int_distribution<uint64_t> pick(0, std::numeric_limits<uint32_t>::max());
  std::vector<int32_t> out(n);
  for (auto& id : out) id = token_at(t, pick(rng));
  return out;
}

// vLLM's random-range-ratio bounds, inclusive.
std::pair<int, int> length_range(int len, double ratio, int floor_at) {
  int lo = static_cast<int>(std::floor(len * (1.0 - ratio)));
  int hi = static_cast<int>(std::ceil(len * (1.0 + ratio)));
  return {std::max(lo, floor_at), std::max(hi, floor_at)};
}

}  // namespace

std::vector<bench_request> random_dataset(size_t n, const random_spec& spec, uint64_t seed) {
  check_tokens(spec.tokens);
  if (spec.input_len < 0 || spec.output_len < 1 || spec.prefix_len < 0)
    throw std::invalid_argument("random dataset: input length >= 0, output length >= 1");
  if (!(spec.range_ratio >= 0 && spec.range_ratio < 1))
    throw std::invalid_argument("random dataset: range ratio must be in [0, 1)");
  if (spec.input_len + spec.prefix_len < 1)
    throw std::invalid_argument("random dataset: prompts need at least one token");
  std::mt19937_64 rng(seed);
  auto [in_lo, in_hi] = length_range(spec.input_len, spec.range_ratio, 0);
  auto [out_lo, out_hi] = length_range(spec.output_len, spec.range_ratio, 1);
  if (spec.prefix_len == 0) in_lo = std::max(in_lo, 1);
  in_hi = std::max(in_hi, in_lo);
  std::uniform_int_distribution<int> in_len(in_lo, in_hi), out_len(out_lo, out_hi);
  std::uniform_int_distribution<uint64_t> offset(0, spec.tokens.vocab_size - 1);
  // Token ids from their own generator under a salt; `rng` still draws
  // them too, so the lengths stay those of salt 0.
  std::mt19937_64 salted(seed ^ (spec.content_salt * 0x9E3779B97F4A7C15ull));
  auto prefix = random_tokens(rng, spec.tokens, spec.prefix_len);
  if (spec.content_salt != 0) prefix = random_tokens(salted, spec.tokens, spec.prefix_len);
  std::vector<bench_request> out(n);
  for (size_t i = 0; i < n; ++i) {
    auto& r = out[i];
    r.index = i;
    const int len = in_len(rng);
    r.output_len = out_len(rng);
    uint64_t off = offset(rng);
    if (spec.content_salt != 0) off = offset(salted);
    r.prompt_tokens = prefix;
    for (int j = 0; j < len; ++j) r.prompt_tokens.push_back(token_at(spec.tokens, off + i + j));
    r.prompt_len = static_cast<int>(r.prompt_tokens.size());
  }
  return out;
}

std::vector<bench_request> shared_prefix_dataset(size_t n, const shared_prefix_spec& spec,
                                                 uint64_t seed) {
  check_tokens(spec.tokens);
  if (spec.num_groups < 1 || spec.prefix_len < 0 || spec.suffix_len < 0 || spec.output_len < 1 ||
      spec.prefix_len + spec.suffix_len < 1)
    throw std::invalid_argument(
        "shared-prefix dataset: groups >= 1, output length >= 1, prompts need a token");
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prefixes;
  for (int g = 0; g < spec.num_groups; ++g)
    prefixes.push_back(random_tokens(rng, spec.tokens, spec.prefix_len));
  std::vector<bench_request> out(n);
  for (size_t i = 0; i < n; ++i) {
    auto& r = out[i];
    r.prompt_tokens = prefixes[i % prefixes.size()];
    auto suffix = random_tokens(rng, spec.tokens, spec.suffix_len);
    r.prompt_tokens.insert(r.prompt_tokens.end(), suffix.begin(), suffix.end());
    r.prompt_len = static_cast<int>(r.prompt_tokens.size());
    r.output_len = spec.output_len;
  }
  // Interleave the groups as vLLM's prefix_repetition does.
  std::shuffle(out.begin(), out.end(), rng);
  for (size_t i = 0; i < n; ++i) out[i].index = i;
  return out;
}

std::vector<bench_request> multi_turn_dataset(size_t n, const multi_turn_spec& spec,
                                              uint64_t seed) {
  check_tokens(spec.tokens);
  if (spec.turns < 1 || spec.system_len < 0 || spec.user_len < 1 || spec.answer_len < 0 ||
      spec.output_len < 1 || !(spec.think_s >= 0))
    throw std::invalid_argument(
        "multi-turn dataset: turns >= 1, user length >= 1, output length >= 1, system and "
        "answer lengths and think time >= 0");
  std::mt19937_64 rng(seed);
  const auto shared = random_tokens(rng, spec.tokens, spec.system_len);
  std::vector<bench_request> out;
  out.reserve(n);
  while (out.size() < n) {
    std::vector<int32_t> history =
        spec.shared_system ? shared : random_tokens(rng, spec.tokens, spec.system_len);
    for (int t = 0; t < spec.turns && out.size() < n; ++t) {
      if (t > 0) {
        auto answer = random_tokens(rng, spec.tokens, spec.answer_len);
        history.insert(history.end(), answer.begin(), answer.end());
      }
      auto user = random_tokens(rng, spec.tokens, spec.user_len);
      history.insert(history.end(), user.begin(), user.end());
      bench_request r;
      r.index = out.size();
      r.prompt_tokens = history;
      r.prompt_len = static_cast<int>(history.size());
      r.output_len = spec.output_len;
      r.turn = t;
      r.after = t == 0 ? -1 : static_cast<long>(out.size()) - 1;
      r.think_s = t == 0 ? 0 : spec.think_s;
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<bench_request> jsonl_dataset(const std::string& path, size_t n, int default_output) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("dataset " + path + ": cannot open");
  std::vector<bench_request> lines;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = path + ":" + std::to_string(lineno) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(where + e.what());
    }
    if (!j.is_object() || !j.contains("prompt"))
      throw std::runtime_error(where + "expected an object with \"prompt\"");
    bench_request r;
    const auto& p = j["prompt"];
    if (p.is_string()) {
      r.prompt_text = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const auto& x) {
                 return x.is_number_integer();
               })) {
      r.prompt_tokens = p.get<std::vector<int32_t>>();
      r.prompt_len = static_cast<int>(r.prompt_tokens.size());
    } else {
      throw std::runtime_error(where + "\"prompt\" must be a string or an array of token ids");
    }
    r.output_len = default_output;
    for (const char* key : {"output_tokens", "output_len", "max_tokens"})
      if (j.contains(key)) {
        if (!j[key].is_number_integer() || j[key].get<int>() < 1)
          throw std::runtime_error(where + "\"" + key + "\" must be a positive integer");
        r.output_len = j[key].get<int>();
        break;
      }
    lines.push_back(std::move(r));
  }
  if (lines.empty()) throw std::runtime_error("dataset " + path + ": no prompts");
  std::vector<bench_request> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = lines[i % lines.size()];
    out[i].index = i;
  }
  return out;
}

void assign_classes(std::vector<bench_request>& reqs, double offline_fraction, uint64_t seed) {
  if (!(offline_fraction >= 0 && offline_fraction <= 1))
    throw std::invalid_argument("offline fraction must be in [0, 1]");
  std::vector<size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed ^ 0x0ff1e);
  std::shuffle(order.begin(), order.end(), rng);
  const auto k = static_cast<size_t>(std::llround(reqs.size() * offline_fraction));
  for (size_t i = 0; i < reqs.size(); ++i) reqs[order[i]].offline = i < k;
}

std::vector<double> gamma_arrivals(size_t n, double rate, double burstiness, uint64_t seed) {
  if (!(rate > 0)) throw std::invalid_argument("request rate must be > 0 (or inf)");
  if (!(burstiness > 0 && std::isfinite(burstiness)))
    throw std::invalid_argument("burstiness must be > 0");
  std::vector<double> out(n, 0.0);
  if (std::isinf(rate)) return out;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (size_t i = 1; i < n; ++i) out[i] = out[i - 1] + gap(rng);
  return out;
}

std::vector<double> diurnal_arrivals(size_t n, double peak_rate, double trough, double period_s,
                                     uint64_t seed) {
  if (!(peak_rate > 0 && std::isfinite(peak_rate)))
    throw std::invalid_argument("diurnal: the peak rate must be finite and > 0");
  if (!(trough >= 0 && trough <= 1)) throw std::invalid_argument("diurnal: trough in [0, 1]");
  if (!(period_s > 0 && std::isfinite(period_s)))
    throw std::invalid_argument("diurnal: the period must be > 0");
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(peak_rate);
  std::uniform_real_distribution<double> keep(0, 1);
  const double pi = 3.14159265358979323846;
  std::vector<double> out;
  out.reserve(n);
  double t = 0;
  while (out.size() < n) {
    t += gap(rng);
    const double share = trough + (1 - trough) * 0.5 * (1 - std::cos(2 * pi * t / period_s));
    if (keep(rng) < share) out.push_back(t);
  }
  shift_to_zero(out);
  return out;
}

// A replayed trace spans at most 10^7 s (116 days; Azure's week-long
// traces span 6 * 10^5): the simulator steps through the idle time in
// monitor windows, and a timestamp of 1e308 made it run for ever.
constexpr double kMaxTraceSpanS = 1e7;

namespace {

// Both trace readers: appends the next time `t` (as read) to `times`,
// checked finite, not decreasing and within kMaxTraceSpanS of the first
// (shift_to_zero then makes them send offsets).
void append_send_time(std::vector<double>& times, double t, const std::string& where) {
  if (!std::isfinite(t)) throw std::runtime_error(where + "not a finite time");
  if (!times.empty() && t < times.back()) throw std::runtime_error(where + "timestamps decrease");
  if (!times.empty() && t - times.front() > kMaxTraceSpanS)
    throw std::runtime_error(where + "more than " + std::to_string(int64_t(kMaxTraceSpanS)) +
                             " s after the first (a trace spans at most that)");
  times.push_back(t);
}

}  // namespace

std::vector<double> load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("trace " + path + ": cannot open");
  std::vector<double> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = path + ":" + std::to_string(lineno) + ": ";
    double t = 0;
    try {
      auto j = nlohmann::json::parse(line);
      if (j.is_number())
        t = j.get<double>();
      else if (j.is_object() && j.contains("timestamp") && j["timestamp"].is_number())
        t = j["timestamp"].get<double>();
      else
        throw std::runtime_error("expected a number or {\"timestamp\": seconds}");
    } catch (const std::exception& e) {
      throw std::runtime_error(where + e.what());
    }
    append_send_time(out, t, where);
  }
  if (out.empty()) throw std::runtime_error("trace " + path + ": no timestamps");
  shift_to_zero(out);
  return out;
}

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == ',')
      out.emplace_back();
    else if (c != '\r' && c != '"')
      out.back() += c;
  }
  for (auto& f : out) {
    const auto a = f.find_first_not_of(' '), b = f.find_last_not_of(' ');
    f = a == std::string::npos ? "" : f.substr(a, b - a + 1);
  }
  return out;
}

// Days from 1970-01-01 to y-m-d (the proleptic Gregorian calendar).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// Seconds: a plain number, or "YYYY-MM-DD HH:MM:SS[.f][+HH:MM|Z]".
double parse_timestamp(const std::string& s) {
  char* end = nullptr;
  const double plain = std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && !s.empty() && s.find('-', 1) == std::string::npos) return plain;
  int y, mo, d, h, mi;
  double sec;
  int used = 0;
  if (std::sscanf(s.c_str(), "%d-%d-%d%*[ T]%d:%d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
      mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 ||
      sec >= 61)
    throw std::runtime_error("TIMESTAMP '" + s + "' is neither seconds nor YYYY-MM-DD HH:MM:SS");
  double t = double(days_from_civil(y, mo, d)) * 86400 + h * 3600 + mi * 60 + sec;
  const std::string zone = s.substr(size_t(used));
  int zh = 0, zm = 0;
  if (!zone.empty() && zone != "Z") {
    if ((zone[0] != '+' && zone[0] != '-') || std::sscanf(zone.c_str() + 1, "%d:%d", &zh, &zm) != 2)
      throw std::runtime_error("TIMESTAMP '" + s + "': unreadable time zone '" + zone + "'");
    t -= (zone[0] == '+' ? 1 : -1) * (zh * 3600.0 + zm * 60.0);
  }
  return t;
}

}  // namespace

request_trace load_azure_trace(const std::string& path, size_t n, const token_space& tokens,
                               uint64_t seed) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("trace " + path + ": cannot open");
  std::string line;
  int col_t = -1, col_in = -1, col_out = -1;
  if (std::getline(in, line)) {
    const auto head = split_csv(line);
    for (size_t i = 0; i < head.size(); ++i) {
      std::string h = head[i];
      for (auto& c : h) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (h == "timestamp") col_t = int(i);
      if (h == "contexttokens") col_in = int(i);
      if (h == "generatedtokens") col_out = int(i);
    }
  }
  if (col_t < 0 || col_in < 0 || col_out < 0)
    throw std::runtime_error("trace " + path +
                             ": the first line must name the columns TIMESTAMP, ContextTokens and "
                             "GeneratedTokens (the Azure LLM inference trace)");
  request_trace out;
  std::mt19937_64 rng(seed);
  for (int lineno = 2; out.requests.size() < n && std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = path + ":" + std::to_string(lineno) + ": ";
    const auto f = split_csv(line);
    if (int(f.size()) <= std::max({col_t, col_in, col_out}))
      throw std::runtime_error(where + "fewer columns than the header");
    double t = 0;
    long long in_len = 0, out_len = 0;
    try {
      t = parse_timestamp(f[size_t(col_t)]);
      size_t used = 0;
      in_len = std::stoll(f[size_t(col_in)], &used);
      if (used != f[size_t(col_in)].size()) throw std::invalid_argument("ContextTokens");
      out_len = std::stoll(f[size_t(col_out)], &used);
      if (used != f[size_t(col_out)].size()) throw std::invalid_argument("GeneratedTokens");
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(where + e.what());
    } catch (const std::exception&) {
      throw std::runtime_error(where + "ContextTokens and GeneratedTokens must be whole numbers");
    }
    if (in_len < 1 || in_len > 1000000 || out_len < 1 || out_len > 1000000)
      throw std::runtime_error(where + "token counts must be 1 to 1000000");
    append_send_time(out.send_s, t, where);
    bench_request r;
    r.index = out.requests.size();
    r.prompt_tokens = random_tokens(rng, tokens, int(in_len));
    r.prompt_len = int(in_len);
    r.output_len = int(out_len);
    out.requests.push_back(std::move(r));
  }
  if (out.requests.empty()) throw std::runtime_error("trace " + path + ": no requests");
  shift_to_zero(out.send_s);
  return out;
}

}  // namespace troupe::bench
