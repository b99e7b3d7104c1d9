#include "actors/router.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <map>

#include "runtime/common/elapsed.hpp"
#include "runtime/config/settings.hpp"
#include "runtime/service/rebalance.hpp"
#include "runtime/service/ttft_predictor.hpp"

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
  std::map<uint64_t, instance_stats> last;                            // by instance id
  std::map<uint64_t, std::chrono::steady_clock::time_point> last_at;  // when each came
  // A draining instance's sequences of this service (a shared instance
  // holds other services' too): its last answer to relocate, by id.
  std::map<uint64_t, int32_t> own_left;
  std::vector<drain_wait> drains;
  placement_cursor cursor;
  prefill_model model;                   // step time by rows, from every instance's steps
  ttft_model ttft;                       // the TTFT predictor's step model, from every step
  std::map<uint64_t, uint64_t> modeled;  // instance id -> the last step fed to `model`
  std::map<std::pair<std::string, int32_t>, uint64_t> slot_ids;  // (node, slot) -> id
  uint64_t next_id = 1;
  std::map<std::string, link_status> nodes;  // by address
  // Disaggregation and role switching.
  std::map<uint64_t, instance_window> windows;  // the monitor's last window, by instance
  flip_memory flip_mem;
  uint64_t flips = 0;
  uint64_t copy_cursor = 0;  // turns among other nodes' stores for KV copies
  std::chrono::steady_clock::time_point born = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point rebalanced = born;
  uint64_t rebalanced_requests = 0;  // queued requests asked to move
  // Hybrid EPD: images placed on each instance's encoder and not yet done.
  std::map<uint64_t, int32_t> encode_images;
  size_t encode_cursor = 0;
  static inline const char* name = "router";
};

using self_ptr = router_actor::stateful_pointer<router_state>;

router_instance* find(router_state& st, uint64_t id) {
  for (auto& i : st.instances)
    if (i.id == id) return &i;
  return nullptr;
}

