#include "sim/sim_pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe {

sim_pipeline make_sim_pipeline(const sim_pipeline_config& c) {
  if (c.stages < 1 || c.layers < c.stages)
    throw std::invalid_argument("sim: " + std::to_string(c.stages) + " pipeline stages over " +
                                std::to_string(c.layers) + " layers");
  sim_pipeline p;
  for (int32_t i = 0; i < c.stages; ++i)
    p.layers.push_back(static_cast<int32_t>(int64_t(c.layers) * (i + 1) / c.stages -
                                            int64_t(c.layers) * i / c.stages));
  p.busy_s.assign(static_cast<size_t>(c.stages), 0.0);
  return p;
}

double device_slowdown(const sim_pipeline_config& c, uint64_t device, double t) {
  if (!(c.load_skew > 1) || !(c.loaded_share > 0)) return 1;
  const auto phase = static_cast<uint64_t>(c.load_shift_s > 0 ? std::floor(t / c.load_shift_s) : 0);
  // A fixed hash of (device, phase): the loaded devices change with every
  // phase, the same in every run.
  uint64_t h = device * 0x9E3779B97F4A7C15ull ^ (phase + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<double>(h % 10000) < c.loaded_share * 10000 ? c.load_skew : 1;
}

double pipeline_step_ms(sim_pipeline& p, const sim_pipeline_config& c, uint64_t first_device,
                        double whole_ms, double t) {
  const size_t n = p.layers.size();
  const double total = c.layers + c.classifier_layers;
  double sum = 0, slowest = 0;
  for (size_t s = 0; s < n; ++s) {
    const double share = (p.layers[s] + (s + 1 == n ? c.classifier_layers : 0)) / total;
    const double ms = whole_ms * share * device_slowdown(c, first_device + s, t);
    p.busy_s[s] += ms / 1000;
    sum += ms;
    slowest = std::max(slowest, ms);
  }
  const double m = static_cast<double>(n);
  const double step = sum / m + (m - 1) * slowest / m + p.pause_ms;
  p.pause_ms = 0;
  return step;
}

std::optional<layer_move> pipeline_window(sim_pipeline& p, const sim_pipeline_config& c,
                                          double window_s) {
  std::optional<layer_move> m;
  // A threshold of 0 turns migration off, as --pipeline-rebalance 0 does live.
  if (c.migration && c.migration_opts.threshold > 0 && p.layers.size() >= 2) {
    std::vector<stage_load> loads;
    for (size_t s = 0; s < p.layers.size(); ++s) loads.push_back({p.layers[s], p.busy_s[s]});
    auto o = c.migration_opts;
    o.window_s = window_s;
    m = plan_layer_move(loads, o);
    if (m) {
      p.layers[static_cast<size_t>(m->from)] -= m->layers;
      p.layers[static_cast<size_t>(m->to)] += m->layers;
      p.pause_ms += 1000 * o.move_cost_s * m->layers;
    }
  }
  std::fill(p.busy_s.begin(), p.busy_s.end(), 0.0);
  return m;
}

}  // namespace troupe
