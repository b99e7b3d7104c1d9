#include "tools/troupe/serve_admin.hpp"

#include <set>
#include <stdexcept>

#include "actors/admin_groups.hpp"
#include "net/http_get_server.hpp"

namespace troupe::cli {

// The gauges as of now; a failed ask leaves the last values standing.
void poll_metrics(caf::actor_system& sys, const admin_actor& admin, metrics_registry& registry) {
  caf::scoped_actor self{sys};
  std::vector<instance_info> insts;
  size_t in_flight = 0;
  bool ok = true;
  self->request(admin, std::chrono::seconds(5), instances_atom::value)
      .receive([&](std::vector<instance_info>& v) { insts = std::move(v); },
               [&](caf::error&) { ok = false; });
  self->request(admin, std::chrono::seconds(5), requests_atom::value)
      .receive([&](std::vector<inflight_request>& v) { in_flight = v.size(); },
               [&](caf::error&) { ok = false; });
  std::set<std::string> names;
  if (ok) names = record_service(registry, insts, in_flight);
  self->request(admin, std::chrono::seconds(5), peek_atom::value)
      .receive([&](monitor_report& r) { record_monitor(registry, r, ok ? &names : nullptr); },
               [](caf::error&) {});
  // A service without a dp group or expert controller answers an error.
  self->request(admin, std::chrono::seconds(5), dp_status_atom::value)
      .receive([&](dp_group_status& d) { record_dp_group(registry, d); }, [](caf::error&) {});
  self->request(admin, std::chrono::seconds(5), expert_status_atom::value)
      .receive([&](expert_status& e) { record_experts(registry, e); }, [](caf::error&) {});
}

service_record current_service_record(caf::actor_system& sys, const admin_actor& admin,
                                      service_record r) {
  caf::scoped_actor self{sys};
  // Briefly: the registration's next renewal waits for these.
  self->request(admin, std::chrono::milliseconds(500), instances_atom::value)
      .receive(
          [&](std::vector<instance_info>& v) {
            r.instances = static_cast<int32_t>(v.size());
            for (const auto& i : v) {
              r.serving += i.state == "serving" ? 1 : 0;
              r.running += i.stats.running;
              r.waiting += i.stats.waiting;
            }
          },
          [](caf::error&) {});
  self->request(admin, std::chrono::milliseconds(300), requests_atom::value)
      .receive(
          [&](std::vector<inflight_request>& v) { r.in_flight = static_cast<int64_t>(v.size()); },
          [](caf::error&) {});
  return r;
}

struct metrics_server::impl {
  caf::actor_system& sys;
  admin_actor admin;
  std::shared_ptr<metrics_registry> registry;
  std::unique_ptr<http_get_server> http;

  impl(caf::actor_system& s, admin_actor a, std::shared_ptr<metrics_registry> r)
      : sys(s), admin(std::move(a)), registry(std::move(r)) {}
};

metrics_server::metrics_server(caf::actor_system& sys, admin_actor admin,
                               std::shared_ptr<metrics_registry> registry, const std::string& host,
                               int port)
    : impl_(std::make_unique<impl>(sys, std::move(admin), std::move(registry))) {
  auto* p = impl_.get();
  http_get_options o;
  o.host = host;
  o.port = port;
  try {
    p->http = std::make_unique<http_get_server>(o, [p](const std::string& path) {
      if (path != "/metrics" && path.rfind("/metrics?", 0) != 0)
        return http_response{404, "text/plain; charset=utf-8", "not found: try /metrics\n"};
      poll_metrics(p->sys, p->admin, *p->registry);
      return http_response{200, "text/plain; version=0.0.4; charset=utf-8", p->registry->render()};
    });
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("service.metrics_port: ") + e.what());
  }
}

metrics_server::~metrics_server() = default;

}  // namespace troupe::cli
