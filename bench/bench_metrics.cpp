#include "bench/bench_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace troupe::bench {

double request_record::tpot() const {
  if (output_tokens <= 1) return 0.0;
  return (e2e() - ttft()) / (output_tokens - 1);
}

std::vector<double> request_record::itls() const {
  std::vector<double> out;
  for (size_t i = 1; i < chunk_times.size(); ++i)
    out.push_back(chunk_times[i] - chunk_times[i - 1]);
  return out;
}

slo slo::parse(const std::vector<std::string>& items) {
  slo s;
  for (const auto& item : items) {
    auto colon = item.find(':');
    if (colon == std::string::npos)
      throw std::invalid_argument("goodput item '" + item + "': expected NAME:MILLISECONDS");
    auto name = item.substr(0, colon);
    double ms = 0;
    try {
      size_t used = 0;
      ms = std::stod(item.substr(colon + 1), &used);
      if (used != item.size() - colon - 1) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw std::invalid_argument("goodput item '" + item + "': not a number of milliseconds");
    }
    if (!(ms >= 0)) throw std::invalid_argument("goodput item '" + item + "': negative");
    if (name == "ttft")
      s.ttft_ms = ms;
    else if (name == "tpot")
      s.tpot_ms = ms;
    else if (name == "e2el")
      s.e2el_ms = ms;
    else
      throw std::invalid_argument("goodput item '" + item + "': metric must be ttft, tpot or e2el");
  }
  return s;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const auto hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

distribution distribution::of_seconds(std::vector<double> seconds) {
  distribution d;
  d.count = seconds.size();
  if (seconds.empty()) return d;
  for (auto& s : seconds) s *= 1000.0;
  std::sort(seconds.begin(), seconds.end());
  d.mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / seconds.size();
  double var = 0;
  for (double x : seconds) var += (x - d.mean) * (x - d.mean);
  d.std = std::sqrt(var / seconds.size());  // numpy's default ddof=0
  d.median = percentile(seconds, 50);
  d.p90 = percentile(seconds, 90);
  d.p99 = percentile(seconds, 99);
  d.min = seconds.front();
  d.max = seconds.back();
  return d;
}

namespace {

size_t peak_in_flight(const std::vector<request_record>& records) {
  std::vector<std::pair<double, int>> events;
  for (const auto& r : records) {
    events.emplace_back(r.send_time, +1);
    events.emplace_back(r.end_time, -1);
  }
  // Ends sort before starts at the same instant.
  std::sort(events.begin(), events.end());
  long cur = 0, best = 0;
  for (const auto& e : events) best = std::max(best, cur += e.second);
  return static_cast<size_t>(best);
}

}  // namespace

metrics compute_metrics(const std::vector<request_record>& records, double duration_s,
                        const slo& goals) {
  metrics m;
  m.requests = records.size();
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els, later_ttfts;
  long said_prompt = 0, said_cached = 0, later_prompt = 0, later_cached = 0;
  for (const auto& r : records) {
    if (!r.success) {
      ++m.failed;
      ++m.errors[r.error_code.empty() ? "unknown" : r.error_code];
      continue;
    }
    ++m.completed;
    if (r.turn > 0) later_ttfts.push_back(r.ttft());
    if (r.cached_tokens >= 0) {
      said_prompt += r.prompt_tokens;
      said_cached += r.cached_tokens;
      if (r.turn > 0) {
        later_prompt += r.prompt_tokens;
        later_cached += r.cached_tokens;
      }
    }
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    const double ttft = r.ttft(), e2e = r.e2e(), tpot = r.tpot();
    ttfts.push_back(ttft);
    e2els.push_back(e2e);
    if (r.output_tokens > 1) tpots.push_back(tpot);
    auto gaps = r.itls();
    itls.insert(itls.end(), gaps.begin(), gaps.end());
    if (goals.any()) {
      bool good = true;
      if (goals.ttft_ms && ttft * 1000.0 > *goals.ttft_ms) good = false;
      if (goals.tpot_ms && tpot * 1000.0 > *goals.tpot_ms) good = false;
      if (goals.e2el_ms && e2e * 1000.0 > *goals.e2el_ms) good = false;
      if (good) ++m.good_completed;
    }
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.request_goodput = m.good_completed / duration_s;
    m.output_throughput = m.total_output_tokens / duration_s;
    m.total_token_throughput = (m.total_input_tokens + m.total_output_tokens) / duration_s;
  }
  m.ttft_ms = distribution::of_seconds(std::move(ttfts));
  m.tpot_ms = distribution::of_seconds(std::move(tpots));
  m.itl_ms = distribution::of_seconds(std::move(itls));
  m.e2el_ms = distribution::of_seconds(std::move(e2els));
  m.max_concurrency = peak_in_flight(records);
  if (said_prompt > 0) m.cached_share = double(said_cached) / double(said_prompt);
  if (later_prompt > 0) m.later_turns_cached_share = double(later_cached) / double(later_prompt);
  m.later_turns_ttft_ms = distribution::of_seconds(std::move(later_ttfts));
  return m;
}

namespace {

nlohmann::json dist_json(const distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"std", d.std}, {"median", d.median},
          {"p90", d.p90},     {"p99", d.p99},   {"min", d.min}, {"max", d.max}};
}

}  // namespace

