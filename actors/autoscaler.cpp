#include "actors/autoscaler.hpp"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>

namespace troupe {

namespace {

struct autoscaler_state {
  autoscaler_options opts;
  autoscale_memory mem;
  bool busy = false;  // an action (or a reading) in flight
  int32_t starting = 0;
  std::chrono::steady_clock::time_point born = std::chrono::steady_clock::now();
  std::string logged;  // the last "cannot" logged
  static inline const char* name = "autoscaler";
};

using self_ptr = autoscaler_actor::stateful_pointer<autoscaler_state>;

// What one reading gathered.
struct reading {
  std::vector<router_instance> instances;
  std::vector<link_status> nodes;
  std::map<uint64_t, instance_stats> stats;
  std::map<uint64_t, double> ttft_ms;
};

double now_s(self_ptr self) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - self->state.born).count();
}

void cannot(self_ptr self, const std::string& why) {
  if (self->state.logged != why) spdlog::warn("autoscale: {}", why);
  self->state.logged = why;
}

// The node with the most room for one more instance (our instances there
// under its cores), or "" when none has room.
std::string roomiest(const std::vector<link_status>& nodes) {
  const link_status* best = nullptr;
  for (const auto& n : nodes) {
    if (n.state != "up") continue;
    const int32_t room = std::max(1, n.resources.cores) - int32_t(n.instances.size());
    if (room <= 0) continue;
    if (!best || room > std::max(1, best->resources.cores) - int32_t(best->instances.size()))
      best = &n;
  }
  return best ? best->address : "";
}

// Starts `n` instances one after another, each on the node with the most
// room then (its count grows as each starts).
void start(self_ptr self, int32_t n, std::vector<link_status> nodes) {
  auto& st = self->state;
  if (n <= 0) {
    st.busy = false;
    return;
  }
  const auto node = roomiest(nodes);
  if (node.empty()) {
    st.starting -= n;
    st.busy = false;
    return cannot(self, "every node is full (one instance per core)");
  }
  spdlog::info("autoscale: starting an instance on {}", node);
  self->request(st.opts.nodes, std::chrono::minutes(11), grow_atom::value, node, int32_t(1))
      .then(
          [self, n, nodes, node](std::vector<uint64_t>& ids) mutable {
            --self->state.starting;
            for (auto& x : nodes)
              if (x.address == node) x.instances = ids;
            start(self, n - 1, std::move(nodes));
          },
          [self, n, node](caf::error& e) {
            self->state.starting -= n;
            self->state.busy = false;
            cannot(self, "start on " + node + " failed: " + self->system().render(e));
          });
}

void act(self_ptr self, reading& r) {
  auto& st = self->state;
  // A node's last instance may go (it keeps its first).
  std::map<uint64_t, std::string> last_of;
  for (const auto& n : r.nodes)
    if (n.state == "up" && n.instances.size() >= 2) last_of[n.instances.back()] = n.address;
  std::vector<scaled_instance> view;
  for (const auto& i : r.instances) {
    if (i.state != "serving") continue;
    scaled_instance s;
    s.id = i.id;
    s.retirable = last_of.count(i.id) > 0;
    if (auto it = r.stats.find(i.id); it != r.stats.end()) {
      s.running = it->second.running;
      s.waiting = it->second.waiting;
      s.max_seqs = std::max(1, st.opts.max_seqs);
    }
    if (auto it = r.ttft_ms.find(i.id); it != r.ttft_ms.end()) s.ttft_ms = it->second;
    view.push_back(s);
  }
  // Instances asked for and not up yet count as capacity.
  for (int32_t k = 0; k < st.starting; ++k) {
    scaled_instance s;
    s.starting = true;
    s.max_seqs = std::max(1, st.opts.max_seqs);
    view.push_back(s);
  }
  auto d = decide_autoscale(st.opts.policy, view, st.opts.ttft_target_ms, now_s(self), st.mem);
  if (d.why.empty()) return;
  if (d.grow > 0) {
    spdlog::info("autoscale: {}", d.why);
    st.busy = true;
    st.starting += d.grow;
    start(self, d.grow, r.nodes);
    return;
  }
  if (d.retire != 0) {
    const auto node = last_of[d.retire];
    spdlog::info("autoscale: {} on {}", d.why, node);
    st.busy = true;
    self->request(st.opts.nodes, std::chrono::minutes(7), shrink_atom::value, node)
        .then([self](uint64_t) { self->state.busy = false; },
              [self, node](caf::error& e) {
                self->state.busy = false;
                cannot(self, "retire on " + node + " failed: " + self->system().render(e));
              });
  }
}

// Reads the registry, the nodes, every serving instance's stats and the
// monitor's window, then acts.
void tick(self_ptr self) {
  auto& st = self->state;
  if (st.busy) return;
  st.busy = true;
  auto r = std::make_shared<reading>();
  auto done = [self, r] {
    self->state.busy = false;
    act(self, *r);
  };
  self->request(st.opts.router, std::chrono::seconds(5), registry_atom::value)
      .then(
          [self, r, done](std::vector<router_instance>& instances) {
            r->instances = std::move(instances);
            self->request(self->state.opts.router, std::chrono::seconds(5), nodes_atom::value)
                .then(
                    [self, r, done](std::vector<link_status>& nodes) {
                      r->nodes = std::move(nodes);
                      auto left = std::make_shared<size_t>(r->instances.size() + 1);
                      auto one = [left, done] {
                        if (--*left == 0) done();
                      };
                      if (self->state.opts.monitor)
                        self->request(self->state.opts.monitor, std::chrono::seconds(5),
                                      peek_atom::value)
                            .then(
                                [r, one](monitor_report& m) {
                                  for (const auto& w : m.instances)
                                    if (w.ttft_samples > 0) r->ttft_ms[w.instance] = w.ttft_ms;
                                  one();
                                },
                                [one](caf::error&) { one(); });
                      else
                        one();
                      for (const auto& i : r->instances) {
                        if (i.state != "serving" || !i.actor) {
                          one();
                          continue;
                        }
                        self->request(i.actor, std::chrono::seconds(3), stats_atom::value)
                            .then(
                                [r, one, id = i.id](instance_stats& s) {
                                  r->stats[id] = std::move(s);
                                  one();
                                },
                                [one](caf::error&) { one(); });
                      }
                    },
                    [self](caf::error&) { self->state.busy = false; });
          },
          [self](caf::error&) { self->state.busy = false; });
}

}  // namespace

autoscaler_actor spawn_autoscaler(caf::actor_system& sys, autoscaler_options opts) {
  return sys.spawn([opts = std::move(opts)](self_ptr self) -> autoscaler_actor::behavior_type {
    self->state.opts = opts;
    self->delayed_send(self, opts.window, tick_atom::value);
    return {
        [self](tick_atom) {
          tick(self);
          self->delayed_send(self, self->state.opts.window, tick_atom::value);
        },
    };
  });
}

}  // namespace troupe
