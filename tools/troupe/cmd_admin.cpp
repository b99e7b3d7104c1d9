// troupe client admin: inspects and steers a running `troupe serve` through
// its admin endpoint (service.admin_port; JSON over ZeroMQ, docs/security.md):
//   troupe client --server EP admin [--admin HOST:PORT] kv|instances|requests|config
//   troupe client --server EP admin [--admin HOST:PORT] trace ID | cancel ID
// Without --admin the server is pinged over the client protocol: its Pong
// names the admin port, on the host of EP.  The secret comes from
// --secret-file, else $TROUPE_ADMIN_SECRET, else the file the server left
// for its user in the run folder.  --json prints one JSON object (or
// array) instead of text.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tools/troupe/admin_link.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

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
  admin_target target;
  std::string action;
  uint64_t id = 0;
  uint64_t instance = 0;
  std::string key, value;               // set
  int32_t from = 0, to = 0, count = 0;  // layers, heads: two stages and how many move
  const std::string* server = nullptr;
  const bool* json = nullptr;
};

int run_admin(admin_flags& f) {
  f.target.server = *f.server;
  admin_link link(f.target);
  nlohmann::json args = nlohmann::json::object();
  if (f.action == "trace" || f.action == "cancel" || f.action == "migrate" || f.action == "preempt")
    args["id"] = f.id;
  if (f.action == "set") {
    args["key"] = f.key;
    args["value"] = f.value;
  }
  if (f.action == "migrate" || f.action == "drain" || f.action == "kill" || f.action == "role")
    args["instance"] = f.instance;
  if (f.action == "role") args["role"] = f.value;
  if (f.action == "layers" || f.action == "heads") {
    args["instance"] = f.instance;
    args["from"] = f.from;
    args["to"] = f.to;
    args[f.action] = f.count;  // the count's key is the command's name
  }
  if (!link.connect()) {
    std::fprintf(stderr, "error: admin %s: %s\n", f.action.c_str(), link.why().c_str());
    return 1;
  }
  // A layer move answers once done: loading two stages, copying their KV.
  auto reply = link.call(f.action, args,
                         f.action == "layers" || f.action == "heads" ? k_layer_move_wait_ms : 0);
  if (!reply.ok) {
    if (reply.code == "timeout" || reply.code == "protocol" || reply.code == "unreachable")
      std::fprintf(stderr, "error: admin %s: %s\n", f.action.c_str(), reply.message.c_str());
    else
      std::fprintf(stderr, "error: admin %s: %s: %s\n", f.action.c_str(), reply.code.c_str(),
                   reply.message.c_str());
    return 1;
  }
  const nlohmann::json& out = reply.result;
  if (*f.json)
    std::cout << out.dump() << std::endl;
  else
    print_text(out);
  if (f.action == "cancel" && out.value("cancelled", 0) == 0) {
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
  auto* cmd =
      client.add_subcommand("admin", "inspect and steer the server through its admin endpoint");
  cmd->fallthrough();
  cmd->require_subcommand(1);
  add_admin_target_flags(*cmd, f->target, 10000);
  auto action = [&](const char* name, const char* help, bool with_id, bool with_instance = false) {
    auto* sub = cmd->add_subcommand(name, help);
    sub->fallthrough();
    if (with_id)
      sub->add_option("id", f->id, "the client's request id")->required()->check(whole_number());
    if (with_instance)
      sub->add_option("instance", f->instance, "an instance id (admin instances)")
          ->required()
          ->check(whole_number());
    sub->callback([f, name] {
      f->action = name;
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  };
  action("kv", "KV pages: total, free, used, reusable; prefix hit rate", false);
  action("instances", "the instances with their queues and counters", false);
  action("nodes", "the cluster's nodes: address, state, resources, instances", false);
  action("requests", "the requests in flight", false);
  action("config",
         "the settings the server started with, every key of troupe settings (secrets as a "
         "count), and its config file",
         false);
  action("trace", "one request's trace (the newest with this id)", true);
  action("cancel", "cancel the in-flight requests with this id", true);
  action("migrate", "move an in-flight request to another instance (KV and all)", true, true);
  action("drain", "stop placing on an instance; returns once it holds no request", false, true);
  action("kill", "fault injection: kill an instance as a crash would (its requests recover)", false,
         true);
  action("preempt", "preempt a running request (it runs again when its turn comes)", true);
  action("steps",
         "each instance's last forward passes: rows, decode rows, attention work, ms, host ms "
         "after the result, the device's idle ms before the pass",
         false);
  action("monitor",
         "the monitor's window: per instance TTFT, TPOT, token interval, busy share; the TTFT "
         "predictor's error",
         false);
  action("dp",
         "the data-parallel group: KV tokens per replica, the gap over the mean, sequences "
         "moved, lockstep rounds and waits",
         false);
  action("experts",
         "the expert controller: tokens per expert and expert device per layer, the placement, "
         "swaps, busy time per expert device",
         false);
  {
    auto* sub = cmd->add_subcommand(
        "role",
        "give an instance a new role (prefill, decode, mixed, encode): it takes new work of that "
        "role at "
        "once and finishes its old work; exits 0 once the instance took it");
    sub->fallthrough();
    sub->add_option("instance", f->instance, "an instance id (admin instances)")->required();
    sub->add_option("role", f->value, "prefill, decode, mixed or encode (hybrid EPD's E pool)")
        ->required()
        ->check(CLI::IsMember({"prefill", "decode", "mixed", "encode"}));
    sub->callback([f] {
      f->action = "role";
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    auto* sub = cmd->add_subcommand(
        "layers",
        "move layers, weights and KV, between two neighbouring stages of an instance's pipelined "
        "device (engine.pipeline_parallel), between two steps; exits 0 once moved");
    sub->fallthrough();
    sub->add_option("instance", f->instance, "an instance id (admin instances)")->required();
    sub->add_option("from", f->from, "the stage that gives layers (0 is the first)")
        ->required()
        ->check(CLI::Range(0, 65535));
    sub->add_option("to", f->to, "its neighbour that takes them (from - 1 or from + 1)")
        ->required()
        ->check(CLI::Range(0, 65535));
    sub->add_option("layers", f->count, "how many layers move")
        ->required()
        ->check(CLI::Range(1, 65535));
    sub->callback([f] {
      f->action = "layers";
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    auto* sub = cmd->add_subcommand(
        "heads",
        "move the attention of a group of KV heads of one stage's layers, with their KV pages, to "
        "another stage of an instance's pipelined device (no weights move), between two steps; "
        "0 heads brings the group home; exits 0 once moved");
    sub->fallthrough();
    sub->add_option("instance", f->instance, "an instance id (admin instances)")->required();
    sub->add_option("from", f->from, "the stage whose KV heads move (0 is the first)")
        ->required()
        ->check(CLI::Range(0, 65535));
    sub->add_option("to", f->to, "the stage that takes their attention")
        ->required()
        ->check(CLI::Range(0, 65535));
    sub->add_option("heads", f->count, "how many KV heads move (its last ones); 0: home again")
        ->required()
        ->check(CLI::Range(0, 65535));
    sub->callback([f] {
      f->action = "heads";
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    auto* sub = cmd->add_subcommand(
        "set", "change a setting live (engine keys on every instance): " + keys_with(trait::live));
    sub->fallthrough();
    sub->add_option("key", f->key, "a live key of troupe settings: " + keys_with(trait::live))
        ->required();
    sub->add_option("value", f->value, "the new value")->required();
    sub->callback([f] {
      f->action = "set";
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  return cmd;
}

}  // namespace troupe::cli
