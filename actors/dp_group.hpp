#pragma once
// The dp_group actor (docs/architecture.md §2 "The actors",
// §4.8 "Lockstep rounds"; issue 15 item 4): a data-parallel group of
// replicas.  It admits requests by runtime/service/dp_balance (most free KV), checks
// the group's KV balance every interval and moves sequences from the most to
// the least loaded replica through their request actors (export, import,
// re-point: the migration protocol), and in lockstep runs the replicas' steps
// in rounds.
#include <vector>

#include "messages/dp_group.hpp"

namespace troupe {

// `page_size`: the replicas' KV page size (their capacity in tokens).
dp_group_actor spawn_dp_group(caf::actor_system& sys, std::vector<router_instance> replicas,
                              dp_group_config cfg, int32_t page_size);

}  // namespace troupe