// A move between two stages of an instance's pipelined device (admin):
// `n` layers (movelayers) or KV heads (moveheads), relayed to its device.
template <class Atom>
caf::result<std::string> move_on_stages(self_ptr self, Atom atom, const char* what, uint64_t id,
                                        int32_t from, int32_t to, int32_t n) {
  const std::string cmd = caf::to_string(caf::atom_value{Atom::value});
  auto* i = find(self->state, id);
  if (!i)
    return caf::make_error(caf::sec::invalid_argument, cmd + ": no instance " + std::to_string(id));
  if (!i->device)
    return caf::make_error(caf::sec::invalid_argument, cmd + ": instance " + std::to_string(id) +
                                                           ": the router does not know its device");
  spdlog::info("router: instance {}: moving {} {}(s) from stage {} to stage {} (admin)", id, n,
               what, from, to);
  auto rp = self->make_response_promise<std::string>();
  // A move waits for the steps before it and may load two stages: minutes at most.
  self->request(i->device, std::chrono::minutes(10), atom, from, to, n)
      .then([rp](std::string& moved) mutable { rp.deliver(std::move(moved)); },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

// Where an instance starts: its --roles entry, else with --pd mixed when
// roles switch through M, else the first prefills and the rest decode.
pd_pool initial_pool(const router_options& o, uint64_t id) {
  if (!o.pd || id == 0) return pd_pool::mixed;
  return pool_of(pd_start_role(o.roles, id - 1, o.role_switching && o.pd_cfg.via_mixed));
}

pd_pool pool_of_instance(const router_instance& i) {
  for (pd_pool p : {pd_pool::mixed, pd_pool::prefill, pd_pool::decode, pd_pool::prefill_to_decode,
                    pd_pool::decode_to_prefill, pd_pool::encode})
    if (i.pool == to_string(p)) return p;
  return pd_pool::mixed;
}

void set_pool(router_instance& i, pd_pool p) {
  if (i.pool != to_string(p))
    spdlog::info("router: instance {} moves to pool {} (was {})", i.id, to_string(p), i.pool);
  i.pool = to_string(p);
  i.role = to_string(role_of(p));
}

// One instance as the disaggregation policies see it.
pd_load load_of(const router_state& st, const router_instance& i) {
  pd_load l;
  l.id = i.id;
  l.serving = i.state == "serving";
  l.pool = pool_of_instance(i);
  l.page_size = st.opts.page_size;
  if (auto it = st.last.find(i.id); it != st.last.end()) {
    const auto& s = it->second;
    l.queued_prefills = s.queued_prefills;
    l.prefilling = static_cast<int32_t>(s.queued_prefills.size());
    l.waiting = static_cast<int32_t>(std::clamp<int64_t>(s.waiting, 0, l.prefilling));
    l.decoding = s.decoding;
    l.running_tokens = s.running_tokens;
    l.total_pages = s.kv.total;
    l.used_pages = s.kv.total - s.kv.free - s.kv.reusable;
    if (auto at = st.last_at.find(i.id); at != st.last_at.end())
      l.age_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - at->second)
              .count();
  }
  if (auto it = st.windows.find(i.id); it != st.windows.end()) {
    l.token_interval_ms = it->second.token_interval_ms;
    l.tpot_ms = it->second.tpot_ms;
    l.busy = it->second.busy;
  }
  return l;
}

// A sequence of `context` tokens placed to decode on instance `id`,
// counted in the router's snapshot of it until its next stats report, so
// that the placements before then see it: its decoding count, context and,
// where its KV moves there (`transfer`), the pages it will take (staying
// on its prefill instance, it holds them already).
void count_decode(router_state& st, uint64_t id, int32_t context, bool transfer) {
  auto& s = st.last[id];
  ++s.decoding;
  s.running_tokens += context;
  if (transfer) s.kv.free -= kv_pages_for(context, st.opts.page_size);
}

// The instances as the disaggregation policies see them.
std::vector<pd_load> pd_loads(const router_state& st) {
  std::vector<pd_load> out;
  for (const auto& i : st.instances) out.push_back(load_of(st, i));
  return out;
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
      // The global prefix index: what its process's KV store holds, by
      // tier, and what a page from each cost (a disk page: the load plus
      // the disk's read of it).
      // The instance's fetch times include the disk's reads: a host page
      // costs them less the disk's read time, a disk page that too.
      double disk_read_ms = 0, disk_per_page = -1;
      for (const auto& t : it->second.store.tiers) {
        const bool disk = t.name == "disk";
        auto& into = disk ? s.disk_hashes : s.tier_hashes;
        into.insert(t.hashes.begin(), t.hashes.end());
        if (disk && t.hits > 0) {
          disk_read_ms = t.read_ms;
          disk_per_page = t.read_ms / double(t.hits);
        }
      }
      if (it->second.loaded_pages > 0) {
        s.tier_load_ms_per_page =
            std::max(0.0, it->second.tier_load_ms - disk_read_ms) / double(it->second.loaded_pages);
        if (disk_per_page >= 0) s.disk_load_ms_per_page = s.tier_load_ms_per_page + disk_per_page;
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The KV store's links for a placement (docs/architecture.md §4.10): a
// store on another node for the request's KV copies (in turn among them;
// the request decides whether it keeps copies), and another node's store
// to pull the prompt's pages from when one holds more of them than the
// chosen instance and pulling over that link beats computing (pick_kv_pull,
// with the link's cost as the chosen instance measured it).
void add_kv_links(const router_state& st, placement_reply& r, const std::vector<uint64_t>& hashes,
                  int32_t prompt_tokens, uint64_t& copy_cursor) {
  const router_instance* chosen = nullptr;
  for (const auto& i : st.instances)
    if (i.id == r.instance) chosen = &i;
  if (!chosen) return;
  // One instance per store of another process (its stats carry the store's).
  std::vector<const router_instance*> others;
  for (const auto& i : st.instances) {
    if (i.state != "serving" || !i.store || i.node == chosen->node || i.store == chosen->store)
      continue;
    bool seen = false;
    for (const auto* o : others) seen = seen || o->store == i.store;
    if (!seen) others.push_back(&i);
  }
  if (others.empty()) return;
  r.kv_copy_to = others[copy_cursor++ % others.size()]->store;
  if (hashes.empty()) return;
  const auto snaps = snapshots(st);
  const instance_snapshot* mine = nullptr;
  std::vector<const instance_snapshot*> theirs(others.size(), nullptr);
  for (const auto& s : snaps) {
    if (s.instance == chosen->id) mine = &s;
    for (size_t k = 0; k < others.size(); ++k)
      if (s.instance == others[k]->id) theirs[k] = &s;
  }
  if (!mine || std::count(theirs.begin(), theirs.end(), nullptr) > 0) return;
  // Each link's cost as the chosen instance measured its pulls over it.
  const auto stats = st.last.find(chosen->id);
  const int32_t have = held_run(*mine, hashes);
  std::vector<int32_t> runs;
  std::vector<double> pull_ms;
  for (size_t k = 0; k < others.size(); ++k) {
    // A store's run, in either of its tiers.
    int32_t run = 0;
    for (size_t i = size_t(have); i < hashes.size(); ++i, ++run)
      if (!theirs[k]->tier_hashes.count(hashes[i]) && !theirs[k]->disk_hashes.count(hashes[i]))
        break;
    runs.push_back(run);
    double ms = -1;
    if (stats != st.last.end()) {
      const auto name = caf::to_string(others[k]->store.address());
      for (const auto& l : stats->second.pull_links)
        if (l.store == name) ms = l.ms_per_page();
    }
    pull_ms.push_back(ms);
  }
  const double compute = compute_ms_per_page(prompt_tokens, st.opts.page_size, st.model);
  auto pull = pick_kv_pull(runs, pull_ms, compute);
  if (pull.store < 0) return;
  r.kv_sources.push_back(others[size_t(pull.store)]->store);
  r.why += ", pulls " + std::to_string(pull.pages) + " pages from node " +
           others[size_t(pull.store)]->node;
}

void settle_drains(self_ptr self) {
  auto& st = self->state;
  for (auto it = st.drains.begin(); it != st.drains.end();) {
    auto s = st.last.find(it->instance);
    const auto* inst = find(st, it->instance);
    const auto own = st.own_left.find(it->instance);
    const bool empty = !inst || inst->state == "down" ||
                       (s != st.last.end() && s->second.running + s->second.waiting == 0) ||
                       (own != st.own_left.end() && own->second == 0);
    if (empty) {
      it->promise.deliver(it->instance);
      st.own_left.erase(it->instance);
      it = st.drains.erase(it);
    } else {
      ++it;
    }
  }
}

// Feeds the instance's steps not seen yet to the prefill-time model.  A
// restarted instance (its node came back) counts steps from 0 again.
// The new ones go to the monitor too (token intervals, busy share).
void learn_steps(router_state& st, uint64_t id, const std::vector<step_timing>& steps) {
  if (steps.empty()) return;
  uint64_t& seen = st.modeled[id];
  if (steps.back().step < seen) seen = 0;
  std::vector<step_timing> fresh;
  for (const auto& t : steps)
    if (t.step > seen && t.rows > 0) {
      // The prefill-time model learns from steps that prefill, by their
      // prefill rows (decode rows beside them only add their delay, which
      // a prefill placed there meets too).
      if (t.rows > t.decode_rows) st.model.observe(t.rows - t.decode_rows, t.ms);
      // The TTFT predictor learns from every step, decode-only ones too
      // (they price the decode rows that share a mixed instance's steps).
      st.ttft.steps.observe(t.rows - t.decode_rows, t.decode_rows, t.context, t.ms);
      fresh.push_back(t);
    }
  seen = steps.back().step;
  if (st.opts.monitor && !fresh.empty())
    caf::anon_send(st.opts.monitor, steps_atom::value, id, std::move(fresh));
}

// D->P preemption by migration (pd_config::preempt_migrate): instance
// `id` left decode; as many of its decoding sequences as plan_evacuation
// finds room for under the caps are asked to move, each to its planned
// instance (counted there now, as a decode placement is).  The router's
// snapshot has their count and total context, not each one's: the plan
// takes the mean for each.
void evacuate(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto* i = find(st, id);
  if (!i) return;
  const pd_load from = load_of(st, *i);
  if (from.decoding <= 0) return;
  const std::vector<int32_t> contexts(size_t(from.decoding),
                                      static_cast<int32_t>(from.running_tokens / from.decoding));
  const auto to = plan_evacuation(id, contexts, pd_loads(st), st.opts.pd_cfg,
                                  {st.opts.ttft_target_ms, st.opts.tpot_target_ms});
  std::vector<uint64_t> targets;
  for (size_t k = 0; k < to.size(); ++k) {
    if (to[k] == 0) continue;
    targets.push_back(to[k]);
    count_decode(st, to[k], contexts[k], true);
  }
  const auto n = static_cast<int32_t>(targets.size());
  if (n == 0) return;
  self->request(i->actor, std::chrono::seconds(5), evacuate_atom::value, self->node(),
                std::move(targets))
      .then(
          [id, n](int32_t asked) {
            spdlog::info(
                "router: instance {} left decode: {} of its decoding sequences asked "
                "to migrate (room for {})",
                id, asked, n);
          },
          [](caf::error&) {});
}

// Tells instance `id` its new role and moves it to the X->Y pool once it
// agreed; `done` gets what changed or why not.
void apply_role(self_ptr self, uint64_t id, instance_role role, std::string why,
                std::function<void(caf::expected<std::string>)> done) {
  auto* i = find(self->state, id);
  if (!i || i->state == "down")
    return done(
        caf::make_error(caf::sec::invalid_argument, "no serving instance " + std::to_string(id)));
  const auto started = std::chrono::steady_clock::now();
  self->request(i->actor, std::chrono::seconds(5), set_role_atom::value,
                std::string(to_string(role)))
      .then(
          [self, id, role, why, done, started](const std::string& old) {
            auto* i = find(self->state, id);
            if (!i) return done(caf::make_error(caf::sec::invalid_argument, "instance gone"));
            const pd_pool from = pool_of_instance(*i);
            set_pool(*i, flip_pool(from, role));
            ++self->state.flips;
            const double ms = ms_since(started);
            spdlog::info("router: instance {} role {} -> {} ({}), pool {} -> {}, {:.2f} ms", id,
                         old, to_string(role), why, to_string(from), i->pool, ms);
            if (self->state.opts.pd && self->state.opts.pd_cfg.preempt_migrate &&
                pool_of_instance(*i) == pd_pool::decode_to_prefill)
              evacuate(self, id);
            done("instance " + std::to_string(id) + ": " + old + " -> " + to_string(role) +
                 ", pool " + to_string(from) + " -> " + i->pool);
          },
          [done](caf::error& e) { done(std::move(e)); });
}

// Once per window: the monitor's figures, then (with role switching) at
// most one flip by the report's policy.
void on_window(self_ptr self) {
  auto& st = self->state;
  if (!st.opts.monitor) return;
  self->request(st.opts.monitor, std::chrono::seconds(5), report_atom::value)
      .then(
          [self](monitor_report& r) {
            auto& st = self->state;
            st.windows.clear();
            for (const auto& w : r.instances) st.windows[w.instance] = w;
            if (!st.opts.pd || !st.opts.role_switching) return;
            const double now =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - st.born).count();
            pd_targets t{st.opts.ttft_target_ms, st.opts.tpot_target_ms};
            for (const auto& f : decide_flips(pd_loads(st), {r.unmet_prefills, r.prefills}, t,
                                              st.opts.pd_cfg, now, st.flip_mem))
              apply_role(self, f.instance, f.to, f.why, [](caf::expected<std::string> r) {
                if (!r) spdlog::warn("router: role switch failed");
              });
          },
          [](caf::error&) {});
}

// Drops the instances `which` names from the registry: marked down first
// (drains waiting on them end), then gone with their stats and windows.
template <class Which>
void forget_instances(self_ptr self, Which which) {
  auto& st = self->state;
  for (auto& i : st.instances)
    if (which(i) && i.state != "down") i.state = "down";
  settle_drains(self);
  for (auto it = st.instances.begin(); it != st.instances.end();) {
    if (!which(*it)) {
      ++it;
      continue;
    }
    if (it->actor) self->demonitor(it->actor.address());
    st.last.erase(it->id);
    st.own_left.erase(it->id);
    st.windows.erase(it->id);
    st.modeled.erase(it->id);
    st.encode_images.erase(it->id);
    spdlog::info("router: instance {} on {} leaves the service", it->id, it->node);
    it = st.instances.erase(it);
  }
}

// Queued requests of full instances to instances with room (this
// service's requests only: each service rebalances its own).
void rebalance(self_ptr self) {
  auto& st = self->state;
  if (st.opts.max_seqs < 1 || st.opts.pd || st.opts.dp_group) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - st.rebalanced < st.opts.rebalance_every) return;
  st.rebalanced = now;
  std::vector<rebalance_load> loads;
  for (const auto& i : st.instances) {
    auto s = st.last.find(i.id);
    if (s == st.last.end()) continue;
    loads.push_back({i.id, i.state == "serving", s->second.waiting, s->second.running});
  }
  for (const auto& m : plan_rebalance(loads, st.opts.max_seqs)) {
    auto* i = find(st, m.from);
    if (!i) continue;
    self->request(i->actor, std::chrono::seconds(5), relocate_atom::value, self->node(), m.count)
        .then(
            [self, id = m.from](int32_t asked) {
              if (asked == 0) return;
              self->state.rebalanced_requests += uint64_t(asked);
              spdlog::info("router: {} queued requests of full instance {} asked to move", asked,
                           id);
            },
            [](caf::error&) {});
  }
}

void poll(self_ptr self) {
  for (const auto& i : self->state.instances) {
    if (i.state == "down") continue;
    const uint64_t id = i.id;
    // A draining instance that a drain waits on: this service's sequences
    // there are counted and (drain = migrate) asked to move; other services
    // sharing the instance keep theirs, and the drain waits for its own.
    const bool awaited = std::any_of(self->state.drains.begin(), self->state.drains.end(),
                                     [id](const drain_wait& d) { return d.instance == id; });
    if (i.state == "draining" && awaited) {
      auto then = [self, id](int32_t held) {
        if (!find(self->state, id)) return;
        self->state.own_left[id] = held;
        settle_drains(self);
      };
      if (self->state.opts.drain_migrates)
        self->request(i.actor, std::chrono::seconds(5), relocate_atom::value, self->node())
            .then(then, [](caf::error&) {});
      else  // a count of them only
        self->request(i.actor, std::chrono::seconds(5), relocate_atom::value, self->node(),
                      int32_t{0})
            .then(then, [](caf::error&) {});
    }
    self->request(i.actor, std::chrono::seconds(5), stats_atom::value)
        .then(
            [self, id](instance_stats& s) {
              auto& st = self->state;
              if (!find(st, id)) return;  // forgotten (its node left) since the poll
              learn_steps(st, id, s.recent_steps);
              st.last[id] = std::move(s);
              st.last_at[id] = std::chrono::steady_clock::now();
              // An X->Y instance whose X work is done is promoted to Y.
              if (auto* i = find(st, id)) {
                const pd_load l = load_of(st, *i);
                set_pool(*i, settle(l.pool, l));
              }
              settle_drains(self);
            },
            [](caf::error&) {});
  }
}

}  // namespace

