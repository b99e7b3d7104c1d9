#include "actors/admin_endpoint.hpp"
#include "messages/atoms.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "actors/admin_groups.hpp"
#include "actors/error_text.hpp"
#include "net/admin_request.hpp"
#include "net/secret.hpp"

namespace troupe {

namespace {

using json = nlohmann::json;

json to_json(const pool_stats& k) {
  return {{"page_size", k.page_size},
          {"total_pages", k.total},
          {"free_pages", k.free},
          {"used_pages", k.used()},
          {"allocated_pages", k.allocated},
          {"mapped_pages", k.mapped},
          {"reusable_pages", k.reusable},
          {"sequences", k.sequences},
          {"prefix_queries", k.prefix_queries},
          {"prefix_query_tokens", k.prefix_query_tokens},
          {"prefix_hit_tokens", k.prefix_hit_tokens},
          {"prefix_hit_rate", k.hit_rate()},
          {"evictions", k.evictions},
          {"alloc_failures", k.alloc_failures}};
}

json to_json(const tier_stats& t) {
  return {{"tier", t.name},         {"budget_bytes", t.budget}, {"bytes", t.bytes},
          {"pages", t.pages},       {"hits", t.hits},           {"misses", t.misses},
          {"bytes_in", t.bytes_in}, {"bytes_out", t.bytes_out}, {"evictions", t.evictions},
          {"dropped", t.dropped},   {"read_ms", t.read_ms}};
}

// The device arenas added up (as before), with every process's KV store
// once (its instances each carry the same one) under "stores".
json kv_json(const std::vector<instance_info>& v) {
  pool_stats sum;
  for (const auto& i : v) sum += i.stats.kv;
  json out = to_json(sum);
  json stores = json::array();
  std::set<std::string> seen;
  for (const auto& i : v) {
    const auto& k = i.stats.store;
    if (k.tiers.empty() || !seen.insert(i.node).second) continue;
    json tiers = json::array();
    for (const auto& t : k.tiers) tiers.push_back(to_json(t));
    stores.push_back({{"node", i.node},
                      {"tiers", tiers},
                      {"offered_pages", k.offered_pages},
                      {"fetches", k.fetches},
                      {"fetched_pages", k.fetched_pages},
                      {"swaps", k.swaps},
                      {"swap_bytes", k.swap_bytes},
                      {"swaps_kept", k.swaps_kept},
                      {"check", k.check}});
  }
  uint64_t spilled = 0, loaded = 0, copied = 0, pulled = 0;
  for (const auto& i : v) {
    spilled += i.stats.spilled_pages;
    loaded += i.stats.loaded_pages;
    copied += i.stats.copied_pages;
    pulled += i.stats.pulled_pages;
  }
  out["spilled_pages"] = spilled;
  out["loaded_pages"] = loaded;
  out["copied_pages"] = copied;
  out["pulled_pages"] = pulled;
  out["stores"] = stores;
  return out;
}

json to_json(const instance_info& i) {
  const auto& s = i.stats;
  // Pulls per link: what the router's pull rule weighs.
  auto links = json::array();
  for (const auto& l : s.pull_links)
    links.push_back({{"store", l.store}, {"pages", l.pages}, {"ms", l.ms}});
  return {{"name", i.name},
          {"id", i.id},
          {"node", i.node},
          {"role", i.role},
          {"pool", i.pool},
          {"state", i.state},
          {"decoding", s.decoding},
          {"running_tokens", s.running_tokens},
          {"used_pages", s.kv.used()},
          {"queued_prefill_tokens", s.queued_prefill_tokens},
          {"exported", s.exported},
          {"imported", s.imported},
          {"waiting", s.waiting},
          {"running", s.running},
          {"swapped", s.swapped},
          {"steps", s.steps},
          {"step_ms", s.step_ms},
          {"overlapped_steps", s.overlapped_steps},
          {"device_idle_ms", s.device_idle_ms},
          {"prefill_tokens", s.prefill_tokens},
          {"decode_tokens", s.decode_tokens},
          {"draft_tokens", s.draft_tokens},
          {"accepted_tokens", s.accepted_tokens},
          {"length_predicted", s.length_predicted},
          {"length_right", s.length_right},
          {"static_batches", s.static_batches},
          {"cached_tokens", s.cached_tokens},
          {"admitted", s.admitted},
          {"finished", s.finished},
          {"aborted", s.aborted},
          {"preempted_recompute", s.preempted_recompute},
          {"preempted_swap", s.preempted_swap},
          {"spilled_pages", s.spilled_pages},
          {"loaded_pages", s.loaded_pages},
          {"tier_load_ms", s.tier_load_ms},
          {"copied_pages", s.copied_pages},
          {"pulled_pages", s.pulled_pages},
          {"pull_links", std::move(links)},
          {"kv", to_json(s.kv)},
          {"kv_check", s.kv_check}};
}

// A node as `nodes` and `node_add` show it.
json node_json(const link_status& n) {
  return {{"address", n.address},
          {"state", n.state},
          {"error", n.error},
          {"attempts", n.attempts},
          {"instances", n.instances},
          {"cores", n.resources.cores},
          {"mem_total", n.resources.mem_total},
          {"mem_available", n.resources.mem_available},
          {"opencl_devices", n.resources.opencl_devices},
          {"peers", n.resources.peers},
          {"hosted", n.resources.instances}};
}

json to_json(const request_trace& t) {
  return {{"request_id", t.request_id},
          {"client", t.client},
          {"finish", t.finish},
          {"state", t.state.empty() ? "finished" : t.state},
          {"stop_matched", t.stop_matched},
          {"error", t.error},
          {"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", t.completion_tokens},
          {"cached_tokens", t.cached_tokens},
          {"tier_tokens", t.tier_tokens},
          {"preemptions", t.preemptions},
          {"priority", t.priority},
          {"class", to_string(t.cls)},
          {"encode_ms", t.encode_ms},
          {"encode_instance", t.encode_instance},
          {"encode_placement", t.encode_placement},
          {"queue_ms", t.queue_ms},
          {"ttft_ms", t.ttft_ms},
          {"tpot_ms", t.tpot_ms},
          {"total_ms", t.total_ms},
          {"instances", t.instances},
          {"placement", t.placement},
          {"migrations", t.migrations},
          {"migrated_bytes", t.migrated_bytes},
          {"migration_ms", t.migration_ms},
          {"recoveries", t.recoveries},
          {"prefill_instance", t.prefill_instance},
          {"decode_instance", t.decode_instance},
          {"transfer_bytes", t.transfer_bytes},
          {"transfer_ms", t.transfer_ms},
          {"decode_placement", t.decode_placement},
          {"predicted_ttft_ms", t.predicted_ttft_ms},
          {"slo_ttft_ms", t.slo_ttft_ms},
          {"draft_tokens", t.draft_tokens},
          {"accepted_tokens", t.accepted_tokens},
          {"slo_tpot_ms", t.slo_tpot_ms},
          {"slo_met", t.slo_met}};
}

json failure(const std::string& code, const std::string& message) {
  return {{"ok", false}, {"error", {{"code", code}, {"message", message}}}};
}

json success(json result) {
  return {{"ok", true}, {"result", std::move(result)}};
}

struct zmq_socket_box {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::router};
  ~zmq_socket_box() { sock.close(); }
};

struct endpoint_state {
  admin_actor admin;
  admin_endpoint_options opts;
  std::shared_ptr<zmq_socket_box> zmq;
  static inline const char* name = "admin_endpoint";
};

using self_ptr = caf::stateful_actor<endpoint_state>*;

// Where a reply goes: the ROUTER identity, and whether the request came in
// REQ's envelope (an empty delimiter frame before the body), which a REQ
// socket needs back or it drops the reply.  DEALER clients (`troupe client
// admin`, the shell) send none.
struct peer_route {
  std::string id;
  bool delimited = false;
};

void reply(self_ptr self, const peer_route& peer, const json& j) {
  // Bytes that are not UTF-8 (an error quoting a value) become U+FFFD:
  // the strict dump throws, and here that would end this actor.
  const std::string body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  try {
    auto& sock = self->state.zmq->sock;
    sock.send(zmq::buffer(peer.id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (peer.delimited)
      sock.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    sock.send(zmq::buffer(body), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The peer is gone; nothing to tell.
  }
}

// Asks the admin actor within `timeout` and replies with what it says.
template <class Result, class Convert, class... Ts>
void call_within(self_ptr self, const peer_route& peer, std::chrono::milliseconds timeout,
                 Convert convert, Ts... args) {
  self->request(self->state.admin, timeout, args...)
      .then([self, peer, convert](Result& result) { reply(self, peer, success(convert(result))); },
            [self, peer](caf::error& e) {
              reply(self, peer, failure("failed", error_text(self->system(), e)));
            });
}

// Within the endpoint's call_timeout.
template <class Result, class Convert, class... Ts>
void call(self_ptr self, const peer_route& peer, Convert convert, Ts... args) {
  call_within<Result>(self, peer, self->state.opts.call_timeout, convert, args...);
}

// The commands that wait for a model to load or for requests to move away
// answer when done, within 11 minutes.
template <class Result, class Convert, class... Ts>
void call_long(self_ptr self, const peer_route& peer, Convert convert, Ts... args) {
  call_within<Result>(self, peer, std::chrono::minutes(11), convert, args...);
}

void on_request(self_ptr self, const peer_route& peer, const std::string& address,
                const std::string& body) {
  const auto& opts = self->state.opts;
  auto parsed = parse_admin_request(body);
  if (auto* refused = std::get_if<admin_refusal>(&parsed))
    return reply(self, peer, failure(refused->code, refused->message));
  const auto& req = std::get<admin_request>(parsed);
  const std::string& command = req.command;
  const std::string& secret = req.secret;
  const bool control = !opts.control_secret.empty() && secrets_equal(secret, opts.control_secret);
  const bool read =
      control || (!opts.read_secret.empty() && secrets_equal(secret, opts.read_secret));
  if (!read) {
    spdlog::warn("admin: refused {} from {}: {}", command.empty() ? "a request" : command,
                 address.empty() ? "an unknown peer" : address,
                 secret.empty() ? "no secret" : "wrong secret");
    return reply(self, peer,
                 failure("unauthenticated",
                         "admin needs the server's secret (--secret-file FILE or "
                         "TROUPE_ADMIN_SECRET; the same user's tools find it by themselves)"));
  }
  if (!admin_command_is_read_only(command) && !control) {
    spdlog::warn("admin: refused {} from {}: read-only secret", command, address);
    return reply(self, peer,
                 failure("forbidden", "'" + command +
                                          "' needs the control secret; this one is "
                                          "read-only"));
  }
  if (!req.argument_error.empty())
    return reply(self, peer, failure("bad_request", req.argument_error));
  const uint64_t id = req.id, instance = req.instance;
  if (command == "config") return reply(self, peer, success(opts.config));
  if (command == "kv")
    return call<std::vector<instance_info>>(
        self, peer, [](std::vector<instance_info>& v) { return kv_json(v); },
        instances_atom::value);
  if (command == "instances")
    return call<std::vector<instance_info>>(
        self, peer,
        [](std::vector<instance_info>& v) {
          json out = json::array();
          for (const auto& i : v) out.push_back(to_json(i));
          return out;
        },
        instances_atom::value);
  if (command == "nodes")
    return call<std::vector<link_status>>(
        self, peer,
        [](std::vector<link_status>& v) {
          json out = json::array();
          for (const auto& n : v) out.push_back(node_json(n));
          return out;
        },
        nodes_atom::value);
  if (command == "requests")
    return call<std::vector<inflight_request>>(
        self, peer,
        [](std::vector<inflight_request>& v) {
          json out = json::array();
          for (const auto& r : v) {
            const auto& t = r.live;
            out.push_back({{"id", r.request_id},
                           {"request_id", r.request_id},
                           {"client", r.client},
                           {"age_ms", r.age_ms},
                           {"state", t.state.empty() ? "unknown" : t.state},
                           {"class", to_string(t.cls)},
                           {"instance", t.instances.empty() ? 0 : t.instances.back()},
                           {"instances", t.instances},
                           {"prompt_tokens", t.prompt_tokens},
                           {"completion_tokens", t.completion_tokens},
                           {"ttft_ms", t.ttft_ms},
                           {"migrations", t.migrations},
                           {"recoveries", t.recoveries}});
          }
          return out;
        },
        requests_atom::value);
  if (command == "trace")
    return call<request_trace>(
        self, peer, [](request_trace& t) { return to_json(t); }, trace_atom::value, id);
  if (command == "cancel")
    return call<int32_t>(
        self, peer,
        [id](int32_t n) {
          return json{{"request_id", id}, {"cancelled", n}};
        },
        cancel_atom::value, id);
  if (command == "migrate")
    return call<uint64_t>(
        self, peer,
        [id](uint64_t to) {
          return json{{"request_id", id}, {"instance", to}};
        },
        migrate_atom::value, id, instance);
  if (command == "drain")
    return call_long<uint64_t>(
        self, peer,
        [](uint64_t i) {
          return json{{"instance", i}, {"drained", true}};
        },
        drain_instance_atom::value, instance);
  if (command == "preempt")
    return call<int32_t>(
        self, peer,
        [id](int32_t) {
          return json{{"request_id", id}, {"preempted", true}};
        },
        preempt_atom::value, id);
  if (command == "set")
    return call<std::string>(
        self, peer,
        [](std::string& what) {
          return json{{"changed", what}};
        },
        set_atom::value, req.key, req.value);
  if (command == "node_add")
    return call_long<link_status>(
        self, peer, [](link_status& n) { return node_json(n); }, node_add_atom::value, req.node,
        req.count);
  if (command == "node_remove")
    return call_long<std::string>(
        self, peer,
        [node = req.node](std::string& what) {
          return json{{"node", node}, {"removed", what}};
        },
        node_remove_atom::value, req.node);
  if (command == "spawn")
    return call_long<std::vector<uint64_t>>(
        self, peer,
        [node = req.node](std::vector<uint64_t>& ids) {
          return json{{"node", node}, {"instances", ids}};
        },
        grow_atom::value, req.node, req.count);
  if (command == "steps")
    return call<std::vector<instance_info>>(
        self, peer,
        [](std::vector<instance_info>& v) {
          json out = json::array();
          for (const auto& i : v) {
            json steps = json::array();
            for (const auto& t : i.stats.recent_steps)
              steps.push_back({t.rows, t.decode_rows, t.context, t.ms, t.host_ms, t.idle_ms});
            out.push_back({{"id", i.id}, {"role", i.role}, {"steps", steps}});
          }
          return out;
        },
        instances_atom::value);
  if (command == "monitor")
    return call<monitor_report>(
        self, peer,
        [](monitor_report& r) {
          json per = json::array();
          for (const auto& w : r.instances)
            per.push_back({{"instance", w.instance},
                           {"ttft_ms", w.ttft_ms},
                           {"tpot_ms", w.tpot_ms},
                           {"token_interval_ms", w.token_interval_ms},
                           {"busy", w.busy},
                           {"ttft_samples", w.ttft_samples},
                           {"steps", w.steps}});
          return json{{"instances", per},
                      {"prefills", r.prefills},
                      {"unmet_prefills", r.unmet_prefills},
                      {"ttft_prediction_error", r.ttft_mape},
                      {"ttft_predictions", r.ttft_predictions}};
        },
        peek_atom::value);
  if (command == "role")
    return call<std::string>(
        self, peer,
        [instance, role = req.role](std::string& what) {
          return json{{"instance", instance}, {"role", role}, {"changed", what}};
        },
        set_role_atom::value, instance, req.role);
  if (command == "dp")
    return call<dp_group_status>(
        self, peer, [](dp_group_status& d) { return to_json(d); }, dp_status_atom::value);
  if (command == "experts")
    return call<expert_status>(
        self, peer, [](expert_status& e) { return to_json(e); }, expert_status_atom::value);
  if (command == "layers")
    return call_long<std::string>(
        self, peer,
        [instance](std::string& what) {
          return json{{"instance", instance}, {"moved", what}};
        },
        move_layers_atom::value, instance, req.from, req.to, req.layers);
  if (command == "heads")
    return call_long<std::string>(
        self, peer,
        [instance](std::string& what) {
          return json{{"instance", instance}, {"moved", what}};
        },
        move_heads_atom::value, instance, req.from, req.to, req.heads);
  if (command == "kill")
    return call<uint64_t>(
        self, peer,
        [](uint64_t i) {
          return json{{"instance", i}, {"killed", true}};
        },
        kill_instance_atom::value, instance);
  reply(
      self, peer,
      failure("unknown_command",
              "unknown command '" + command +
                  "' (instances, nodes, requests, trace, kv, config, cancel, migrate, drain, kill, "
                  "preempt, set, spawn, node_add, node_remove, role, layers, heads, monitor, "
                  "steps, dp, "
                  "experts)"));
}

void poll_once(self_ptr self) {
  auto& sock = self->state.zmq->sock;
  zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::milliseconds(self->state.opts.poll_ms));
  for (int i = 0; i < 64; ++i) {
    std::vector<zmq::message_t> parts;
    std::optional<size_t> n;
    try {
      n = zmq::recv_multipart(sock, std::back_inserter(parts), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("admin: receive failed: {}", e.what());
      break;
    }
    if (!n) break;
    // [identity, body] from a DEALER; [identity, "", body] from a REQ.
    const bool delimited = parts.size() == 3 && parts[1].size() == 0;
    if (parts.size() != 2 && !delimited) {
      if (!parts.empty())  // (a REQ peer's delimiter returned, or it drops the reply)
        reply(self, {parts[0].to_string(), parts.size() > 2 && parts[1].size() == 0},
              failure("bad_request", "one frame per request"));
      continue;
    }
    const zmq::message_t& frame = parts.back();
    // zmq_msg_gets, not cppzmq's gets(), which throws where the property
    // is missing: a ZMTP 1.0 peer (six bytes: 01 00 03 00 7b 7d) carries
    // no metadata, and the throw, outside the guard below, ended the actor
    // and the admin port with it (found by a hostile-client probe).
    const char* addr = zmq_msg_gets(frame.handle(), "Peer-Address");
    const peer_route peer{parts[0].to_string(), delimited};
    // Nothing a request holds may end this loop: an escaped exception would
    // end the actor, and with it the operator's shell, drain and migration.
    try {
      on_request(self, peer, addr ? addr : "", frame.to_string());
    } catch (const std::exception& e) {
      spdlog::error("admin: a request from {} failed: {}", addr ? addr : "an unknown peer",
                    e.what());
      reply(self, peer, failure("internal", std::string("the request failed: ") + e.what()));
    }
  }
}

}  // namespace

admin_endpoint_handle spawn_admin_endpoint(caf::actor_system& sys, admin_actor admin,
                                           admin_endpoint_options opts) {
  auto box = std::make_shared<zmq_socket_box>();
  auto& s = box->sock;
  s.set(zmq::sockopt::maxmsgsize, opts.max_message_bytes);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::router_mandatory, 0);
  const std::string ep =
      "tcp://" + opts.host + ":" + (opts.port == 0 ? std::string("*") : std::to_string(opts.port));
  try {
    s.bind(ep);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("service.admin_port: cannot listen on " + opts.host + ":" +
                             std::to_string(opts.port) + ": " + e.what());
  }
  const std::string bound = s.get(zmq::sockopt::last_endpoint);
  admin_endpoint_handle h;
  h.port = std::stoi(bound.substr(bound.rfind(':') + 1));
  h.actor = sys.spawn<caf::detached>(
      [box](caf::stateful_actor<endpoint_state>* self, admin_actor a,
            admin_endpoint_options o) -> caf::behavior {
        self->state.admin = std::move(a);
        self->state.opts = std::move(o);
        self->state.zmq = box;
        self->send(self, poll_atom::value);
        // Its own loop: serve the socket, then the mailbox, then again.
        return {[self](poll_atom) {
          poll_once(self);
          self->send(self, poll_atom::value);
        }};
      },
      std::move(admin), std::move(opts));
  return h;
}

}  // namespace troupe
