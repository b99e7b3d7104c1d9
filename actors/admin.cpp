#include "actors/admin.hpp"

#include <iterator>
#include <memory>
#include <set>

#include "actors/relay.hpp"

namespace troupe {

namespace {

struct admin_state {
  admin_state() = default;  // not an aggregate: CAF would build it from the self pointer
  gateway_actor gateway;
  router_actor router;
  node_set_actor nodes;  // the service's nodes
  monitor_actor monitor;
  admin_groups groups;
  static inline const char* name = "admin";
};

using self_ptr = admin_actor::stateful_pointer<admin_state>;

// Asks the router for the instances, then each for its stats; `done` gets
// them all, in the router's order, or the router's error.  An instance that
// is down, or does not answer within 3 s, is listed with empty stats.
template <class Done>
void ask_instances(self_ptr self, Done done) {
  self->request(self->state.router, std::chrono::seconds(10), registry_atom::value)
      .then(
          [self, done](std::vector<router_instance>& reg) mutable {
            struct gather {
              std::vector<instance_info> out;
              size_t left = 0;
            };
            auto g = std::make_shared<gather>();
            g->left = reg.size();
            for (const auto& r : reg)
              g->out.push_back({instance_name(r.id), r.id, r.node, r.role, r.state, {}, r.pool});
            if (reg.empty()) return done(std::move(g->out), caf::error{});
            for (size_t i = 0; i < reg.size(); ++i) {
              auto finish_one = [g, done]() mutable {
                if (--g->left == 0) done(std::move(g->out), caf::error{});
              };
              // A lost remote instance does not answer at all (its proxy
              // drops messages): ask only the live ones, briefly.
              if (reg[i].state == "down") {
                finish_one();
                continue;
              }
              self->request(reg[i].actor, std::chrono::seconds(3), stats_atom::value)
                  .then(
                      [g, i, finish_one](instance_stats& s) mutable {
                        g->out[i].stats = std::move(s);
                        finish_one();
                      },
                      [finish_one](caf::error&) mutable { finish_one(); });
            }
          },
          [done](caf::error& e) mutable { done({}, std::move(e)); });
}

admin_actor::behavior_type admin_behavior(self_ptr self, gateway_actor gateway, router_actor router,
                                          node_set_actor nodes, monitor_actor monitor,
                                          admin_groups groups) {
  self->state.monitor = std::move(monitor);
  self->state.groups = std::move(groups);
  self->state.gateway = std::move(gateway);
  self->state.router = std::move(router);
  self->state.nodes = std::move(nodes);
  return {
      // Every instance with its stats, in the router's order.
      [self](instances_atom) {
        auto rp = self->make_response_promise<std::vector<instance_info>>();
        ask_instances(self, [rp](std::vector<instance_info> v, caf::error e) mutable {
          if (e)
            rp.deliver(std::move(e));
          else
            rp.deliver(std::move(v));
        });
        return rp;
      },
      // The cluster's nodes as the service's links know them (the router's list).
      [self](nodes_atom) {
        return relay<std::vector<link_status>>(self, self->state.router, std::chrono::seconds(10),
                                               nodes_atom::value);
      },
      // The requests in flight, from the gateway.
      [self](requests_atom) {
        return relay<std::vector<inflight_request>>(self, self->state.gateway,
                                                    std::chrono::seconds(10), requests_atom::value);
      },
      // A request's trace: the newest finished one, else its live one.
      [self](trace_atom, uint64_t id) {
        auto rp = self->make_response_promise<request_trace>();
        auto gw = self->state.gateway;
        self->request(gw, std::chrono::seconds(10), traces_atom::value)
            .then(
                [self, rp, gw, id](std::vector<request_trace>& ts) mutable {
                  for (auto it = ts.rbegin(); it != ts.rend(); ++it)
                    if (it->request_id == id) {
                      rp.deliver(std::move(*it));
                      return;
                    }
                  // Not finished: the live trace from its request actor.
                  self->request(gw, std::chrono::seconds(10), trace_atom::value, id)
                      .then(
                          [rp](request_trace& t) mutable { rp.deliver(std::move(t)); },
                          [rp, id](caf::error&) mutable {
                            rp.deliver(caf::make_error(caf::sec::runtime_error,
                                                       "no request with id " + std::to_string(id) +
                                                           " in flight or in the trace history"));
                          });
                },
                [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      // The KV pages of all instances, summed.
      [self](kv_atom) {
        auto rp = self->make_response_promise<pool_stats>();
        ask_instances(self, [rp](std::vector<instance_info> v, caf::error e) mutable {
          if (e) {
            rp.deliver(std::move(e));
            return;
          }
          pool_stats sum;
          for (const auto& i : v) sum += i.stats.kv;
          rp.deliver(sum);
        });
        return rp;
      },
      // Cancel the in-flight requests with this id (the gateway finds them).
      [self](cancel_atom, uint64_t id) {
        return relay<int32_t>(self, self->state.gateway, std::chrono::seconds(10),
                              cancel_atom::value, id);
      },
      // Move an in-flight request to that instance (the gateway finds it).
      [self](migrate_atom, uint64_t id, uint64_t instance) {
        return relay<uint64_t>(self, self->state.gateway, std::chrono::seconds(60),
                               migrate_atom::value, id, instance);
      },
      // Fault injection: the router kills the instance.
      [self](kill_instance_atom, uint64_t instance) {
        return relay<uint64_t>(self, self->state.router, std::chrono::seconds(10),
                               kill_instance_atom::value, instance);
      },
      // Move layers between two stages of an instance's pipelined device.
      [self](move_layers_atom, uint64_t instance, int32_t from, int32_t to, int32_t layers) {
        return relay<std::string>(self, self->state.router, std::chrono::minutes(10),
                                  move_layers_atom::value, instance, from, to, layers);
      },
      // Move a group of KV heads' attention between two stages.
      [self](move_heads_atom, uint64_t instance, int32_t from, int32_t to, int32_t heads) {
        return relay<std::string>(self, self->state.router, std::chrono::minutes(10),
                                  move_heads_atom::value, instance, from, to, heads);
      },
      // Preempt an in-flight request's sequence now (the shell, tests).
      [self](preempt_atom, uint64_t id) {
        return relay<int32_t>(self, self->state.gateway, std::chrono::seconds(10),
                              preempt_atom::value, id);
      },
      // The monitor's window so far; an error when the service has no monitor.
      [self](peek_atom) -> caf::result<monitor_report> {
        if (!self->state.monitor)
          return caf::make_error(caf::sec::invalid_argument, "this service has no monitor");
        return relay<monitor_report>(self, self->state.monitor, std::chrono::seconds(10),
                                     peek_atom::value);
      },
      // The dp_group's balance, moves and rounds; an error without a group.
      [self](dp_status_atom) -> caf::result<dp_group_status> {
        if (!self->state.groups.dp)
          return caf::make_error(caf::sec::invalid_argument,
                                 "this service has no dp group (service.dp_group)");
        return relay<dp_group_status>(self, self->state.groups.dp, std::chrono::seconds(10),
                                      dp_status_atom::value);
      },
      // The expert controller's loads, placement and swaps; an error without one.
      [self](expert_status_atom) -> caf::result<expert_status> {
        if (!self->state.groups.experts)
          return caf::make_error(caf::sec::invalid_argument,
                                 "this service has no expert controller (a mixture-of-experts "
                                 "model with engine.expert_devices >= 2 has one)");
        return relay<expert_status>(self, self->state.groups.experts, std::chrono::seconds(10),
                                    expert_status_atom::value);
      },
      // An instance's new role, switched by the router; replies with what changed.
      [self](set_role_atom, uint64_t id, const std::string& role) {
        return relay<std::string>(self, self->state.router, std::chrono::seconds(10),
                                  set_role_atom::value, id, role);
      },
      // Change a setting live: the router's policy, or every instance's limit.
      [self](set_atom, const std::string& key, const std::string& value) {
        return relay<std::string>(self, self->state.router, std::chrono::seconds(10),
                                  set_atom::value, key, value);
      },
      // The node hosts n more instances (its link asks); replies with their ids.
      [self](grow_atom, const std::string& node, int32_t n) -> caf::result<std::vector<uint64_t>> {
        if (!self->state.nodes)
          return caf::make_error(caf::sec::invalid_argument,
                                 "no node " + node + " in this service (nodes lists them)");
        return relay<std::vector<uint64_t>>(self, self->state.nodes, std::chrono::minutes(10),
                                            grow_atom::value, node, n);
      },
      // A node joins by hand; replies with its state once its link settled.
      [self](node_add_atom, const std::string& node, int32_t n) -> caf::result<link_status> {
        if (!self->state.nodes)
          return caf::make_error(
              caf::sec::invalid_argument,
              "this service takes no nodes: it was started without --nodes or --registry");
        auto rp = self->make_response_promise<link_status>();
        auto nodes = self->state.nodes;
        self->request(nodes, std::chrono::seconds(10), node_add_atom::value, node, n,
                      std::vector<instance_spec>{})
            .then(
                [self, rp, nodes, node](link_status&) mutable {
                  self->request(nodes, std::chrono::minutes(11), settled_atom::value, node)
                      .then(
                          [self, rp, nodes, node](link_status& s) mutable {
                            if (s.state == "up") {
                              rp.deliver(std::move(s));
                              return;
                            }
                            // Not up: it leaves again (no link retrying a
                            // mistyped address for ever), and the reply says why.
                            const std::string why =
                                "node " + node + " " + s.state + ": " + s.error + " (not added)";
                            self->request(nodes, std::chrono::minutes(1), node_remove_atom::value,
                                          node)
                                .then(
                                    [rp, why](std::string&) mutable {
                                      rp.deliver(caf::make_error(caf::sec::runtime_error, why));
                                    },
                                    [rp, why](caf::error&) mutable {
                                      rp.deliver(caf::make_error(caf::sec::runtime_error, why));
                                    });
                          },
                          [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
                },
                [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      // A node leaves: drained, released, forgotten; replies with what was done.
      [self](node_remove_atom, const std::string& node) -> caf::result<std::string> {
        if (!self->state.nodes)
          return caf::make_error(caf::sec::invalid_argument,
                                 "no node " + node + " in this service (nodes lists them)");
        return relay<std::string>(self, self->state.nodes, std::chrono::minutes(10),
                                  node_remove_atom::value, node);
      },
      // Drain an instance; the reply waits, with no timeout, until it is empty.
      [self](drain_instance_atom, uint64_t instance) {
        return relay<uint64_t>(self, self->state.router, caf::infinite, drain_instance_atom::value,
                               instance);
      },
  };
}

}  // namespace

admin_actor spawn_admin(caf::actor_system& sys, gateway_actor gateway, router_actor router,
                        node_set_actor nodes, monitor_actor monitor, admin_groups groups) {
  return sys.spawn(admin_behavior, std::move(gateway), std::move(router), std::move(nodes),
                   std::move(monitor), std::move(groups));
}

namespace {

// The request metrics: name and help, declared and recorded alike.
struct metric_name {
  const char* name;
  const char* help;
};
constexpr metric_name requests_total{"troupe_requests_total", "Finished requests by finish reason"};
constexpr metric_name counters[] = {
    {"troupe_prompt_tokens_total", "Prompt tokens of finished requests"},
    {"troupe_generation_tokens_total", "Tokens generated for finished requests"},
    {"troupe_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache"},
    {"troupe_request_preemptions_total", "Preemptions seen by finished requests"},
    {"troupe_migrations_total", "Live migrations of finished requests"},
    {"troupe_migrated_bytes_total", "KV blob bytes the migrations of finished requests moved"},
    {"troupe_recoveries_total",
     "Times finished requests were placed again after losing their instance"},
    {"troupe_pd_handoffs_total",
     "Finished requests whose KV moved from a prefill to a decode instance"},
    {"troupe_pd_transfer_bytes_total", "KV bytes the prefill/decode handoffs moved"},
    {"troupe_slo_missed_total", "Finished requests that missed a TTFT or TPOT target"}};
constexpr metric_name histograms[] = {
    {"troupe_queue_time_seconds", "Arrival until the instance took the sequence"},
    {"troupe_request_duration_seconds", "Arrival until finish"},
    {"troupe_time_to_first_token_seconds", "Arrival until the first token"},
    {"troupe_time_per_output_token_seconds", "Mean time per output token after the first"}};

}  // namespace

void declare_request_metrics(metrics_registry& m) {
  m.declare_counter(requests_total.name, requests_total.help, true);
  for (const auto& c : counters) m.declare_counter(c.name, c.help, false);
  for (const auto& h : histograms) m.declare_histogram(h.name, h.help, latency_buckets());
}

void record_request(metrics_registry& m, const request_trace& t) {
  m.counter_add(requests_total.name, requests_total.help,
                {{"finish", t.finish.empty() ? "unknown" : t.finish}});
  const double counts[] = {
      static_cast<double>(t.prompt_tokens),  static_cast<double>(t.completion_tokens),
      static_cast<double>(t.cached_tokens),  static_cast<double>(t.preemptions),
      static_cast<double>(t.migrations),     static_cast<double>(t.migrated_bytes),
      static_cast<double>(t.recoveries),     t.decode_instance != 0 ? 1.0 : 0.0,
      static_cast<double>(t.transfer_bytes), t.slo_met ? 0.0 : 1.0};
  static_assert(sizeof(counts) / sizeof(counts[0]) == std::size(counters));
  for (size_t i = 0; i < std::size(counters); ++i)
    m.counter_add(counters[i].name, counters[i].help, {}, counts[i]);
  if (t.finish == "rejected") return;
  const auto& b = latency_buckets();
  auto observe = [&](const metric_name& h, double ms) { m.observe(h.name, h.help, b, ms / 1000); };
  observe(histograms[0], t.queue_ms);
  observe(histograms[1], t.total_ms);
  if (t.completion_tokens > 0) observe(histograms[2], t.ttft_ms);
  if (t.completion_tokens > 1) observe(histograms[3], t.tpot_ms);
}

std::set<std::string> record_service(metrics_registry& m,
                                     const std::vector<instance_info>& instances,
                                     size_t in_flight) {
  m.gauge_set("troupe_requests_in_flight", "Requests the gateway holds", {},
              static_cast<double>(in_flight));
  // An instance that left (retired, its node removed) or a node whose
  // store is gone leaves no series behind, and a role switch no old role.
  std::set<std::string> names, nodes;
  for (const auto& i : instances) {
    names.insert(i.name);
    if (!i.stats.store.tiers.empty()) nodes.insert(i.node);
  }
  m.keep_only("instance", names);
  m.keep_only("node", nodes);
  std::vector<metric_labels> roles;
  for (const auto& i : instances) {
    const auto& s = i.stats;
    const metric_labels l{{"instance", i.name}};
    auto state = [&](const char* st, double v) {
      m.gauge_set("troupe_sequences", "Sequences in an instance by state",
                  {{"instance", i.name}, {"state", st}}, v);
    };
    state("waiting", s.waiting);
    state("running", s.running);
    state("swapped", s.swapped);
    m.gauge_set("troupe_queue_length", "Sequences waiting in an instance", l, s.waiting);
    m.gauge_set("troupe_kv_pages_total", "KV pages of the arena", l, s.kv.total);
    m.gauge_set("troupe_kv_pages_free", "KV pages free", l, s.kv.free);
    m.gauge_set("troupe_kv_pages_used", "KV pages held by sequences", l, s.kv.used());
    m.gauge_set("troupe_kv_pages_reusable", "KV pages kept for prefix reuse", l, s.kv.reusable);
    m.gauge_set("troupe_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache", l,
                s.kv.hit_rate());
    m.counter_set("troupe_preemptions_total", "Sequences preempted",
                  {{"instance", i.name}, {"mode", "recompute"}},
                  static_cast<double>(s.preempted_recompute));
    m.counter_set("troupe_preemptions_total", "Sequences preempted",
                  {{"instance", i.name}, {"mode", "swap"}}, static_cast<double>(s.preempted_swap));
    m.counter_set("troupe_steps_total", "Engine steps", l, static_cast<double>(s.steps));
    m.counter_set("troupe_step_seconds_total", "Wall time of engine steps on the device", l,
                  s.step_ms / 1000);
    m.counter_set("troupe_steps_overlapped_total",
                  "Step overlap: steps sent while the device ran the one before", l,
                  static_cast<double>(s.overlapped_steps));
    m.counter_set("troupe_device_idle_seconds_total",
                  "The device's idle time between steps (what step overlap hides)", l,
                  s.device_idle_ms / 1000);
    m.counter_set("troupe_prefill_tokens_total", "Rows computed as prefill", l,
                  static_cast<double>(s.prefill_tokens));
    m.counter_set("troupe_decode_tokens_total", "Rows computed as decode", l,
                  static_cast<double>(s.decode_tokens));
    m.counter_set("troupe_spec_draft_tokens_total",
                  "Speculative decoding: n-gram draft tokens verified", l,
                  static_cast<double>(s.draft_tokens));
    m.counter_set("troupe_spec_accepted_tokens_total",
                  "Speculative decoding: draft tokens accepted (each saves a step)", l,
                  static_cast<double>(s.accepted_tokens));
    m.counter_set("troupe_length_predicted_total",
                  "Finished sequences whose output length was predicted (SLO ordering)", l,
                  static_cast<double>(s.length_predicted));
    m.counter_set("troupe_length_predicted_right_total",
                  "Of those, predicted in the right length bucket", l,
                  static_cast<double>(s.length_right));
    m.counter_set("troupe_static_batches_total", "Static batches formed (--batching static)", l,
                  static_cast<double>(s.static_batches));
    m.counter_set("troupe_sequences_exported_total", "Sequences sent away as KV blobs", l,
                  static_cast<double>(s.exported));
    m.counter_set("troupe_sequences_imported_total", "Sequences taken in from KV blobs", l,
                  static_cast<double>(s.imported));
    roles.push_back({{"instance", i.name}, {"role", i.role}, {"pool", i.pool}});
    m.gauge_set("troupe_instance_role", "1 for an instance's role and router pool", roles.back(),
                1);
    m.counter_set("troupe_kv_spilled_pages_total",
                  "KV store: evicted prefix pages offered to the process's store", l,
                  static_cast<double>(s.spilled_pages));
    m.counter_set("troupe_kv_loaded_pages_total",
                  "KV store: prefix pages loaded back into the arena from a tier", l,
                  static_cast<double>(s.loaded_pages));
  }
  m.keep_series("troupe_instance_role", roles);
  // Each process's KV store once (its instances each carry it).
  std::set<std::string> seen;
  for (const auto& i : instances) {
    const auto& k = i.stats.store;
    if (k.tiers.empty() || !seen.insert(i.node).second) continue;
    for (const auto& t : k.tiers) {
      const metric_labels l{{"node", i.node}, {"tier", t.name}};
      m.gauge_set("troupe_kv_tier_bytes", "KV store: bytes a tier holds", l,
                  static_cast<double>(t.bytes));
      m.gauge_set("troupe_kv_tier_pages", "KV store: pages a tier holds", l,
                  static_cast<double>(t.pages));
      m.counter_set("troupe_kv_tier_hits_total", "KV store: pages a tier served", l,
                    static_cast<double>(t.hits));
      m.counter_set("troupe_kv_tier_misses_total",
                    "KV store: lookups that ended at a page a tier lacked", l,
                    static_cast<double>(t.misses));
      m.counter_set("troupe_kv_tier_bytes_in_total", "KV store: page bytes a tier stored", l,
                    static_cast<double>(t.bytes_in));
      m.counter_set("troupe_kv_tier_bytes_out_total", "KV store: page bytes a tier served", l,
                    static_cast<double>(t.bytes_out));
      m.counter_set("troupe_kv_tier_evictions_total", "KV store: pages a tier dropped for room", l,
                    static_cast<double>(t.evictions));
    }
  }
  return names;
}

void record_monitor(metrics_registry& m, const monitor_report& r,
                    const std::set<std::string>* live) {
  m.gauge_set("troupe_ttft_prediction_error",
              "Mean absolute percentage error of the router's TTFT predictions (share)", {},
              r.ttft_mape);
  for (const auto& w : r.instances) {
    const std::string name = instance_name(w.instance);
    if (live && live->count(name) == 0) continue;  // gone: the monitor's window still holds it
    const metric_labels l{{"instance", name}};
    m.gauge_set("troupe_token_interval_seconds",
                "Mean step time of steps with decode rows, last window", l,
                w.token_interval_ms / 1000);
    m.gauge_set("troupe_device_busy_ratio", "Share of the last window the device computed", l,
                w.busy);
  }
}

std::string hex_bytes(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace troupe
