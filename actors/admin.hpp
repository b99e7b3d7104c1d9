#pragma once
// The admin actor (docs/architecture.md §2 "The actors"): the inspection
// interface of a service.  It owns nothing and asks the gateway, the router
// and the others.  It is not published on the network: tools outside the
// process reach it through the admin endpoint (actors/admin_endpoint: JSON
// over ZeroMQ on service.admin_port), and the metrics endpoints poll it.
// Beside it, the glue that turns what those actors report into metrics.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "messages/admin.hpp"
#include "runtime/service/metrics.hpp"

namespace troupe {

// The service's optional actors the admin reports on (null: none).
struct admin_groups {
  dp_group_actor dp;
  expert_controller_actor experts;
};

// `nodes`: the service's nodes (spawn on a node, node add and remove; null:
// none can be added).
admin_actor spawn_admin(caf::actor_system& sys, gateway_actor gateway, router_actor router,
                        node_set_actor nodes = {}, monitor_actor monitor = {},
                        admin_groups groups = {});

// Lists the request metrics' families before the first request finishes.
void declare_request_metrics(metrics_registry& m);

// A finished request into the request metrics (counts by finish, tokens,
// TTFT / TPOT / queue-time / duration histograms).
void record_request(metrics_registry& m, const request_trace& t);

// The instances' stats and the requests in flight into the gauges (queue
// length, KV pages, prefix hit rate) and the engine counters.  Returns
// the instances' names (what record_monitor keeps).
std::set<std::string> record_service(metrics_registry& m,
                                     const std::vector<instance_info>& instances, size_t in_flight);

// The monitor's window into gauges: the TTFT predictor's error, per
// instance token interval and busy share.
// `live`: the instances now (their names); others are left out.
void record_monitor(metrics_registry& m, const monitor_report& r,
                    const std::set<std::string>* live = nullptr);

// Bytes as lowercase hex (client identities).
std::string hex_bytes(const std::string& bytes);

}  // namespace troupe
