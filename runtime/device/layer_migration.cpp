#include "runtime/device/layer_migration.hpp"

#include <algorithm>
#include <numeric>

namespace troupe {

std::optional<layer_move> plan_layer_move(const std::vector<stage_load>& stages,
                                          const layer_migration_options& o) {
  const size_t n = stages.size();
  if (n < 2) return std::nullopt;
  double total = 0, slowest = 0;
  size_t donor = 0;
  for (size_t i = 0; i < n; ++i) {
    if (stages[i].layers <= 0 || !(stages[i].busy_s >= 0)) return std::nullopt;
    total += stages[i].busy_s;
    if (stages[i].busy_s > slowest) {
      slowest = stages[i].busy_s;
      donor = i;
    }
  }
  const double mean = total / static_cast<double>(n);
  if (!(mean > 0) || slowest <= mean * (1 + o.threshold)) return std::nullopt;
  if (stages[donor].layers <= 1) return std::nullopt;
  // The slowest of the stages a move leaves alone bounds what it can gain.
  std::optional<layer_move> best;
  for (int side : {-1, 1}) {
    const int64_t r = static_cast<int64_t>(donor) + side;
    if (r < 0 || r >= static_cast<int64_t>(n)) continue;
    const auto& d = stages[donor];
    const auto& rc = stages[static_cast<size_t>(r)];
    double others = 0;
    for (size_t i = 0; i < n; ++i)
      if (i != donor && i != static_cast<size_t>(r)) others = std::max(others, stages[i].busy_s);
    const double c = std::min(d.busy_s / d.layers, rc.busy_s / rc.layers);
    if (!(c > 0)) continue;
    for (int32_t k = 1; k < d.layers; ++k) {
      const double after = std::max({others, d.busy_s - k * c, rc.busy_s + k * c});
      const double gain = (slowest - after) / slowest;
      if (!best || gain > best->gain + 1e-12)
        best = layer_move{static_cast<int32_t>(donor), static_cast<int32_t>(r), k, gain};
    }
  }
  if (!best || best->gain < o.min_gain) return std::nullopt;
  // It pays where the time it saves over the horizon (the slowest stage
  // sets the pace: gain x horizon) exceeds the pause it costs.
  if (best->gain * o.horizon_s < o.move_cost_s * best->layers) return std::nullopt;
  return best;
}

}  // namespace troupe
