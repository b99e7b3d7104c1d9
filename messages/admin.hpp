#pragma once
// The admin protocol (docs/architecture.md §2 "The actors"): inspection and
// control of a running service.  The admin actor owns nothing; it asks the
// gateway, the router and the others.  It is not published on the network:
// `troupe client admin ...` and `troupe shell` reach it through the admin
// endpoint (actors/admin_endpoint: JSON over ZeroMQ on service.admin_port).
#include <caf/all.hpp>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/dp_group.hpp"
#include "messages/expert_controller.hpp"
#include "messages/gateway.hpp"
#include "messages/monitor.hpp"
#include "messages/router.hpp"

namespace troupe {

// An instance's name where the service shows it (admin, /metrics).
inline std::string instance_name(uint64_t id) {
  return "instance-" + std::to_string(id);
}

// One engine replica and its counters.
struct instance_info {
  std::string name;
  uint64_t id = 0;
  std::string node;
  std::string role;
  std::string state;  // serving, draining, down
  instance_stats stats;
  std::string pool;  // the router's pool: M, P, D, P->D, D->P
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, instance_info& x) {
  return f(caf::meta::type_name("instance_info"), x.name, x.id, x.node, x.role, x.state, x.stats,
           x.pool);
}

// Atoms: messages/atoms.hpp; inflight_request: messages/gateway.hpp.

// instances: every instance with its stats.
// requests:  the requests in flight.
// trace:     one request's trace by the client's request id (the newest
//            finished one with that id; finish "in_flight" while it runs);
//            an error when the id is unknown.
// kv:        the KV pages of all instances together.
// cancel:    cancels the in-flight requests with this request id (of any
//            client); replies with how many there were.
// migrate:   (request id, instance id) moves that in-flight request there;
//            replies with the instance once the request runs there.
// draininst: (instance id) no new placements on it; replies once it holds
//            no sequence.
// killinst:  (instance id) fault injection: kill the instance (its requests
//            recover elsewhere).
// movelayers: (instance id, from, to, layers) the instance's pipelined
//            device moves layers between two neighbouring stages; replies
//            with what moved and the pause it cost.
// moveheads: (instance id, from, to, heads) the attention of a group of
//            KV heads of stage `from` moves to stage `to` (0: home again).
// peek:      the monitor's window (per-instance TTFT, TPOT, token interval,
//            busy share; the TTFT predictor's error).
// setrole:   (instance id, prefill|decode|mixed) the instance's new role
//            (messages/router.hpp); replies with what changed.
// nodes:     the cluster's nodes as the service's links know them.
// dpstatus:  the data-parallel group's balance, moves and lockstep rounds;
//            an error when the service has no group.
// expstatus: the expert controller's loads, placement and swaps; an error
//            when the service has none.
using admin_actor = caf::typed_actor<
    caf::replies_to<instances_atom>::with<std::vector<instance_info>>,
    caf::replies_to<requests_atom>::with<std::vector<inflight_request>>,
    caf::replies_to<trace_atom, uint64_t>::with<request_trace>,
    caf::replies_to<kv_atom>::with<pool_stats>,
    caf::replies_to<cancel_atom, uint64_t>::with<int32_t>,
    caf::replies_to<migrate_atom, uint64_t, uint64_t>::with<uint64_t>,
    caf::replies_to<drain_instance_atom, uint64_t>::with<uint64_t>,
    caf::replies_to<kill_instance_atom, uint64_t>::with<uint64_t>,
    caf::replies_to<move_layers_atom, uint64_t, int32_t, int32_t, int32_t>::with<std::string>,
    caf::replies_to<move_heads_atom, uint64_t, int32_t, int32_t, int32_t>::with<std::string>,
    caf::replies_to<nodes_atom>::with<std::vector<link_status>>,
    caf::replies_to<preempt_atom, uint64_t>::with<int32_t>,
    caf::replies_to<set_atom, std::string, std::string>::with<std::string>,
    caf::replies_to<set_role_atom, uint64_t, std::string>::with<std::string>,
    caf::replies_to<peek_atom>::with<monitor_report>,
    caf::replies_to<grow_atom, std::string, int32_t>::with<std::vector<uint64_t>>,
    caf::replies_to<node_add_atom, std::string, int32_t>::with<link_status>,
    caf::replies_to<node_remove_atom, std::string>::with<std::string>,
    caf::replies_to<dp_status_atom>::with<dp_group_status>,
    caf::replies_to<expert_status_atom>::with<expert_status>>;

}  // namespace troupe