// An instance for a new request, by the service's policy or its dp_group;
// `prefer` (0: none), where serving and taking prefill, instead: the
// instance that encoded the request's images (hybrid EPD's fused stages).
caf::result<placement_reply> place_request(self_ptr self, int32_t prompt_tokens,
                                           std::vector<uint64_t>& hashes, uint64_t prefer) {
  auto& st = self->state;
  if (st.opts.dp_group && !st.opts.pd) {
    // Draining and lost instances are the router's to know.
    std::vector<uint64_t> unavailable;
    for (const auto& i : st.instances)
      if (i.state != "serving") unavailable.push_back(i.id);
    return self->delegate(st.opts.dp_group, dp_admit_atom::value, prompt_tokens,
                          std::move(unavailable));
  }
  placement_reply r;
  const auto page_hashes = hashes;
  if (st.opts.pd) {
    auto c = place_prefill(prompt_tokens, pd_loads(st), st.ttft,
                           {st.opts.ttft_target_ms, st.opts.tpot_target_ms});
    if (const auto* p = find(st, prefer);
        p && p->state == "serving" && takes_prefill(pool_of_instance(*p))) {
      c.instance = p->id;
      c.predicted_ttft_ms = predict_ttft_ms(load_of(st, *p), prompt_tokens, st.ttft);
      c.why = "prefills where its images were encoded (hybrid EPD)";
      c.meets_target = st.opts.ttft_target_ms <= 0 || c.predicted_ttft_ms <= st.opts.ttft_target_ms;
    }
    if (st.opts.monitor) self->send(st.opts.monitor, placed_atom::value, c.meets_target);
    if (c.instance == 0)
      return caf::make_error(caf::sec::invalid_argument,
                             "no instance takes prefill (" + c.why + ")");
    const auto* i = find(st, c.instance);
    r = placement_reply{c.instance,          i->actor, c.why, !takes_decode(pool_of_instance(*i)),
                        c.predicted_ttft_ms, {},       {}};
  } else {
    placement_request req{prompt_tokens, std::move(hashes), st.opts.page_size};
    auto p = place(st.opts.policy, req, snapshots(st), st.cursor, st.model, st.opts.ttft_target_ms);
    if (const auto* i = find(st, prefer); i && i->state == "serving")
      p = {i->id, "prefills where its images were encoded (hybrid EPD)"};
    if (p.instance == 0)
      return caf::make_error(caf::sec::invalid_argument, "no instance is serving (" + p.why + ")");
    const auto* i = find(st, p.instance);
    r = placement_reply{
        i->id, i->actor, p.why, false, predict_ttft_ms(load_of(st, *i), prompt_tokens, st.ttft),
        {},    {}};
  }
  add_kv_links(st, r, page_hashes, prompt_tokens, st.copy_cursor);
  // Count the placement now, so a burst does not all go to the
  // instance the last snapshot showed idle.
  ++st.last[r.instance].waiting;
  st.last[r.instance].queued_prefill_tokens += prompt_tokens;
  st.last[r.instance].queued_prefills.push_back(prompt_tokens);
  return r;
}

