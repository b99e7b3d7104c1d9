#include "sim/sim_pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/device/stage_rebalance.hpp"

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
                        double whole_ms, double t, int64_t rows, double context) {
  const size_t n = p.layers.size();
  const double total = c.layers + c.classifier_layers;
  std::vector<double> ms(n);
  std::vector<double> slow(n);
  for (size_t s = 0; s < n; ++s) {
    slow[s] = device_slowdown(c, first_device + s, t);
    ms[s] = whole_ms * (p.layers[s] + (s + 1 == n ? c.classifier_layers : 0)) / total * slow[s];
  }
  const double mean_context = rows > 0 ? context / static_cast<double>(rows) : 0;
  if (p.heads_away > 0) {
    const auto d = static_cast<size_t>(p.heads_donor), h = static_cast<size_t>(p.heads_helper);
    const double share =
        attention_share(c.n_embd, c.n_head, c.n_kv, c.head_dim, c.n_ff, mean_context);
    // The group's attention, as the donor would run it.
    const double moved = whole_ms * p.layers[d] / total * slow[d] * share * p.heads_away / c.n_kv;
    ms[d] += -moved + c.trip_ms * p.layers[d] * static_cast<double>(n);
    ms[h] += moved * slow[h] / slow[d];
  }
  double sum = 0, slowest = 0;
  for (size_t s = 0; s < n; ++s) {
    p.busy_s[s] += ms[s] / 1000;
    sum += ms[s];
    slowest = std::max(slowest, ms[s]);
  }
  p.passes += static_cast<int64_t>(n);
  p.rows += rows;
  p.context += context;
  const double m = static_cast<double>(n);
  // The rest of a move's pause, if this step starts within it.
  const double wait_ms = std::max(0.0, p.pause_until_s - t) * 1000;
  p.pause_until_s = 0;
  const double step = sum / m + (m - 1) * slowest / m + wait_ms;
  return step;
}

sim_rebalance pipeline_window(sim_pipeline& p, const sim_pipeline_config& c, double window_s,
                              double now) {
  sim_rebalance r;
  if ((c.migration || c.head_migration) && p.layers.size() >= 2) {
    stage_rebalance_inputs in;
    for (size_t s = 0; s < p.layers.size(); ++s)
      in.load.stages.push_back({p.layers[s], p.busy_s[s]});
    if (p.heads_away > 0) in.away = head_group_away{p.heads_donor, p.heads_helper, p.heads_away};
    in.windows_since_move = p.windows_since_move;
    in.layers = c.migration;
    in.heads = c.head_migration;
    in.load.n_kv = c.n_kv;
    in.load.attention_share =
        attention_share(c.n_embd, c.n_head, c.n_kv, c.head_dim, c.n_ff,
                        p.rows > 0 ? p.context / static_cast<double>(p.rows) : 0);
    in.load.trip_s = c.trip_ms / 1000;
    in.load.steps = p.passes;
    auto o = c.migration_opts;
    o.window_s = window_s;
    const auto m = plan_stage_rebalance(in, o);
    if (m.heads_home) {
      // Coming home copies nothing (the donor's cache kept every head).
      r.heads_home = true;
      p.heads_donor = p.heads_helper = -1;
      p.heads_away = 0;
    } else if (m.layers) {
      p.layers[static_cast<size_t>(m.layers->from)] -= m.layers->layers;
      p.layers[static_cast<size_t>(m.layers->to)] += m.layers->layers;
      r.layers_moved = m.layers->layers;
      r.pause_ms = 1000 * o.move_cost_s * m.layers->layers;
    } else if (m.heads) {
      p.heads_donor = m.heads->from;
      p.heads_helper = m.heads->to;
      p.heads_away = m.heads->heads;
      r.heads_moved = m.heads->heads;
      // As plan_head_move prices it.
      r.pause_ms = 1000 * head_move_pause_s(o, p.layers[static_cast<size_t>(m.heads->from)],
                                            m.heads->heads, c.n_kv);
    }
    if (r.pause_ms > 0) p.pause_until_s = std::max(p.pause_until_s, now) + r.pause_ms / 1000;
    p.windows_since_move = m.any() ? 0 : std::min(p.windows_since_move + 1, 1 << 30);
  }
  std::fill(p.busy_s.begin(), p.busy_s.end(), 0.0);
  p.passes = p.rows = 0;
  p.context = 0;
  return r;
}

}  // namespace troupe
