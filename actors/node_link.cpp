#include "actors/node_link.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>

namespace troupe {

namespace {

struct link_state {
  node_link_options opts;
  link_status status;
  node_actor node;
  uint64_t connection = 0;
  std::string logged;  // the last failure logged: a node down for long logs it once  // counts
                       // connects: answers to an earlier one are dropped
  bool settled = false;
  std::string startup_error;  // why it was not up when it first settled
  bool leaving = false;       // the node said it stops: no reconnect to it
  bool detaching = false;     // the service let the node go: never again
  bool shrinking = false;     // its last instance is draining to stop
  int failures = 0;           // attempts failed since it was last up (the retry backs off)
  std::vector<caf::typed_response_promise<link_status>> waiting;            // for settled
  std::vector<caf::typed_response_promise<std::vector<uint64_t>>> growing;  // grow asked
  static inline const char* name = "node_link";
};

using self_ptr = node_link_full_actor::stateful_pointer<link_state>;

// The node's resources again (memory, instances, peers), for the router's
// view; every few seconds while it is up.
constexpr auto k_resources_every = std::chrono::seconds(2);

// The longest wait between attempts at a node that does not answer.
constexpr std::chrono::milliseconds k_retry_most{5000};

// The service's other nodes, for the node to connect to (again, after a
// lost connection or a failed first try).
void send_peers(self_ptr self) {
  auto& st = self->state;
  // One connection per pair: a node connects to the peers named before
  // it (when two nodes connected to each other at once, CAF kept one
  // connection and, now and then, routed between them through the
  // service after all).
  std::vector<std::string> others;
  for (const auto& a : st.opts.peers)
    if (a < st.opts.address()) others.push_back(a);
  if (!others.empty()) self->send(st.node, peers_atom::value, std::move(others));
}

void refresh_resources(self_ptr self) {
  auto& st = self->state;
  if (!st.node || st.status.state != "up") return;
  send_peers(self);
  self->request(st.node, std::chrono::seconds(10), resources_atom::value)
      .then(
          [self](node_resources& r) {
            auto& st = self->state;
            st.status.resources = std::move(r);
            self->send(st.opts.router, nodes_atom::value, st.status);
          },
          [](caf::error&) {});
}

void settle(self_ptr self) {
  auto& st = self->state;
  self->send(st.opts.router, nodes_atom::value, st.status);
  if (!st.settled && st.status.state != "up") st.startup_error = st.status.error;
  st.settled = true;
  for (auto& rp : st.waiting) rp.deliver(st.status);
  st.waiting.clear();
}

// Not up: say why, and try again later.
void failed(self_ptr self, const std::string& state, const std::string& why) {
  auto& st = self->state;
  st.status.state = state;
  st.status.error = why;
  st.status.instances.clear();
  for (auto& rp : st.growing)
    rp.deliver(caf::make_error(caf::sec::runtime_error,
                               "node " + st.opts.address() + " " + state + ": " + why));
  st.growing.clear();
  if (st.logged != state + ": " + why) {
    st.logged = state + ": " + why;
    spdlog::warn("cluster: node {} {}: {}", st.opts.address(), state, why);
  }
  settle(self);
  // A node that stays away is tried less often: retry, 2x, 4x, ... up to
  // k_retry_most (a node that just died is tried again after `retry`).
  const int doublings = std::min(st.failures++, 6);
  const auto wait = std::min<std::chrono::milliseconds>(st.opts.retry * (1 << doublings),
                                                        std::max(st.opts.retry, k_retry_most));
  if (!st.leaving) self->delayed_send(self, wait, connect_now_atom::value);
}

void host(self_ptr self) {
  auto& st = self->state;
  // An answer from before the node was lost (it died while building the
  // instances) must not overwrite what the loss said.
  auto current = [self, conn = st.connection] { return self->state.connection == conn; };
  send_peers(self);
  self->request(st.node, std::chrono::seconds(10), resources_atom::value)
      .then([self](node_resources& r) { self->state.status.resources = std::move(r); },
            [](caf::error&) {});
  self->request(st.node, st.opts.host_timeout, host_atom::value, st.opts.service_id,
                caf::actor_cast<node_link_actor>(self), st.opts.specs)
      .then(
          [self, current](std::vector<hosted_instance>& hosted) {
            if (!current()) return;
            auto& st = self->state;
            for (const auto& h : hosted)
              if (h.info.model_fingerprint != st.opts.model_fingerprint)
                return failed(self, "refused",
                              "its instance " + std::to_string(h.slot) + " serves model " +
                                  h.info.model_path + ", not the service's (fingerprints differ)");
            auto first = hosted.empty() ? device_info{} : hosted[0].info;
            self->request(st.opts.router, std::chrono::seconds(10), add_instances_atom::value,
                          st.opts.address(), std::move(hosted))
                .then(
                    [self, current, info = std::move(first)](std::vector<uint64_t>& ids) {
                      if (!current()) return;
                      auto& st = self->state;
                      st.status.info = info;
                      st.status.state = "up";
                      st.status.error.clear();
                      st.failures = 0;
                      st.status.instances = std::move(ids);
                      st.logged.clear();
                      for (auto& rp : st.growing) rp.deliver(st.status.instances);
                      st.growing.clear();
                      spdlog::info("cluster: node {} is up with {} instances", st.opts.address(),
                                   st.status.instances.size());

                      settle(self);
                    },
                    [self, current](caf::error& e) {
                      if (!current()) return;
                      failed(self, "down",
                             "the router did not take its instances: " + self->system().render(e));
                    });
          },
          [self, current](caf::error& e) {
            if (!current()) return;
            failed(self, "refused", "it cannot host the instances: " + self->system().render(e));
          });
}

void connect(self_ptr self) {
  auto& st = self->state;
  if (st.leaving || st.status.state == "up" || st.status.state == "connecting") return;
  st.status.state = "connecting";
  ++st.status.attempts;
  auto mm = self->system().openssl_manager().actor_handle();
  self->request(mm, std::chrono::seconds(10), caf::connect_atom::value, st.opts.host, st.opts.port)
      .then(
          [self](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto& st = self->state;
            if (!ptr) return failed(self, "refused", "it publishes no node actor at that port");
            st.node = caf::actor_cast<node_actor>(ptr);
            self->monitor(st.node);
            host(self);
          },
          [self](caf::error& e) {
            // A TLS refusal shows here as a closed connection; the log line
            // of the handshake says more (net/cluster_tls.cpp).
            auto why = self->system().render(e);
            if (why.find("disconnect_during_handshake") != std::string::npos)
              why +=
                  " (the TLS handshake failed: not the same cluster secret, or not a troupe "
                  "node)";
            failed(self, "down", "cannot connect: " + why);
          });
}

}  // namespace

node_link_full_actor spawn_node_link(caf::actor_system& sys, node_link_options opts) {
  return sys.spawn([opts = std::move(opts)](self_ptr self) -> node_link_full_actor::behavior_type {
    auto& st = self->state;
    st.opts = opts;
    st.status.address = opts.address();
    st.status.state = "down";
    // The node is lost: report it down and try again (one that left may return).
    self->set_down_handler([self](const caf::down_msg& dm) {
      auto& st = self->state;
      if (!st.node || dm.source != st.node.address()) return;
      st.node = nullptr;
      ++st.connection;
      // The router and the request actors saw the instances go down too.
      // A node that left may be started again: keep trying (unless the
      // service let it go).
      st.leaving = st.detaching;
      failed(self, "down", "lost: " + self->system().render(dm.reason));
    });
    self->send(self, connect_now_atom::value);
    self->delayed_send(self, k_resources_every, tick_atom::value);
    return {
        // Connect to the node (at start-up, and to retry after a failure).
        [self](connect_now_atom) { connect(self); },
        // Its own timer: the node's resources again.
        [self](tick_atom) {
          refresh_resources(self);
          self->delayed_send(self, k_resources_every, tick_atom::value);
        },
        // The node stops: drain its instances so their sequences move elsewhere.
        [self](leaving_atom) {
          auto& st = self->state;
          st.leaving = true;
          st.status.state = "leaving";
          self->send(st.opts.router, nodes_atom::value, st.status);
          spdlog::warn("cluster: node {} is stopping; draining its instances", st.opts.address());
          for (uint64_t id : st.status.instances)
            self->request(st.opts.router, std::chrono::minutes(10), drain_instance_atom::value, id)
                .then([](uint64_t) {}, [](caf::error&) {});
        },
        // What it knows now.
        [self](status_atom) { return self->state.status; },
        // Host n more instances like the last; replies once they are up.
        [self](grow_atom, int32_t n) -> caf::result<std::vector<uint64_t>> {
          auto& st = self->state;
          auto refuse = [&](const std::string& why) {
            return caf::make_error(caf::sec::invalid_argument,
                                   "node " + st.opts.address() + ": " + why);
          };
          if (n < 1 || n > 64) return refuse("give 1 to 64 instances");
          if (st.detaching) return refuse("it is leaving the service");
          if (st.status.state != "up")
            return refuse("it is " + st.status.state +
                          (st.status.error.empty() ? "" : " (" + st.status.error + ")"));
          if (!st.growing.empty()) return refuse("it is starting instances already");
          if (st.opts.specs.empty()) return refuse("it hosts no instance to copy");
          // The node hosts what the link asks for (host is declarative):
          // the same specs plus n copies of the last.
          for (int32_t i = 0; i < n; ++i) st.opts.specs.push_back(st.opts.specs.back());
          auto rp = self->make_response_promise<std::vector<uint64_t>>();
          st.growing.push_back(rp);
          host(self);
          return rp;
        },
        // The service's nodes changed: connect to the new ones.
        [self](peers_atom, std::vector<std::string>& peers) {
          self->state.opts.peers = std::move(peers);
          if (self->state.status.state == "up") send_peers(self);
        },
        // Its last instance drains, stops on the node and leaves the router.
        [self](shrink_atom) -> caf::result<uint64_t> {
          auto& st = self->state;
          auto refuse = [&](const std::string& why) {
            return caf::make_error(caf::sec::invalid_argument,
                                   "node " + st.opts.address() + ": " + why);
          };
          if (st.status.state != "up" || st.detaching) return refuse("it is " + st.status.state);
          if (st.shrinking || !st.growing.empty()) return refuse("it is changing already");
          if (st.status.instances.size() < 2 || st.opts.specs.size() < 2)
            return refuse("it keeps one instance");
          st.shrinking = true;
          const uint64_t id = st.status.instances.back();
          auto rp = self->make_response_promise<uint64_t>();
          auto fail = [self, rp](const std::string& why) mutable {
            self->state.shrinking = false;
            rp.deliver(caf::make_error(caf::sec::runtime_error, why));
          };
          self->request(st.opts.router, std::chrono::minutes(5), drain_instance_atom::value, id)
              .then(
                  [self, rp, id, fail](uint64_t) mutable {
                    auto& st = self->state;
                    if (!st.node) return fail("the node was lost while its instance drained");
                    // Hosting is declarative: the specs without the last.
                    auto specs = st.opts.specs;
                    specs.pop_back();
                    self->request(st.node, std::chrono::seconds(30), host_atom::value,
                                  st.opts.service_id, caf::actor_cast<node_link_actor>(self), specs)
                        .then(
                            [self, rp, id](std::vector<hosted_instance>&) mutable {
                              auto& st = self->state;
                              st.opts.specs.pop_back();
                              auto& ids = st.status.instances;
                              ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
                              st.shrinking = false;
                              self->send(st.opts.router, forget_instance_atom::value, id);
                              self->send(st.opts.router, nodes_atom::value, st.status);
                              rp.deliver(id);
                            },
                            [self, fail](caf::error& e) mutable {
                              fail("the node did not stop it: " + self->system().render(e));
                            });
                  },
                  [self, fail](caf::error& e) mutable {
                    fail("its drain failed: " + self->system().render(e));
                  });
          return rp;
        },
        // The node leaves the service: release its instances there and quit.
        [self](detach_atom) -> caf::result<bool> {
          auto& st = self->state;
          st.leaving = st.detaching = true;
          st.status.state = "leaving";
          ++st.connection;  // answers still on their way change nothing now
          for (auto& rp : st.growing)
            rp.deliver(caf::make_error(caf::sec::runtime_error,
                                       "node " + st.opts.address() + " left the service"));
          st.growing.clear();
          if (!st.node) {
            self->quit();
            return false;
          }
          auto rp = self->make_response_promise<bool>();
          self->request(st.node, std::chrono::seconds(10), host_atom::value, st.opts.service_id,
                        caf::actor_cast<node_link_actor>(self), std::vector<instance_spec>{})
              .then(
                  [self, rp](std::vector<hosted_instance>&) mutable {
                    rp.deliver(true);
                    self->quit();
                  },
                  [self, rp](caf::error&) mutable {
                    rp.deliver(false);
                    self->quit();
                  });
          return rp;
        },
        // The status once the first attempt has an outcome (start-up).
        [self](settled_atom) -> caf::result<link_status> {
          auto& st = self->state;
          // Asked after it settled: the start-up's outcome says why it
          // first failed (a retry since may have failed otherwise).
          if (st.settled) {
            link_status now = st.status;
            if (now.state != "up" && !st.startup_error.empty() && now.error != st.startup_error)
              now.error = st.startup_error + "; since then: " + now.error;
            return now;
          }
          auto rp = self->make_response_promise<link_status>();
          st.waiting.push_back(rp);
          return rp;
        },
    };
  });
}

}  // namespace troupe
