#pragma once
// The router actor (docs/architecture.md §2 "The actors", §3 "The flows";
// issue 10): one per service.  It keeps the registry of instances, refreshes
// their load snapshots (instance stats) every `poll`, places each request
// with runtime/service/placement, marks an instance down when it dies (it monitors
// them) and drains on request.
#include <chrono>
#include <optional>
#include <set>
#include <vector>

#include "messages/dp_group.hpp"
#include "messages/expert_controller.hpp"
#include "messages/monitor.hpp"
#include "messages/router.hpp"
#include "runtime/service/epd_policy.hpp"
#include "runtime/service/pd_policy.hpp"
#include "runtime/service/placement.hpp"

namespace troupe {

struct router_options {
  placement_policy policy = placement_policy::least_load;
  double ttft_target_ms = 1000;  // for the slo policy
  std::chrono::milliseconds poll{100};
  // drain: ask the sequences to move elsewhere (true) or let them finish
  // where they are (false).
  bool drain_migrates = true;
  // Disaggregation (issue 11): prefill placement by predicted TTFT in the
  // report's pool order, decode placement after the prefill, and (with
  // role_switching) the report's flips once per window.
  bool pd = false;
  bool role_switching = false;
  double tpot_target_ms = 0;
  pd_config pd_cfg;
  std::chrono::milliseconds window{1000};
  monitor_actor monitor;             // may be null: no windows, no flips
  std::vector<instance_role> roles;  // by instance id - 1; absent: the default of --pd
  int32_t page_size = 16;            // the instances' KV page size (decode placement's KV cap)
  // A data-parallel group over the instances (issue 15): it places every
  // request instead of `policy` (not with pd).  May be null.
  dp_group_actor dp_group;
  // The expert controller of a mixture-of-experts model: nodes' engines
  // join it as their instances join the router.  May be null.
  expert_controller_actor experts;
  // Queued requests of full instances move to instances with room
  // (runtime/service/rebalance), at most once per `rebalance_every`; the
  // instances' max_seqs (0: never).  Not with pd or a dp group.
  int32_t max_seqs = 0;
  std::chrono::milliseconds rebalance_every{1000};
  // The instances' step limits (max_batch_tokens, chunk_size): the TTFT
  // predictor's (runtime/service/ttft_predictor).
  int32_t max_batch_tokens = 256;
  int32_t chunk_size = 128;
  // Hybrid EPD (troupe serve --epd): where a request's images are encoded
  // (runtime/service/epd_policy place_encode), among the instances with a
  // vision encoder of their own (`encoders`, by id).
  std::optional<epd_strategy> epd;
  std::set<uint64_t> encoders;
};

router_actor spawn_router(caf::actor_system& sys, std::vector<router_instance> instances,
                          router_options opts);

}  // namespace troupe
