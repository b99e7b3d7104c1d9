#pragma once
// Step and transfer costs of one engine instance, fitted to measurements of
// the real engine (troupe bench sim-calibrate) and read by the cluster
// simulator (sim/cluster_sim).  A forward pass costs
//   t = c0 + c_prefill * prefill rows + c_decode * decode rows
//       + c_context * attention work
// in ms, where attention work is the sum over rows of the positions each
// row attends to (runtime: step_timing::context); a step of one decode row
// alone costs c_one + c_context * attention work instead, where c_one was
// fitted (> 0): the engine runs it on its own kernels (a token tile of
// one, kernels/matmul.cl), and on a service whose instances share cores a
// lone sequence is also the time the others are least busy.  The fit is
// least squares of the relative error with every coefficient kept
// non-negative (a feature whose coefficient comes out negative is dropped
// and the rest refitted), after a first, nearly unweighted pass that
// finds the results the engine read right behind the one before (under
// step overlap the device computed them while the host handled that one,
// so their times are a few hundredths of a ms, not a step's): those below
// 0.3 of the first pass's prediction are left out.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

struct step_sample {
  int32_t rows = 0;
  int32_t decode_rows = 0;
  int64_t context = 0;
  double ms = 0;
};

struct cost_model {
  std::string model;  // what it was measured on
  std::string machine;
  double c0 = 1, c_prefill = 0.1, c_decode = 0.1, c_context = 0;
  double c_one = 0;  // a step of one decode row alone (0: the linear model's)
  // KV handoff: ms = transfer_fixed_ms + bytes / (transfer_mb_per_s * 1e3).
  double transfer_fixed_ms = 1;
  double transfer_mb_per_s = 100;
  int64_t kv_bytes_per_token = 0;
  // KV store tiers (issue 39): a page loaded from the host or disk tier
  // into the arena, ms = fixed + bytes / rate, per fetch.  Not calibrated:
  // the defaults are this machine's, measured through admin instances and
  // admin kv (docs/bench_kv_store.md); a cost model file may set them
  // ("tiers").
  double tier_fixed_ms = 0.2;
  double host_load_mb_per_s = 560;
  double disk_load_mb_per_s = 160;
  int32_t kv_pages = 0;  // the instance's arena, pages
  int32_t page_size = 16;
  // Fit quality on the samples: mean absolute percentage error, R^2, count.
  double fit_mape = 0, fit_r2 = 0;
  size_t samples = 0;
  size_t dropped = 0;  // results read right behind the one before, left out

  double step_ms(int32_t rows, int32_t decode_rows, int64_t context) const;
  double transfer_ms(int64_t bytes) const;
  int64_t kv_bytes_per_page() const { return kv_bytes_per_token * page_size; }
  // Loading host_pages and disk_pages pages of a prompt from a KV store.
  double tier_load_ms(int32_t host_pages, int32_t disk_pages) const;

  static cost_model fit(const std::vector<step_sample>& samples);
  // Takes the step coefficients and fit figures of `fitted`, keeping the rest.
  void take_step_costs(const cost_model& fitted);
  nlohmann::json to_json() const;
  // Throws std::runtime_error naming the missing or bad field.
  static cost_model from_json(const nlohmann::json& j);
  static cost_model load(const std::string& path);
};

}  // namespace troupe
