// troupe client admin: inspects a running `troupe serve` through its admin
// actor (service.admin_port), reached with CAF's middleman:
//   troupe client --server EP admin [--admin HOST:PORT] kv|instances|requests
//   troupe client --server EP admin [--admin HOST:PORT] trace ID | cancel ID
// Without --admin the server is pinged over the client protocol: its Pong
// names the admin port, on the host of EP.  --json prints one JSON object
// (or array) instead of text.
#include <caf/io/all.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "actors/admin.hpp"
#include "tools/client/client.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

nlohmann::json to_json(const pool_stats& k) {
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

nlohmann::json to_json(const instance_info& i) {
  const auto& s = i.stats;
  return {{"name", i.name},
          {"waiting", s.waiting},
          {"running", s.running},
          {"swapped", s.swapped},
          {"steps", s.steps},
          {"step_ms", s.step_ms},
          {"prefill_tokens", s.prefill_tokens},
          {"decode_tokens", s.decode_tokens},
          {"cached_tokens", s.cached_tokens},
          {"admitted", s.admitted},
          {"finished", s.finished},
          {"aborted", s.aborted},
          {"preempted_recompute", s.preempted_recompute},
          {"preempted_swap", s.preempted_swap},
          {"kv", to_json(s.kv)},
          {"kv_check", s.kv_check}};
}

nlohmann::json to_json(const request_trace& t) {
  return {{"request_id", t.request_id},
          {"client", t.client},
          {"finish", t.finish},
          {"stop_matched", t.stop_matched},
          {"error", t.error},
          {"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", t.completion_tokens},
          {"cached_tokens", t.cached_tokens},
          {"preemptions", t.preemptions},
          {"priority", t.priority},
          {"class", t.cls == seq_class::offline ? "offline" : "online"},
          {"queue_ms", t.queue_ms},
          {"ttft_ms", t.ttft_ms},
          {"tpot_ms", t.tpot_ms},
          {"total_ms", t.total_ms}};
}

// Text output: the JSON, one "key: value" a line (nested objects indented).
void print_text(const nlohmann::json& j, const std::string& indent = "") {
  if (j.is_array()) {
    if (j.empty()) std::printf("%s(none)\n", indent.c_str());
    for (const auto& el : j) {
      print_text(el, indent);
      std::printf("\n");
    }
    return;
  }
  for (const auto& [k, v] : j.items()) {
    if (v.is_object()) {
      std::printf("%s%s:\n", indent.c_str(), k.c_str());
      print_text(v, indent + "  ");
    } else {
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      std::printf("%s%s: %s\n", indent.c_str(), k.c_str(), s.c_str());
    }
  }
}

struct admin_flags {
  std::string admin;  // HOST:PORT; empty: ask the server
  std::string action;
  uint64_t id = 0;
  int timeout_ms = 10000;
  const std::string* server = nullptr;
  const bool* json = nullptr;
};

struct admin_endpoint {
  std::string host;
  int port = 0;
};

// --admin HOST:PORT as given.
admin_endpoint parse_admin(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::invalid_argument(
        "--admin: give the server's admin endpoint as HOST:PORT "
        "(service.admin_port of troupe serve), got '" +
        text + "'");
  admin_endpoint a{text.substr(0, colon), 0};
  try {
    a.port = std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (a.port <= 0 || a.port > 65535)
    throw std::invalid_argument("--admin: bad port in '" + text + "'");
  return a;
}

// The admin endpoint the server names in its Pong; nullopt (said why on
// stderr) when it does not answer or has none.
std::optional<admin_endpoint> ask_server(const std::string& server, int timeout_ms) {
  client::connection conn(server);
  auto pong = conn.pong(std::chrono::milliseconds(timeout_ms));
  if (!pong) {
    std::fprintf(stderr,
                 "error: admin: no answer from %s within %d ms (is troupe serve running?)\n",
                 server.c_str(), timeout_ms);
    return std::nullopt;
  }
  if (pong->admin_port() == 0 || pong->admin_port() > 65535) {
    std::fprintf(stderr,
                 "error: admin: the server at %s has no admin endpoint (started with "
                 "--admin-port -1); start it with --admin-port 0 or a port, or give --admin "
                 "HOST:PORT\n",
                 server.c_str());
    return std::nullopt;
  }
  return admin_endpoint{client::endpoint_host(server), static_cast<int>(pong->admin_port())};
}

int run_admin(const admin_flags& f) {
  std::optional<admin_endpoint> at;
  if (!f.admin.empty())
    at = parse_admin(f.admin);
  else if (!(at = ask_server(*f.server, f.timeout_ms)))
    return 1;
  const std::string where = at->host + ":" + std::to_string(at->port);
  actor_env env(true);
  auto h =
      env.sys->middleman().remote_actor<admin_actor>(at->host, static_cast<uint16_t>(at->port));
  if (!h) {
    std::fprintf(stderr, "error: cannot reach the admin actor at %s: %s\n", where.c_str(),
                 env.sys->render(h.error()).c_str());
    return 1;
  }
  caf::scoped_actor self{*env.sys};
  const auto timeout = std::chrono::milliseconds(f.timeout_ms);
  nlohmann::json out;
  caf::error err;
  auto on_error = [&](caf::error& e) { err = std::move(e); };
  if (f.action == "kv") {
    self->request(*h, timeout, kv_atom::value)
        .receive([&](pool_stats& k) { out = to_json(k); }, on_error);
  } else if (f.action == "instances") {
    self->request(*h, timeout, instances_atom::value)
        .receive(
            [&](std::vector<instance_info>& v) {
              out = nlohmann::json::array();
              for (const auto& i : v) out.push_back(to_json(i));
            },
            on_error);
  } else if (f.action == "requests") {
    self->request(*h, timeout, requests_atom::value)
        .receive(
            [&](std::vector<inflight_request>& v) {
              out = nlohmann::json::array();
              for (const auto& r : v)
                out.push_back(
                    {{"request_id", r.request_id}, {"client", r.client}, {"age_ms", r.age_ms}});
            },
            on_error);
  } else if (f.action == "trace") {
    self->request(*h, timeout, trace_atom::value, f.id)
        .receive([&](request_trace& t) { out = to_json(t); }, on_error);
  } else if (f.action == "cancel") {
    self->request(*h, timeout, cancel_atom::value, f.id)
        .receive(
            [&](int32_t n) {
              out = {{"request_id", f.id}, {"cancelled", n}};
            },
            on_error);
  }
  if (err) {
    std::fprintf(stderr, "error: admin %s: %s\n", f.action.c_str(), env.sys->render(err).c_str());
    return 1;
  }
  if (*f.json)
    std::cout << out.dump() << std::endl;
  else
    print_text(out);
  if (f.action == "cancel" && out["cancelled"].get<int32_t>() == 0) {
    std::fprintf(stderr, "error: no request with id %llu in flight\n",
                 static_cast<unsigned long long>(f.id));
    return 1;
  }
  return 0;
}

}  // namespace

CLI::App* add_client_admin(CLI::App& client, const std::string& server, const bool& json) {
  auto f = std::make_shared<admin_flags>();
  f->server = &server;
  f->json = &json;
  auto* cmd = client.add_subcommand("admin", "inspect the server through its admin actor");
  cmd->fallthrough();
  cmd->require_subcommand(1);
  cmd->add_option("--admin", f->admin,
                  "the server's admin endpoint HOST:PORT (troupe serve --admin-port); default: "
                  "the port the server names in its Pong, on the host of --server");
  cmd->add_option("--admin-timeout-ms", f->timeout_ms,
                  "give up after this long (the ping, then each admin call)")
      ->default_val(10000)
      ->check(CLI::Range(1, 1 << 30));
  auto action = [&](const char* name, const char* help, bool with_id) {
    auto* sub = cmd->add_subcommand(name, help);
    sub->fallthrough();
    if (with_id) sub->add_option("id", f->id, "the client's request id")->required();
    sub->callback([f, name] {
      f->action = name;
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  };
  action("kv", "KV pages: total, free, used, reusable; prefix hit rate", false);
  action("instances", "the instances with their queues and counters", false);
  action("requests", "the requests in flight", false);
  action("trace", "one request's trace (the newest with this id)", true);
  action("cancel", "cancel the in-flight requests with this id", true);
  return cmd;
}

}  // namespace troupe::cli
