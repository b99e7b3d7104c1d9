#pragma once
// The data-parallel group and the expert controller as the admin shows
// them: JSON for the admin endpoint (commands dp and experts) and metrics.
#include <nlohmann/json.hpp>

#include "messages/dp_group.hpp"
#include "messages/expert_controller.hpp"
#include "runtime/service/metrics.hpp"

namespace troupe {

nlohmann::json to_json(const dp_group_status& s);
nlohmann::json to_json(const expert_status& s);

// The dp group's balance, moves and rounds into gauges and counters.
void record_dp_group(metrics_registry& m, const dp_group_status& s);

// The expert controller's imbalance per layer, swaps, and busy time per
// expert device.
void record_experts(metrics_registry& m, const expert_status& s);

}  // namespace troupe
