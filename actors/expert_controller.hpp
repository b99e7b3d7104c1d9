#pragma once
// The expert_controller actor (docs/architecture.md §2 "The actors", issue
// 15): reads expert load from the device actors of an MoE model, plans
// placements with runtime/device/expert_placement and swaps them in two phases.
#include <vector>

#include "messages/expert_controller.hpp"

namespace troupe {

expert_controller_actor spawn_expert_controller(caf::actor_system& sys,
                                                std::vector<device_actor> devices,
                                                expert_controller_config cfg);

}  // namespace troupe