router_actor spawn_router(caf::actor_system& sys, std::vector<router_instance> instances,
                          router_options opts) {
  return sys.spawn([instances = std::move(instances),
                    opts](self_ptr self) mutable -> router_actor::behavior_type {
    auto& st = self->state;
    st.opts = opts;
    st.ttft.step_rows = opts.max_batch_tokens;
    st.ttft.chunk_rows = opts.chunk_size;
    st.instances = std::move(instances);
    for (auto& i : st.instances) {
      self->monitor(i.actor);
      st.next_id = std::max(st.next_id, i.id + 1);
      set_pool(i, initial_pool(st.opts, i.id));
    }
    // An instance died: it is down in the registry; pending drains are checked.
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
    if (st.opts.monitor) self->delayed_send(self, st.opts.window, window_atom::value);
    return {
        // Its own timer: the monitor's window, and role switching.
        [self](window_atom) {
          on_window(self);
          self->delayed_send(self, self->state.opts.window, window_atom::value);
        },
        // Where a disaggregated request decodes after its prefill.
        [self](place_decode_atom, uint64_t prefill_instance,
               int32_t context) -> caf::result<placement_reply> {
          auto& st = self->state;
          auto d = place_decode(prefill_instance, context, pd_loads(st), st.opts.pd_cfg,
                                {st.opts.ttft_target_ms, st.opts.tpot_target_ms});
          auto* i = find(st, d.instance);
          if (!i || i->state != "serving")
            return caf::make_error(caf::sec::invalid_argument,
                                   "no instance can decode (" + d.why + ")");
          // Count it now, as place does.
          count_decode(st, d.instance, context, d.transfer);
          placement_reply r;
          r.instance = d.instance;
          r.actor = i->actor;
          r.why = d.why;
          add_kv_links(st, r, {}, context, st.copy_cursor);
          return r;
        },
        // The instance takes the role now; replies with what changed once it agreed.
        [self](set_role_atom, uint64_t id, const std::string& role) -> caf::result<std::string> {
          auto r = parse_role(role);
          if (!r)
            return caf::make_error(
                caf::sec::invalid_argument,
                "role: '" + role + "' is not a role (prefill, decode, mixed, encode)");
          // An E instance runs an encoder and no language work: only where
          // E-P-D places encodes and the instance has an encoder.
          if (*r == instance_role::encode &&
              (self->state.opts.epd != epd_strategy::e_p_d || !self->state.opts.encoders.count(id)))
            return caf::make_error(caf::sec::invalid_argument,
                                   "role: encode is for an instance with a vision encoder in a "
                                   "service with --epd E-P-D");
          auto rp = self->make_response_promise<std::string>();
          apply_role(self, id, *r, "asked for", [rp](caf::expected<std::string> x) mutable {
            if (x)
              rp.deliver(*x);
            else
              rp.deliver(std::move(x.error()));
          });
          return rp;
        },
        // Its own timer: refresh the instances' load snapshots.
        [self](tick_atom) {
          rebalance(self);
          poll(self);
          self->delayed_send(self, self->state.opts.poll, tick_atom::value);
        },
        // An instance for a new request, by the service's policy or its dp_group.
        [self](place_atom, int32_t prompt_tokens, std::vector<uint64_t>& hashes,
               uint64_t prefer) -> caf::result<placement_reply> {
          return place_request(self, prompt_tokens, hashes, prefer);
        },
        // Hybrid EPD: whose encoder takes a request's images.
        [self](place_encode_atom, int32_t images) -> caf::result<uint64_t, std::string> {
          auto& st = self->state;
          if (!st.opts.epd)
            return caf::make_error(caf::sec::invalid_argument, "the service has no hybrid EPD");
          std::vector<encode_load> loads;
          for (const auto& i : st.instances) {
            const pd_load l = load_of(st, i);
            const auto q = st.encode_images.find(i.id);
            loads.push_back({i.id, l.serving, st.opts.encoders.count(i.id) > 0, l.pool,
                             q != st.encode_images.end() ? q->second : 0, l.load_score()});
          }
          auto c = place_encode(*st.opts.epd, loads, st.encode_cursor);
          if (c.instance == 0) return caf::make_error(caf::sec::invalid_argument, c.why);
          st.encode_images[c.instance] += std::max(0, images);
          return {c.instance, std::move(c.why)};
        },
        [self](encoded_atom, uint64_t id, int32_t images) {
          auto it = self->state.encode_images.find(id);
          if (it != self->state.encode_images.end()) it->second = std::max(0, it->second - images);
        },
        // That instance, if serving, for a migration.
        [self](lookup_atom, uint64_t id) -> caf::result<placement_reply> {
          auto* i = find(self->state, id);
          if (!i)
            return caf::make_error(caf::sec::invalid_argument, "no instance " + std::to_string(id));
          if (i->state != "serving")
            return caf::make_error(caf::sec::invalid_argument,
                                   "instance " + std::to_string(id) + " is " + i->state);
          placement_reply r{i->id, i->actor, "asked for", false, 0, {}, {}};
          add_kv_links(self->state, r, {}, 0, self->state.copy_cursor);
          return r;
        },
        // Every instance with its node, role and state.
        [self](registry_atom) { return self->state.instances; },
        // A node link's news.
        [self](nodes_atom, link_status& s) { self->state.nodes[s.address] = std::move(s); },
        // The node left the service: forget it and its instances.
        [self](forget_node_atom, const std::string& node) {
          auto& st = self->state;
          st.nodes.erase(node);
          forget_instances(self, [&](const router_instance& i) { return i.node == node; });
          for (auto it = st.slot_ids.begin(); it != st.slot_ids.end();)
            it = it->first.first == node ? st.slot_ids.erase(it) : std::next(it);
        },
        // One instance stopped on purpose: forget it (its slot may come back).
        [self](forget_instance_atom, uint64_t id) {
          auto& st = self->state;
          forget_instances(self, [id](const router_instance& i) { return i.id == id; });
          for (auto it = st.slot_ids.begin(); it != st.slot_ids.end();)
            it = it->second == id ? st.slot_ids.erase(it) : std::next(it);
        },
        // Every node's last status.
        [self](nodes_atom) {
          std::vector<link_status> out;
          for (const auto& [addr, s] : self->state.nodes) out.push_back(s);
          return out;
        },
        // A node link's instances, up now: fresh ids, or their old ones if back.
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
            if (!back) set_pool(*ri, initial_pool(st.opts, id));
            ri->node = node;
            ri->actor = h.actor;
            ri->store = h.store;
            ri->device = h.device;
            ri->state = "serving";
            st.last.erase(id);
            self->monitor(h.actor);
            spdlog::info("router: instance {} on {} {}", id, node, back ? "is back" : "joined");
            // A node's instances join the data-parallel group as they come.
            if (st.opts.dp_group) self->send(st.opts.dp_group, dp_add_atom::value, *ri);
            if (st.opts.experts && h.device)
              self->send(st.opts.experts, expert_add_atom::value, h.device);
            ids.push_back(id);
          }
          poll(self);
          return ids;
        },
        // Fault injection: kill the instance as a crash would.
        [self](kill_instance_atom, uint64_t id) -> caf::result<uint64_t> {
          auto* i = find(self->state, id);
          if (!i)
            return caf::make_error(caf::sec::invalid_argument, "no instance " + std::to_string(id));
          spdlog::warn("router: killing instance {} (fault injection)", id);
          self->send_exit(i->actor, caf::exit_reason::kill);
          return id;
        },
        // Move layers, or a group of KV heads' attention, between two
        // stages of an instance's pipelined device.
        [self](move_layers_atom a, uint64_t id, int32_t from, int32_t to,
               int32_t layers) -> caf::result<std::string> {
          return move_on_stages(self, a, "layer", id, from, to, layers);
        },
        [self](move_heads_atom a, uint64_t id, int32_t from, int32_t to,
               int32_t heads) -> caf::result<std::string> {
          return move_on_stages(self, a, "KV head", id, from, to, heads);
        },
        // Change a live setting (the schema's live trait): the placement
        // policy here, an [engine] key on every instance.  The value is
        // checked once, here, by its key.
        [self](set_atom, const std::string& name,
               const std::string& value) -> caf::result<std::string> {
          auto& st = self->state;
          const setting_key* k = find_setting(name);
          if (!k || !k->has(trait::live) || k->alias())
            return caf::make_error(
                caf::sec::invalid_argument,
                "set: '" + name + "' cannot change live (" + keys_with(trait::live) + " can)");
          settings checked;
          if (auto why = k->set(checked, value); !why.empty())
            return caf::make_error(caf::sec::invalid_argument, "set " + k->key + ": " + why);
          if (k->name() == "service.router") {
            const std::string old = to_string(st.opts.policy);
            st.opts.policy = *parse_placement_policy(value);
            spdlog::info("router: placement policy {} -> {}", old, value);
            return "router: " + old + " -> " + value;
          }
          if (k->where != applies::engine || k->type != value_type::integer)
            return caf::make_error(caf::sec::invalid_argument,
                                   "set " + k->key + ": live, but nothing here applies it");
          const std::string key = k->key;
          const int32_t v = k->get(checked).get<int32_t>();
          // The TTFT predictor composes steps of these limits.
          if (k->name() == "engine.max_batch_tokens") st.ttft.step_rows = v;
          if (k->name() == "engine.chunk_size") st.ttft.chunk_rows = v;
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
        // No new placements on it; replies once it holds no sequence.
        [self](drain_instance_atom, uint64_t id) -> caf::result<uint64_t> {
          auto& st = self->state;
          auto* i = find(st, id);
          if (!i)
            return caf::make_error(caf::sec::invalid_argument, "no instance " + std::to_string(id));
          if (i->state == "serving") i->state = "draining";
          st.own_left.erase(id);  // a late answer of an earlier drain counts for nothing
          auto rp = self->make_response_promise<uint64_t>();
          st.drains.push_back({id, rp});
          poll(self);
          return rp;
        },
    };
  });
}

}  // namespace troupe
