#include "sim/cost_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <stdexcept>

namespace troupe {

double cost_model::step_ms(int32_t rows, int32_t decode_rows, int64_t context) const {
  if (c_one > 0 && rows == 1 && decode_rows == 1) return c_one + c_context * double(context);
  return c0 + c_prefill * (rows - decode_rows) + c_decode * decode_rows +
         c_context * double(context);
}

double cost_model::tier_load_ms(int32_t host_pages, int32_t disk_pages) const {
  if (host_pages + disk_pages <= 0) return 0;
  const double page = double(kv_bytes_per_page());
  return tier_fixed_ms + page * host_pages / (host_load_mb_per_s * 1e3) +
         page * disk_pages / (disk_load_mb_per_s * 1e3);
}

double cost_model::transfer_ms(int64_t bytes) const {
  return transfer_fixed_ms + double(bytes) / (transfer_mb_per_s * 1e3);
}

namespace {

constexpr int kFeatures = 5;  // c0, c_prefill, c_decode, c_context, c_one

bool lone_decode_row(const step_sample& s) {
  return s.rows == 1 && s.decode_rows == 1;
}

// apart: a lone decode row is priced by c_one, not by the linear model.
std::array<double, kFeatures> features(const step_sample& s, bool apart) {
  const bool one = apart && lone_decode_row(s);
  return {one ? 0.0 : 1.0, double(s.rows - s.decode_rows), one ? 0.0 : double(s.decode_rows),
          double(s.context), one ? 1.0 : 0.0};
}

struct fitted {
  std::array<double, kFeatures> x{};
  bool apart = false;  // c_one kept
};

double predict(const fitted& f, const step_sample& s) {
  const auto v = features(s, f.apart);
  double p = 0;
  for (int i = 0; i < kFeatures; ++i) p += f.x[i] * v[i];
  return p;
}

// Weighted least squares over the features in `use` (normal equations, Gaussian
// elimination with partial pivoting); unused coefficients are 0.  Weighted
// by 1 / max(ms, floor)^2: relative errors count, so the many short decode
// steps are fitted as well as the few long prefills; the floor bounds the
// weight of a very short sample.
std::array<double, kFeatures> solve(const std::vector<step_sample>& xs,
                                    const std::array<bool, kFeatures>& use, double floor_ms) {
  double a[kFeatures][kFeatures + 1] = {};
  for (const auto& s : xs) {
    const double m = std::max(floor_ms, s.ms);
    const double w = 1.0 / (m * m);
    auto f = features(s, use[4]);
    for (int i = 0; i < kFeatures; ++i) {
      for (int j = 0; j < kFeatures; ++j) a[i][j] += w * f[i] * f[j];
      a[i][kFeatures] += w * f[i] * s.ms;
    }
  }
  // Unused features: the identity row, right side 0.
  for (int i = 0; i < kFeatures; ++i)
    if (!use[i]) {
      for (int j = 0; j <= kFeatures; ++j) a[i][j] = 0;
      for (int j = 0; j < kFeatures; ++j) a[j][i] = 0;
      a[i][i] = 1;
    }
  // Scale each column so the elimination is well conditioned.
  double scale[kFeatures];
  for (int j = 0; j < kFeatures; ++j) {
    scale[j] = std::sqrt(std::abs(a[j][j])) > 0 ? std::sqrt(std::abs(a[j][j])) : 1;
  }
  for (int i = 0; i < kFeatures; ++i) {
    for (int j = 0; j < kFeatures; ++j) a[i][j] /= scale[i] * scale[j];
    a[i][kFeatures] /= scale[i];
  }
  for (int c = 0; c < kFeatures; ++c) {
    int p = c;
    for (int r = c + 1; r < kFeatures; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    for (int j = 0; j <= kFeatures; ++j) std::swap(a[c][j], a[p][j]);
    if (std::abs(a[c][c]) < 1e-12) continue;
    for (int r = 0; r < kFeatures; ++r) {
      if (r == c) continue;
      const double k = a[r][c] / a[c][c];
      for (int j = c; j <= kFeatures; ++j) a[r][j] -= k * a[c][j];
    }
  }
  std::array<double, kFeatures> x{};
  for (int i = 0; i < kFeatures; ++i)
    x[i] = std::abs(a[i][i]) < 1e-12 ? 0 : a[i][kFeatures] / a[i][i] / scale[i];
  return x;
}

// Non-negative least squares by dropping: the most negative coefficient's
// feature goes and the rest are refitted, until none is negative.
fitted fit_non_negative(const std::vector<step_sample>& xs, double floor_ms) {
  // A lone decode row is priced apart only where there are lone rows and
  // decode steps of more rows as well (these teach c_decode); else the
  // linear model prices it.
  const bool ones = std::any_of(xs.begin(), xs.end(), lone_decode_row);
  const bool batches = std::any_of(xs.begin(), xs.end(), [](const step_sample& s) {
    return s.decode_rows > 0 && !lone_decode_row(s);
  });
  std::array<bool, kFeatures> use{true, true, true, true, ones && batches};
  fitted f;
  // kFeatures + 1 rounds: a refit after the last feature dropped.
  for (int round = 0; round <= kFeatures; ++round) {
    f.x = solve(xs, use, floor_ms);
    int worst = -1;
    for (int i = 0; i < kFeatures; ++i)
      if (use[i] && f.x[i] < 0 && (worst < 0 || f.x[i] < f.x[worst])) worst = i;
    if (worst < 0) break;
    use[worst] = false;
  }
  for (auto& v : f.x) v = std::max(0.0, v);
  f.apart = use[4];
  return f;
}

}  // namespace

cost_model cost_model::fit(const std::vector<step_sample>& all) {
  if (all.size() < kFeatures) throw std::invalid_argument("cost model: too few step samples");
  // First pass, nearly unweighted (every sample floored at the median), so
  // that a result read right behind another (a few hundredths of a ms)
  // cannot pull the fit to itself; those far below it are left out.
  std::vector<double> times;
  for (const auto& s : all) times.push_back(s.ms);
  std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
  const auto rough = fit_non_negative(all, std::max(0.1, times[times.size() / 2]));
  std::vector<step_sample> xs;
  for (const auto& s : all)
    if (s.ms >= 0.3 * predict(rough, s)) xs.push_back(s);
  if (xs.size() < kFeatures) xs = all;
  const auto f = fit_non_negative(xs, 0.1);
  const auto& x = f.x;
  cost_model m;
  m.c0 = x[0];
  m.c_prefill = x[1];
  m.c_decode = x[2];
  m.c_context = x[3];
  m.c_one = f.apart ? x[4] : 0.0;
  m.dropped = all.size() - xs.size();
  double mean = 0;
  for (const auto& s : xs) mean += s.ms;
  mean /= double(xs.size());
  double ss_res = 0, ss_tot = 0, ape = 0;
  for (const auto& s : xs) {
    const double p = m.step_ms(s.rows, s.decode_rows, s.context);
    ss_res += (p - s.ms) * (p - s.ms);
    ss_tot += (s.ms - mean) * (s.ms - mean);
    ape += s.ms > 0 ? std::abs(p - s.ms) / s.ms : 0;
  }
  m.fit_r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
  m.fit_mape = ape / double(xs.size());
  m.samples = xs.size();
  return m;
}

void cost_model::take_step_costs(const cost_model& fitted) {
  c0 = fitted.c0;
  c_prefill = fitted.c_prefill;
  c_decode = fitted.c_decode;
  c_context = fitted.c_context;
  c_one = fitted.c_one;
  dropped = fitted.dropped;
  fit_mape = fitted.fit_mape;
  fit_r2 = fitted.fit_r2;
  samples = fitted.samples;
}

nlohmann::json cost_model::to_json() const {
  return {
      {"model", model},
      {"machine", machine},
      {"step_ms",
       {{"c0", c0},
        {"c_prefill", c_prefill},
        {"c_decode", c_decode},
        {"c_context", c_context},
        {"c_one", c_one}}},
      {"transfer", {{"fixed_ms", transfer_fixed_ms}, {"mb_per_s", transfer_mb_per_s}}},
      {"tiers",
       {{"fixed_ms", tier_fixed_ms},
        {"host_mb_per_s", host_load_mb_per_s},
        {"disk_mb_per_s", disk_load_mb_per_s}}},
      {"kv_bytes_per_token", kv_bytes_per_token},
      {"kv_pages", kv_pages},
      {"page_size", page_size},
      {"fit", {{"mape", fit_mape}, {"r2", fit_r2}, {"samples", samples}, {"dropped", dropped}}}};
}

cost_model cost_model::from_json(const nlohmann::json& j) {
  cost_model m;
  auto num = [&](const nlohmann::json& o, const char* key) {
    if (!o.contains(key) || !o[key].is_number())
      throw std::runtime_error(std::string("cost model: no number \"") + key + "\"");
    return o[key].get<double>();
  };
  if (!j.contains("step_ms") || !j.contains("transfer"))
    throw std::runtime_error("cost model: needs \"step_ms\" and \"transfer\"");
  m.model = j.value("model", "");
  m.machine = j.value("machine", "");
  m.c0 = num(j["step_ms"], "c0");
  m.c_prefill = num(j["step_ms"], "c_prefill");
  m.c_decode = num(j["step_ms"], "c_decode");
  m.c_context = num(j["step_ms"], "c_context");
  // Older files have no c_one: the linear model prices a lone row.
  m.c_one = j["step_ms"].contains("c_one") ? num(j["step_ms"], "c_one") : 0.0;
  m.transfer_fixed_ms = num(j["transfer"], "fixed_ms");
  m.transfer_mb_per_s = num(j["transfer"], "mb_per_s");
  m.kv_bytes_per_token = int64_t(num(j, "kv_bytes_per_token"));
  m.kv_pages = int32_t(num(j, "kv_pages"));
  m.page_size = int32_t(num(j, "page_size"));
  if (j.contains("tiers") && j["tiers"].is_object()) {
    m.tier_fixed_ms = j["tiers"].value("fixed_ms", m.tier_fixed_ms);
    m.host_load_mb_per_s = j["tiers"].value("host_mb_per_s", m.host_load_mb_per_s);
    m.disk_load_mb_per_s = j["tiers"].value("disk_mb_per_s", m.disk_load_mb_per_s);
  }
  if (j.contains("fit")) {
    m.fit_mape = j["fit"].value("mape", 0.0);
    m.fit_r2 = j["fit"].value("r2", 0.0);
    m.samples = j["fit"].value("samples", size_t{0});
    m.dropped = j["fit"].value("dropped", size_t{0});
  }
  if (!(m.c_one >= 0)) throw std::runtime_error("cost model: c_one must be >= 0");
  if (m.transfer_mb_per_s <= 0 || m.kv_pages <= 0 || m.page_size <= 0 ||
      !(m.host_load_mb_per_s > 0) || !(m.disk_load_mb_per_s > 0) || !(m.tier_fixed_ms >= 0))
    throw std::runtime_error(
        "cost model: transfer and tier mb_per_s, kv_pages and page_size must be > 0");
  return m;
}

cost_model cost_model::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cost model: cannot read " + path);
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) throw std::runtime_error("cost model: " + path + " is not JSON");
  return from_json(j);
}

}  // namespace troupe
