#include "actors/router.hpp"

#include <spdlog/spdlog.h>

#include <map>

namespace troupe {

namespace {

struct drain_wait {
  uint64_t instance;
  caf::typed_response_promise<uint64_t> promise;
};

struct router_state {
  router_state() = default;
  router_options opts;
  std::vector<router_instance> instances;
  std::map<uint64_t, instance_stats> last;  // by instance id
  std::vector<drain_wait> drains;
  placement_cursor cursor;
  prefill_model model;                   // step time by rows, from every instance's steps
  std::map<uint64_t, uint64_t> modeled;  // instance id -> the last step fed to `model`
  std::map<std::pair<std::string, int32_t>, uint64_t> slot_ids;  // (node, slot) -> id
  uint64_t next_id = 1;
  std::map<std::string, link_status> nodes;  // by address
  static inline const char* name = "router";
};

using self_ptr = router_actor::stateful_pointer<router_state>;

router_instance* find(router_state& st, uint64_t id) {
  for (auto& i : st.instances)
    if (i.id == id) return &i;
  return nullptr;
}

std::vector<instance_snapshot> snapshots(const router_state& st) {
  std::vector<instance_snapshot> out;
  for (const auto& i : st.instances) {
    instance_snapshot s;
    s.instance = i.id;
    s.serving = i.state == "serving";
    if (auto it = st.last.find(i.id); it != st.last.end()) {
      s.waiting = it->second.waiting;
      s.running = it->second.running;
      s.queued_prefill_tokens = it->second.queued_prefill_tokens;
      s.free_pages = it->second.kv.free + it->second.kv.reusable;
      s.total_pages = it->second.kv.total;
      s.prefix_hashes.insert(it->second.prefix_hashes.begin(), it->second.prefix_hashes.end());
    }
    out.push_back(std::move(s));
  }
  return out;
}

void settle_drains(self_ptr self) {
  auto& st = self->state;
  for (auto it = st.drains.begin(); it != st.drains.end();) {
    auto s = st.last.find(it->instance);
    const auto* inst = find(st, it->instance);
    const bool empty = !inst || inst->state == "down" ||
                       (s != st.last.end() && s->second.running + s->second.waiting == 0);
    if (empty) {
      it->promise.deliver(it->instance);
      it = st.drains.erase(it);
    } else {
      ++it;
    }
  }
}

// Feeds the instance's steps not seen yet to the prefill-time model.  A
// restarted instance (its node came back) counts steps from 0 again.
void learn_steps(router_state& st, uint64_t id, const std::vector<step_timing>& steps) {
  if (steps.empty()) return;
  uint64_t& seen = st.modeled[id];
  if (steps.back().step < seen) seen = 0;
  for (const auto& t : steps)
    if (t.step > seen && t.rows > 0) st.model.observe(t.rows, t.ms);
  seen = steps.back().step;
}

void poll(self_ptr self) {
  for (const auto& i : self->state.instances) {
    if (i.state == "down") continue;
    // A draining instance with sequences asks their requests to move.
    if (i.state == "draining" && self->state.opts.drain_migrates) {
      auto s = self->state.last.find(i.id);
      if (s == self->state.last.end() || s->second.running + s->second.waiting > 0)
        self->send(i.actor, relocate_atom::value);
    }
    const uint64_t id = i.id;
    self->request(i.actor, std::chrono::seconds(5), stats_atom::value)
        .then(
            [self, id](instance_stats& s) {
              auto& st = self->state;
              learn_steps(st, id, s.recent_steps);
              st.last[id] = std::move(s);
              settle_drains(self);
            },
            [](caf::error&) {});
  }
}

}  // namespace

router_actor spawn_router(caf::actor_system& sys, std::vector<router_instance> instances,
                          router_options opts) {
  return sys.spawn([instances = std::move(instances),
                    opts](self_ptr self) mutable -> router_actor::behavior_type {
    auto& st = self->state;
    st.opts = opts;
    st.instances = std::move(instances);
    for (const auto& i : st.instances) {
      self->monitor(i.actor);
      st.next_id = std::max(st.next_id, i.id + 1);
    }
    self->set_down_handler([self](const caf::down_msg& dm) {
      for (auto& i : self->state.instances)
        if (i.actor.address() == dm.source && i.state != "down") {
          spdlog::warn("router: instance {} on {} is down: {}", i.id, i.node,
                       self->system().render(dm.reason));
          i.state = "down";
        }
      settle_drains(self);
    });
    self->send(self, tick_atom::value);
    return {
        [self](tick_atom) {
          poll(self);
          self->delayed_send(self, self->state.opts.poll, tick_atom::value);
        },
        [self](place_atom, int32_t prompt_tokens,
               std::vector<uint64_t>& hashes) -> caf::result<placement_reply> {
          auto& st = self->state;
          placement_request req{prompt_tokens, std::move(hashes)};
          auto p = place(st.opts.policy, req, snapshots(st), st.cursor, st.model,
                         st.opts.ttft_target_ms);
          if (p.instance == 0)
            return caf::make_error(caf::sec::invalid_argument,
                                   "no instance is serving (" + p.why + ")");
          // Count the placement now, so a burst does not all go to the
          // instance the last snapshot showed idle.
          ++st.last[p.instance].waiting;
          st.last[p.instance].queued_prefill_tokens += prompt_tokens;
          return placement_reply{p.instance, find(st, p.instance)->actor, p.why};
        },
        [self](lookup_atom, uint64_t id) -> caf::result<placement_reply> {
          auto* i = find(self->state, id);
          if (!i)
            return caf::make_error(caf::sec::invalid_argument, "no instance " + std::to_string(id));
          if (i->state != "serving")
            return caf::make_error(caf::sec::invalid_argument,
                                   "instance " + std::to_string(id) + " is " + i->state);
          return placement_reply{i->id, i->actor, "asked for"};
        },
        [self](registry_atom) { return self->state.instances; },
        [self](nodes_atom, link_status& s) { self->state.nodes[s.address] = std::move(s); },
        [self](nodes_atom) {
          std::vector<link_status> out;
          for (const auto& [addr, s] : self->state.nodes) out.push_back(s);
          return out;
        },
        [self](add_instances_atom, const std::string& node,
               const std::vector<hosted_instance>& hosted) {
          auto& st = self->state;
          std::vector<uint64_t> ids;
          for (const auto& h : hosted) {
            auto key = std::make_pair(node, h.slot);
            auto known = st.slot_ids.find(key);
            const uint64_t id = known != st.slot_ids.end() ? known->second : st.next_id++;
            st.slot_ids[key] = id;
            router_instance* ri = find(st, id);
            if (!ri) {
              st.instances.push_back(router_instance{});
              ri = &st.instances.back();
              ri->id = id;
            }
            if (ri->actor == h.actor && ri->state != "down") {
              // Already here (a node that grew lists its old instances too):
              // it keeps its state, draining included.
              ids.push_back(id);
              continue;
            }
            if (ri->actor && ri->actor != h.actor) self->demonitor(ri->actor.address());
            const bool back = ri->state == "down";
            ri->node = node;
            ri->actor = h.actor;
            ri->state = "serving";
            st.last.erase(id);
            self->monitor(h.actor);
            spdlog::info("router: instance {} on {} {}", id, node, back ? "is back" : "joined");
            ids.push_back(id);
          }
          poll(self);
          return ids;
        },
        [self](kill_instance_atom, uint64_t id) -> caf::result<uint64_t> {
          auto* i = find(self->state, id);
          if (!i)
            return caf::make_error(caf::sec::invalid_argument, "no instance " + std::to_string(id));
          spdlog::warn("router: killing instance {} (fault injection)", id);
          self->send_exit(i->actor, caf::exit_reason::kill);
          return id;
        },
        [self](set_atom, const std::string& key,
               const std::string& value) -> caf::result<std::string> {
          auto& st = self->state;
          if (key == "router") {
            auto p = parse_placement_policy(value);
            if (!p)
              return caf::make_error(
                  caf::sec::invalid_argument,
                  "set router: '" + value +
                      "' is not a policy (round-robin, least-load, prefix, slo)");
            const std::string old = to_string(st.opts.policy);
            st.opts.policy = *p;
            spdlog::info("router: placement policy {} -> {}", old, value);
            return "router: " + old + " -> " + value;
          }
          int32_t v = 0;
          try {
            size_t used = 0;
            v = std::stoi(value, &used);
            if (used != value.size()) throw std::invalid_argument(value);
          } catch (const std::exception&) {
            return caf::make_error(caf::sec::invalid_argument,
                                   "set " + key + ": '" + value + "' is not an integer");
          }
          // Every instance that serves takes the limit; the first refusal
          // (a bad key or value) is the answer.
          struct gathering {
            size_t left = 0, changed = 0;
            std::string error, old;
            caf::typed_response_promise<std::string> rp;
          };
          auto g = std::make_shared<gathering>();
          std::vector<instance_actor> targets;
          for (const auto& i : st.instances)
            if (i.state != "down") targets.push_back(i.actor);
          if (targets.empty())
            return caf::make_error(caf::sec::invalid_argument, "set " + key + ": no instance");
          g->left = targets.size();
          g->rp = self->make_response_promise<std::string>();
          auto done = [g, key, value] {
            if (--g->left > 0) return;
            if (!g->error.empty())
              g->rp.deliver(caf::make_error(caf::sec::invalid_argument, g->error));
            else
              g->rp.deliver(key + ": " + g->old + " -> " + value + " on " +
                            std::to_string(g->changed) + " instances");
          };
          for (const auto& t : targets)
            self->request(t, std::chrono::seconds(5), set_atom::value, key, v)
                .then(
                    [g, done](int32_t old) {
                      ++g->changed;
                      g->old = std::to_string(old);
                      done();
                    },
                    [self, g, done](caf::error& e) {
                      if (g->error.empty()) g->error = self->system().render(e);
                      done();
                    });
          return g->rp;
        },
        [self](drain_instance_atom, uint64_t id) -> caf::result<uint64_t> {
          auto& st = self->state;
          auto* i = find(st, id);
          if (!i)
            return caf::make_error(caf::sec::invalid_argument, "no instance " + std::to_string(id));
          if (i->state == "serving") i->state = "draining";
          auto rp = self->make_response_promise<uint64_t>();
          st.drains.push_back({id, rp});
          poll(self);
          return rp;
        },
    };
  });
}

}  // namespace troupe
