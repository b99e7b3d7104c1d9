#pragma once
// Expert placement policy (xLLM's dynamic EPLB, REFERENCES.md 6.6): plain
// functions of per-expert token counts and a placement, called by the
// expert_controller actor and testable alone.  A placement (an
// expert_layout: for each expert device, the experts it holds) gives a
// replicated expert's tokens to its replicas in equal shares, as the router
// kernel does (token t to replica t mod n).
#include <cstdint>
#include <vector>

#include "runtime/device/device_weights.hpp"

namespace troupe {

struct expert_balance {
  std::vector<double> device_load;  // tokens each expert device computes
  double max_over_mean = 1.0;       // 1 when balanced (or idle)
};

// Each device's share of `expert_tokens` (tokens per expert) under `layout`.
expert_balance balance_of(const expert_layout& layout, const std::vector<int64_t>& expert_tokens);

// A placement for `expert_tokens` over `devices` devices of `slots` slots
// each (slots * devices >= experts): every expert once, the spare slots
// given to the hottest experts as replicas (the one with most tokens per
// replica first), then replicas placed heaviest first on the least loaded
// device with a free slot that does not hold the expert yet (then the one
// holding fewest, so no device is left empty).  Deterministic
// (ties go to the lower expert id and device).
expert_layout plan_expert_layout(const std::vector<int64_t>& expert_tokens, int devices, int slots);

// Whether to move from `current` to `planned`: the current imbalance is
// above `threshold` (max over mean device load) and the plan lowers it by
// at least `min_gain` (relative), with at least `min_tokens` counted.
bool worth_rebalancing(const expert_layout& current, const expert_layout& planned,
                       const std::vector<int64_t>& expert_tokens, double threshold,
                       double min_gain = 0.05, int64_t min_tokens = 64);

}  // namespace troupe