nlohmann::json to_json(const metrics& m) {
  return {{"num_requests", m.requests},
          {"completed", m.completed},
          {"failed", m.failed},
          {"duration_s", m.duration_s},
          {"total_input_tokens", m.total_input_tokens},
          {"total_output_tokens", m.total_output_tokens},
          {"request_throughput", m.request_throughput},
          {"request_goodput", m.request_goodput},
          {"good_completed", m.good_completed},
          {"output_throughput", m.output_throughput},
          {"total_token_throughput", m.total_token_throughput},
          {"max_concurrency", m.max_concurrency},
          {"ttft_ms", dist_json(m.ttft_ms)},
          {"tpot_ms", dist_json(m.tpot_ms)},
          {"itl_ms", dist_json(m.itl_ms)},
          {"e2el_ms", dist_json(m.e2el_ms)},
          {"cached_share", m.cached_share},
          {"later_turns_cached_share", m.later_turns_cached_share},
          {"later_turns_ttft_ms", dist_json(m.later_turns_ttft_ms)},
          {"errors", m.errors}};
}

std::string format_summary(const metrics& m, const slo& goals) {
  std::string out;
  char line[160];
  auto row = [&](const char* name, double v, int prec) {
    std::snprintf(line, sizeof line, "%-40s %-10.*f\n", name, prec, v);
    out += line;
  };
  auto head = [&](const char* title) {
    std::string t = std::string(" ") + title + " ";
    const size_t w = 50;
    const size_t left = t.size() < w ? (w - t.size()) / 2 : 0;
    out += std::string(left, '-') + t +
           std::string(w > t.size() + left ? w - t.size() - left : 0, '-');
    out += '\n';
  };
  auto dist = [&](const char* title, const char* name, const distribution& d) {
    head(title);
    std::string n(name);
    row(("Mean " + n + " (ms):").c_str(), d.mean, 2);
    row(("Median " + n + " (ms):").c_str(), d.median, 2);
    row(("P90 " + n + " (ms):").c_str(), d.p90, 2);
    row(("P99 " + n + " (ms):").c_str(), d.p99, 2);
  };
  out += "============ Serving Benchmark Result ============\n";
  row("Successful requests:", static_cast<double>(m.completed), 0);
  row("Failed requests:", static_cast<double>(m.failed), 0);
  row("Benchmark duration (s):", m.duration_s, 2);
  row("Total input tokens:", static_cast<double>(m.total_input_tokens), 0);
  row("Total generated tokens:", static_cast<double>(m.total_output_tokens), 0);
  row("Request throughput (req/s):", m.request_throughput, 2);
  if (goals.any()) row("Request goodput (req/s):", m.request_goodput, 2);
  row("Output token throughput (tok/s):", m.output_throughput, 2);
  row("Total Token throughput (tok/s):", m.total_token_throughput, 2);
  row("Max concurrent requests:", static_cast<double>(m.max_concurrency), 0);
  dist("Time to First Token", "TTFT", m.ttft_ms);
  dist("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  dist("Inter-token Latency", "ITL", m.itl_ms);
  dist("End-to-end Latency", "E2EL", m.e2el_ms);
  if (m.cached_share >= 0 || m.later_turns_ttft_ms.count > 0) {
    head("Prefix Cache");
    if (m.cached_share >= 0) row("Prompt tokens cached (%):", 100 * m.cached_share, 1);
    if (m.later_turns_cached_share >= 0)
      row("Later turns' prompt tokens cached (%):", 100 * m.later_turns_cached_share, 1);
    if (m.later_turns_ttft_ms.count > 0) {
      row("Later turns' median TTFT (ms):", m.later_turns_ttft_ms.median, 2);
      row("Later turns' P99 TTFT (ms):", m.later_turns_ttft_ms.p99, 2);
    }
  }
  if (!m.errors.empty()) {
    head("Errors");
    for (const auto& [code, n] : m.errors) row((code + ":").c_str(), static_cast<double>(n), 0);
  }
  out += "==================================================\n";
  return out;
}

}  // namespace troupe::bench
