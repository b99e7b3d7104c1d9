#pragma once
// What `troupe serve` runs beside the gateway for operators: the admin
// metrics poll and the Prometheus endpoint on service.metrics_port.  (The
// admin actor is reached through the admin endpoint on service.admin_port,
// actors/admin_endpoint: JSON over ZeroMQ, never the CAF middleman.)
#include <memory>
#include <string>

#include "actors/admin.hpp"
#include "runtime/service/cluster_state.hpp"
#include "runtime/service/metrics.hpp"

namespace troupe::cli {

// Asks the service's actors for the gauges (instances, requests, monitor,
// dp group, experts) and records them in `registry`; blocking, up to a few
// seconds, so never on an event loop.
void poll_metrics(caf::actor_system& sys, const admin_actor& admin, metrics_registry& registry);

// `base` (id, endpoints, model) with the service's load as of now, for
// its registry record (runtime/service/cluster_state); blocking, a few
// seconds at most.  A failed ask leaves the load fields 0.
service_record current_service_record(caf::actor_system& sys, const admin_actor& admin,
                                      service_record base);

// GET /metrics on 127.0.0.1:port, served by its own thread; each scrape
// polls the admin actor (instances, requests in flight) into the registry
// before rendering it.  Throws std::runtime_error when the port is taken.
class metrics_server {
 public:
  metrics_server(caf::actor_system& sys, admin_actor admin,
                 std::shared_ptr<metrics_registry> registry, const std::string& host, int port);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::cli
