#include "runtime/device/expert_placement.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace troupe {

namespace {

std::vector<int> replica_counts(const expert_layout& layout, size_t n_expert) {
  std::vector<int> n(n_expert, 0);
  for (const auto& held : layout)
    for (int e : held)
      if (e >= 0 && static_cast<size_t>(e) < n_expert) ++n[e];
  return n;
}

}  // namespace

expert_balance balance_of(const expert_layout& layout, const std::vector<int64_t>& expert_tokens) {
  expert_balance b;
  const auto reps = replica_counts(layout, expert_tokens.size());
  for (const auto& held : layout) {
    double load = 0;
    for (int e : held)
      if (e >= 0 && static_cast<size_t>(e) < expert_tokens.size() && reps[e] > 0)
        load += static_cast<double>(expert_tokens[e]) / reps[e];
    b.device_load.push_back(load);
  }
  const double total = std::accumulate(b.device_load.begin(), b.device_load.end(), 0.0);
  if (total > 0 && !b.device_load.empty()) {
    const double mean = total / static_cast<double>(b.device_load.size());
    b.max_over_mean = *std::max_element(b.device_load.begin(), b.device_load.end()) / mean;
  }
  return b;
}

expert_layout plan_expert_layout(const std::vector<int64_t>& expert_tokens, int devices,
                                 int slots) {
  const int E = static_cast<int>(expert_tokens.size());
  if (devices <= 0 || slots <= 0 || static_cast<int64_t>(devices) * slots < E)
    throw std::invalid_argument("plan_expert_layout: " + std::to_string(devices) + " devices of " +
                                std::to_string(slots) + " slots cannot hold " + std::to_string(E) +
                                " experts");
  // Replica counts: spare slots to the expert with the most tokens per
  // replica, never more replicas than devices.
  std::vector<int> reps(static_cast<size_t>(E), 1);
  for (int spare = devices * slots - E; spare > 0; --spare) {
    int best = -1;
    double best_share = -1;
    for (int e = 0; e < E; ++e) {
      if (reps[e] >= devices) continue;
      const double share = static_cast<double>(expert_tokens[e]) / reps[e];
      if (share > best_share) best = e, best_share = share;
    }
    if (best < 0 || best_share <= 0) break;  // nothing hot left: leave the slots empty
    ++reps[best];
  }
  struct replica {
    int expert;
    double load;
  };
  std::vector<replica> all;
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < reps[e]; ++r)
      all.push_back({e, static_cast<double>(expert_tokens[e]) / reps[e]});
  std::stable_sort(all.begin(), all.end(),
                   [](const replica& a, const replica& b) { return a.load > b.load; });
  expert_layout out(static_cast<size_t>(devices));
  std::vector<double> load(static_cast<size_t>(devices), 0.0);
  for (const auto& r : all) {
    int pick = -1;
    for (int d = 0; d < devices; ++d) {
      const auto& held = out[d];
      if (static_cast<int>(held.size()) >= slots) continue;
      if (std::find(held.begin(), held.end(), r.expert) != held.end()) continue;
      // Least loaded, then fewest held (so that no device is left empty).
      if (pick < 0 || load[d] < load[pick] ||
          (load[d] == load[pick] && held.size() < out[pick].size()))
        pick = d;
    }
    if (pick < 0) throw std::logic_error("plan_expert_layout: no slot left for a replica");
    out[pick].push_back(r.expert);
    load[pick] += r.load;
  }
  for (auto& held : out) std::sort(held.begin(), held.end());
  return out;
}

bool worth_rebalancing(const expert_layout& current, const expert_layout& planned,
                       const std::vector<int64_t>& expert_tokens, double threshold, double min_gain,
                       int64_t min_tokens) {
  const int64_t total = std::accumulate(expert_tokens.begin(), expert_tokens.end(), int64_t{0});
  if (total < min_tokens || current == planned) return false;
  const double now = balance_of(current, expert_tokens).max_over_mean;
  const double then = balance_of(planned, expert_tokens).max_over_mean;
  return now > threshold && then < now * (1.0 - min_gain);
}

}  // namespace troupe
