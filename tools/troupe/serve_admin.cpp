#include "tools/troupe/serve_admin.hpp"

#include <httplib.h>
#include <stdexcept>
#include <thread>

namespace troupe::cli {

struct metrics_server::impl {
  caf::actor_system& sys;
  admin_actor admin;
  std::shared_ptr<metrics_registry> registry;
  httplib::Server http;
  std::thread thread;

  impl(caf::actor_system& s, admin_actor a, std::shared_ptr<metrics_registry> r)
      : sys(s), admin(std::move(a)), registry(std::move(r)) {}

  // The gauges as of now; a failed ask leaves the last values standing.
  void poll() {
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
    if (ok) record_service(*registry, insts, in_flight);
  }
};

metrics_server::metrics_server(caf::actor_system& sys, admin_actor admin,
                               std::shared_ptr<metrics_registry> registry, const std::string& host,
                               int port)
    : impl_(std::make_unique<impl>(sys, std::move(admin), std::move(registry))) {
  auto* p = impl_.get();
  p->http.Get("/metrics", [p](const httplib::Request&, httplib::Response& res) {
    p->poll();
    res.set_content(p->registry->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (!p->http.bind_to_port(host.c_str(), port))
    throw std::runtime_error("service.metrics_port: cannot listen on " + host + ":" +
                             std::to_string(port));
  p->thread = std::thread([p] { p->http.listen_after_bind(); });
}

metrics_server::~metrics_server() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace troupe::cli
