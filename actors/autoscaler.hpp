#pragma once
// The autoscaler (issue 37 item 5): once a window it reads the instances'
// load (the router's registry, each instance's stats, the monitor's TTFT
// window), asks the policy (runtime/service/autoscale: decide_autoscale,
// the function `troupe bench sim --autoscale` runs too), and acts through
// the node set: `grow` on the node with the most room (one instance per
// core of a node at most), `shrink` to retire a node's last instance
// (drained first, so its requests move; a node keeps its first).  One
// action at a time; local instances count but are never retired.
#include <chrono>

#include "messages/monitor.hpp"
#include "messages/node.hpp"
#include "messages/router.hpp"
#include "runtime/service/autoscale.hpp"

namespace troupe {

struct autoscaler_options {
  autoscale_config policy;
  double ttft_target_ms = 0;
  int32_t max_seqs = 1;  // an instance's capacity (engine.max_seqs)
  std::chrono::milliseconds window{1000};
  router_actor router;
  node_set_actor nodes;
  monitor_actor monitor;  // may be null: no TTFT signal
};

using autoscaler_actor = caf::typed_actor<caf::reacts_to<tick_atom>>;

autoscaler_actor spawn_autoscaler(caf::actor_system& sys, autoscaler_options opts);

}  // namespace troupe
