// troupe serve: device, instance and gateway in one process, serving the
// client protocol on the --listen endpoints until SIGINT/SIGTERM, then
// draining within a grace period.  Settings come from a TOML file
// (--config; [engine] and [service]) and the command line, which wins;
// every key has a command-line flag, and a bad value stops the start with
// the key's name.
#include <pthread.h>
#include <signal.h>

#include <toml++/toml.h>
#include <algorithm>
#include <atomic>
#include <caf/io/all.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include "actors/admin_endpoint.hpp"
#include "actors/device.hpp"
#include "actors/dp_group.hpp"
#include "actors/expert_controller.hpp"
#include "actors/gateway.hpp"
#include "actors/instance.hpp"
#include "actors/monitor.hpp"
#include "actors/node.hpp"
#include "actors/node_link.hpp"
#include "actors/router.hpp"
#include "net/secret.hpp"
#include "runtime/engine/page_pool.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tools/troupe/common.hpp"
#include "tools/troupe/http_front.hpp"
#include "tools/troupe/serve_admin.hpp"

namespace troupe::cli {

namespace {

// Whether the router has an instance that takes requests now (GET
// /health): asked from the HTTP front's thread, so with a scoped actor and
// a short wait; no answer counts as no.
bool any_instance_serving(caf::actor_system& sys, const router_actor& router) {
  caf::scoped_actor self{sys};
  bool serving = false;
  self->request(router, std::chrono::seconds(2), registry_atom::value)
      .receive(
          [&](const std::vector<router_instance>& all) {
            for (const auto& i : all) serving = serving || i.state == "serving";
          },
          [](caf::error&) {});
  return serving;
}

// One [[cluster.node]] table: a node, how many instances it runs for this
// service, and engine settings that differ there.
struct node_entry {
  std::string address;
  int instances = 1;
  std::map<std::string, int64_t> overrides;  // engine key -> value (kv_f32: 0/1)
};

struct serve_settings {
  engine_flags engine;
  cluster_flags cluster;
  std::vector<std::string> nodes;  // --nodes: one instance each
  std::vector<node_entry> node_entries;
  std::string drain = "migrate";
  int max_batch_tokens = 256;
  int max_seqs = 64;
  int chunk_size = 128;
  std::string preemption = "recompute";
  bool prefix_caching = true;
  std::vector<std::string> listen;
  int max_frame_bytes = 1 << 20;
  int max_inflight = 1024;
  int max_queue = 256;
  int default_max_tokens = 256;
  double grace_s = 10;
  int poll_ms = 2;
  int trace_history = 1024;
  int client_backlog = 10000;
  int local_instances = -1;  // -1: 1 without nodes, 0 with
  std::string router = "least-load";
  double ttft_target_ms = 1000;
  // Disaggregation, role switching, co-location and SLOs (issue 11).
  bool pd = false;
  std::vector<std::string> roles;
  bool role_switching = false;
  double tpot_target_ms = 0;
  double offline_ttft_ms = 0;
  double offline_tpot_ms = 0;
  bool colocate = false;
  int step_history = 16;
  int draft_tokens = 0;
  bool int8_dot = true;
  bool graph = false;
  bool flash_attention = false;
  bool fuse_layers = true;
  bool fuse_step = true;
  bool pipeline = true;
  bool step_overlap = step_overlap_default();
  int window_ms = 1000;
  pd_config pd_cfg;
  int admin_port = 0;    // 0: a port the OS picks; -1: no admin endpoint
  int metrics_port = 0;  // 0: no metrics endpoint
  int http_port = 0;     // 0: no OpenAI-compatible HTTP API
  std::string http_host = "127.0.0.1";
  std::vector<std::string> api_keys;  // the HTTP API's keys (api_key, api_key_file)
  std::string api_key_file;
  std::vector<std::string> cors_origins;
  std::string admin_host = "127.0.0.1";
  std::string admin_secret_file;       // control secret; empty: made at start
  std::string admin_read_secret_file;  // read-only secret; empty: made at start
  // Data-parallel group and expert controller (issue 15).
  int instance_cores = 0;  // > 0: local instance i on slice i of this many cores
  bool dp_group = false;
  dp_group_config dp;
  std::string dp_lockstep = "auto";
  expert_controller_config experts;
};

using setter = std::function<std::string(const std::string&)>;  // "" or why not
using getter = std::function<nlohmann::json()>;                 // the value now

// How a key reads and writes its setting.
struct key_access {
  setter set;
  getter get;
};

// One config key: where it lives in the file, its flag, and how a text
// value becomes the setting (with its checks).
struct key_spec {
  std::string section, key, help;
  bool list = false;
  setter set;
  getter get;  // for the effective config (admin config)
  std::string cli_value;
  std::vector<std::string> cli_values;
  CLI::Option* opt = nullptr;
  std::string flag_name;  // when not --key
  // An old name kept working: setting it says so on stderr and names this
  // key; it is left out of --help and of the effective config.
  std::string deprecated_for;
  std::string flag() const {
    if (!flag_name.empty()) return flag_name;
    std::string f = "--" + key;
    for (auto& c : f)
      if (c == '_') c = '-';
    return f;
  }
  std::string name() const { return section + "." + key; }
};

key_access int_key(int& dst, long lo, long hi) {
  return {[&dst, lo, hi](const std::string& v) -> std::string {
            long x = 0;
            auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
            if (ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi)
              return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + v + "'";
            dst = static_cast<int>(x);
            return {};
          },
          [&dst] { return nlohmann::json(dst); }};
}

key_access real_key(double& dst, double lo, double hi) {
  return {[&dst, lo, hi](const std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x) || x < lo || x > hi)
              return "must be a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + v + "'";
            dst = x;
            return {};
          },
          [&dst] { return nlohmann::json(dst); }};
}

key_access bool_key(bool& dst) {
  return {[&dst](const std::string& v) -> std::string {
            if (v == "true" || v == "1" || v == "yes")
              dst = true;
            else if (v == "false" || v == "0" || v == "no")
              dst = false;
            else
              return "must be true or false, got '" + v + "'";
            return {};
          },
          [&dst] { return nlohmann::json(dst); }};
}

key_access string_key(std::string& dst, std::vector<std::string> allowed = {}) {
  return {[&dst, allowed](const std::string& v) -> std::string {
            if (v.empty()) return "must not be empty";
            if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
              std::string all;
              for (const auto& a : allowed) all += (all.empty() ? "" : ", ") + a;
              return "must be one of " + all + ", got '" + v + "'";
            }
            dst = v;
            return {};
          },
          [&dst] { return nlohmann::json(dst); }};
}

// Appends the comma-separated items of `v` to `out`; "" or why not.
std::string split_into(const std::string& v, std::vector<std::string>& out) {
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out.empty() ? "must name at least one" : "";
}

std::vector<key_spec> make_keys(serve_settings& s) {
  auto& e = s.engine;
  std::vector<key_spec> k;
  auto add = [&](std::string section, std::string key, std::string help, key_access access,
                 bool list = false) {
    key_spec spec;
    spec.section = std::move(section);
    spec.key = std::move(key);
    spec.help = std::move(help);
    spec.set = std::move(access.set);
    spec.get = std::move(access.get);
    spec.list = list;
    k.push_back(std::move(spec));
  };
  add("engine", "model", "model name (smollm2-135m-instruct, stories15m) or .gguf / .bin path",
      string_key(e.model));
  add("engine", "tokenizer", "tokenizer.bin for a llama2.c model", string_key(e.tokenizer));
  add("engine", "platform", "OpenCL platform index", int_key(e.platform, 0, 64));
  add("engine", "device", "OpenCL device index", int_key(e.device, 0, 64));
  add("engine", "page_size", "KV page size in tokens", int_key(e.page_size, 1, 4096));
  add("engine", "kv_mb", "KV arena size in MiB", int_key(e.kv_mb, 1, 1 << 20));
  add("engine", "kv_f32", "store the KV cache as F32 (true/false)", bool_key(e.kv_f32));
  add("engine", "batch", "device scratch rows per forward call", int_key(e.batch, 1, 65536));
  add("engine", "expert_devices",
      "mixture-of-experts models: experts spread over this many one-core sub-devices (0: off)",
      int_key(e.expert_devices, 0, 256));
  add("engine", "instance_cores",
      "local instance i runs on its own slice i of the device, this many compute units "
      "(cores) each, as if on a device of its own (0: every instance on the whole device)",
      int_key(s.instance_cores, 0, 1024));
  add("engine", "max_batch_tokens", "rows of one scheduler step",
      int_key(s.max_batch_tokens, 1, 65536));
  add("engine", "max_seqs", "sequences running at once", int_key(s.max_seqs, 1, 65536));
  add("engine", "chunk_size", "prefill rows of one sequence per step",
      int_key(s.chunk_size, 1, 65536));
  add("engine", "preemption", "recompute or swap", string_key(s.preemption, {"recompute", "swap"}));
  add("engine", "prefix_caching", "reuse KV pages of shared prompt prefixes (true/false)",
      bool_key(s.prefix_caching));
  add("engine", "draft_tokens",
      "speculative decoding: n-gram draft tokens verified per decode step when a request does "
      "not say (0: off; the output is the same either way)",
      int_key(s.draft_tokens, 0, k_max_draft_tokens));
  add("engine", "int8_dot",
      "4- and 8-bit weights: activations quantized to 8 bits and integer dot products "
      "(true/false; false dequantizes the weights to float)",
      bool_key(s.int8_dot));
  add("engine", "graph",
      "graph mode: steps of up to 64 rows recorded as OpenCL command buffers and replayed "
      "(true/false)",
      bool_key(s.graph));
  add("engine", "flash_attention",
      "one-pass attention over the half KV cache, as llama.cpp's -fa (true/false; false: "
      "llama.cpp's default two-pass numerics)",
      bool_key(s.flash_attention));
  add("engine", "fuse_layers",
      "on a CPU device, each dense decoder layer as one kernel launch instead of seven "
      "(true/false; the output is the same either way)",
      bool_key(s.fuse_layers));
  add("engine", "fuse_step",
      "with fused layers, the embedding, every layer and the final norm as one kernel launch "
      "where the layers share a weight type (true/false; the output is the same either way)",
      bool_key(s.fuse_step));
  add("engine", "queue_steps",
      "queue each step on the device behind the one running, greedy tokens drawn on the device "
      "(true/false; the output is the same either way)",
      bool_key(s.pipeline));
  // The old name of queue_steps (it would collide with pipeline parallelism).
  add("engine", "pipeline", "deprecated: engine.queue_steps", bool_key(s.pipeline));
  k.back().deprecated_for = "engine.queue_steps";
  add("engine", "step_overlap",
      "step overlap: plan and send the next step while the device runs this one, the tokens "
      "it samples filled in on the device (true/false; the output is the same either way)",
      bool_key(s.step_overlap));
  add("service", "listen", "endpoint to serve on (tcp://host:port, port * picks one; ipc://path)",
      {[&s](const std::string& v) -> std::string {
         if (v.rfind("tcp://", 0) != 0 && v.rfind("ipc://", 0) != 0 && v.rfind("inproc://", 0) != 0)
           return "must be tcp://host:port or ipc://path, got '" + v + "'";
         s.listen.push_back(v);
         return {};
       },
       [&s] { return nlohmann::json(s.listen); }},
      true);
  add("service", "max_frame_bytes", "largest client frame",
      int_key(s.max_frame_bytes, 64, 1 << 30));
  add("service", "max_inflight", "requests in flight at once", int_key(s.max_inflight, 1, 1 << 20));
  add("service", "max_queue", "waiting sequences before 'overloaded'",
      int_key(s.max_queue, 1, 1 << 20));
  add("service", "default_max_tokens", "max_tokens when a request gives none",
      int_key(s.default_max_tokens, 1, 1 << 20));
  add("service", "grace_s", "seconds in-flight requests get to finish at shutdown",
      real_key(s.grace_s, 0, 3600));
  add("service", "poll_ms", "gateway socket poll timeout", int_key(s.poll_ms, 0, 1000));
  add("service", "local_instances",
      "engine instances in this process, each with its own device and KV arena of --kv-mb "
      "(default 1, or 0 when nodes are given)",
      int_key(s.local_instances, 0, 64));
  add("service", "drain",
      "what draining an instance does to its sequences: migrate (move them elsewhere) or "
      "finish (let them finish there)",
      string_key(s.drain, {"migrate", "finish"}));
  add("cluster", "nodes",
      "troupe node addresses HOST:PORT (comma-separated or repeated): one instance on each",
      {[&s](const std::string& v) -> std::string {
         std::stringstream ss(v);
         std::string a;
         while (std::getline(ss, a, ',')) {
           if (a.empty()) continue;
           try {
             split_address(a, "node");
           } catch (const std::exception& e) {
             return e.what();
           }
           s.nodes.push_back(a);
         }
         return {};
       },
       [&s] { return nlohmann::json(s.nodes); }},
      true);
  add("cluster", "secret_file",
      "file holding the cluster secret (mode 600); default: cluster.secret in the run folder",
      string_key(s.cluster.secret_file));
  k.back().flag_name = "--cluster-secret-file";
  add("cluster", "heartbeat_ms", "heartbeat between cluster processes",
      int_key(s.cluster.heartbeat_ms, 10, 60000));
  add("cluster", "connection_timeout_ms",
      "a node silent this long is lost: its requests recover elsewhere",
      int_key(s.cluster.connection_timeout_ms, 100, 600000));
  add("service", "router",
      "placement policy: round-robin, least-load (4 x waiting + running), prefix, slo",
      string_key(s.router, {"round-robin", "least-load", "prefix", "slo"}));
  add("service", "ttft_target_ms", "the slo policy's TTFT target",
      real_key(s.ttft_target_ms, 1, 1e7));
  add("service", "tpot_target_ms",
      "online requests' TPOT target (0: none); with ttft_target_ms the online class's SLO "
      "(a request may give its own); decode placement's step-time cap",
      real_key(s.tpot_target_ms, 0, 1e7));
  add("service", "offline_ttft_ms", "offline requests' TTFT target (0: none, best effort)",
      real_key(s.offline_ttft_ms, 0, 1e9));
  add("service", "offline_tpot_ms", "offline requests' TPOT target (0: none)",
      real_key(s.offline_tpot_ms, 0, 1e9));
  add("service", "pd",
      "prefill/decode disaggregation: prefill on P instances, KV handed to D instances "
      "(true/false)",
      bool_key(s.pd));
  add("service", "roles",
      "starting role per instance, in instance order (prefill, decode, mixed; comma-separated); "
      "default with --pd: the first prefills, the rest decode",
      {[&s](const std::string& v) -> std::string {
         std::stringstream ss(v);
         std::string r;
         while (std::getline(ss, r, ',')) {
           if (!parse_role(r)) return "'" + r + "' is not a role (prefill, decode, mixed)";
           s.roles.push_back(r);
         }
         return {};
       },
       [&s] { return nlohmann::json(s.roles); }},
      true);
  add("service", "role_switching",
      "flip instances between prefill and decode as the load shifts (xLLM's policy; needs --pd)",
      bool_key(s.role_switching));
  add("service", "window_ms", "the monitor's window: role switching decides once per window",
      int_key(s.window_ms, 50, 600000));
  add("service", "min_decode", "decode instances role switching always keeps",
      int_key(s.pd_cfg.min_decode, 0, 1 << 20));
  add("service", "min_prefill", "prefill instances role switching always keeps",
      int_key(s.pd_cfg.min_prefill, 0, 1 << 20));
  add("service", "flip_windows", "windows in a row a flip trigger must hold (hysteresis)",
      int_key(s.pd_cfg.violation_windows, 1, 1000));
  add("service", "flip_cooldown_s", "an instance flips again only after this long",
      real_key(s.pd_cfg.cooldown_s, 0, 86400));
  add("service", "flip_miss_share",
      "flip an instance to prefill when this share of a window's prefills is predicted to "
      "miss the TTFT target",
      real_key(s.pd_cfg.miss_share, 0, 1));
  add("service", "idle_busy", "a prefill instance is idle below this busy share, queue empty",
      real_key(s.pd_cfg.idle_busy, 0, 1));
  add("service", "decode_kv_high", "decode is short of KV above this used share (flip to decode)",
      real_key(s.pd_cfg.kv_high, 0, 1));
  add("engine", "step_history",
      "forward passes each instance keeps for admin steps (bench sim-calibrate --server reads "
      "them)",
      int_key(s.step_history, 1, 1 << 20));
  add("engine", "colocate",
      "online/offline co-location: offline work takes only what online work leaves and is "
      "preempted when an online request cannot start (true/false)",
      bool_key(s.colocate));
  add("service", "client_backlog",
      "frames queued for one client before it counts as a slow reader and its requests are "
      "cancelled",
      int_key(s.client_backlog, 16, 1 << 24));
  add("service", "trace_history", "finished requests' traces kept",
      int_key(s.trace_history, 0, 1 << 20));
  add("service", "admin_port",
      "TCP port of the admin endpoint (troupe client admin); 0 = one the OS picks, told to "
      "clients in Pong; -1 = off",
      int_key(s.admin_port, -1, 65535));
  add("service", "admin_secret_file",
      "file holding the admin control secret (mode 600); empty = a fresh one, written to "
      "the run folder for the same user's tools (docs/security.md)",
      string_key(s.admin_secret_file));
  add("service", "admin_read_secret_file",
      "file holding the read-only admin secret (mode 600); empty = a fresh one in the run folder",
      string_key(s.admin_read_secret_file));
  add("service", "admin_host", "address the admin and metrics endpoints listen on",
      string_key(s.admin_host));
  add("service", "metrics_port", "TCP port of the Prometheus endpoint GET /metrics; 0 = off",
      int_key(s.metrics_port, 0, 65535));
  add("service", "http_port",
      "TCP port of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
      "/v1/models, /health); 0 = off",
      int_key(s.http_port, 0, 65535));
  add("service", "http_host", "address the HTTP API listens on", string_key(s.http_host));
  // Never shown back (admin config): only how many keys there are.
  add("service", "api_key",
      "key the HTTP API requires (Authorization: Bearer KEY; comma-separated for several); "
      "api_key_file keeps it off the command line",
      {[&s](const std::string& v) { return split_into(v, s.api_keys); },
       [&s] { return nlohmann::json(std::to_string(s.api_keys.size()) + " keys (not shown)"); }},
      true);
  add("service", "api_key_file",
      "file with the HTTP API's keys, one per line (mode 600, as secret files)",
      string_key(s.api_key_file));
  add("service", "cors_origins",
      "origins whose browsers may call the HTTP API (comma-separated; * for any)",
      {[&s](const std::string& v) { return split_into(v, s.cors_origins); },
       [&s] { return nlohmann::json(s.cors_origins); }},
      true);
  add("service", "dp_group",
      "the instances (local and on nodes) form a data-parallel group: each request goes to the "
      "replica with the most free KV, and sequences move from the most to the least loaded "
      "replica when their KV-token gap passes dp_gap_share of the mean (true/false; not with "
      "pd)",
      bool_key(s.dp_group));
  add("service", "dp_interval_ms", "how often the dp group checks its balance",
      int_key(s.dp.interval_ms, 1, 600000));
  add("service", "dp_gap_share",
      "the dp group moves sequences when (max - min) KV tokens exceeds this share of the mean",
      real_key(s.dp.gap_share, 0, 100));
  add("service", "dp_max_moves", "sequences the dp group moves per check at most",
      int_key(s.dp.max_moves, 1, 1024));
  add("service", "dp_min_left",
      "the dp group moves only sequences with at least this many tokens left to generate",
      int_key(s.dp.min_left, 0, 1 << 20));
  add("service", "dp_patience",
      "checks in a row that must find the gap above dp_gap_share before the dp group moves",
      int_key(s.dp.patience, 1, 1000));
  add("service", "dp_rebalance",
      "the dp group moves sequences (true) or only admits and measures (false)",
      bool_key(s.dp.rebalance));
  add("service", "dp_lockstep",
      "the dp group's replicas step together, idle ones running dummy steps: on, off, or auto "
      "(on for mixture-of-experts models)",
      string_key(s.dp_lockstep, {"auto", "on", "off"}));
  add("service", "expert_threshold",
      "mixture-of-experts models with engine.expert_devices >= 2: the expert controller "
      "moves experts when an expert device's load exceeds this times the mean",
      real_key(s.experts.threshold, 1, 1000));
  add("service", "expert_interval_ms", "how often the expert controller reads expert loads",
      int_key(s.experts.interval_ms, 10, 600000));
  add("service", "expert_spare_slots", "expert slots per expert device beyond an even share",
      int_key(s.experts.spare_slots, 0, 256));
  return k;
}

// A TOML value as the text the setters read.
std::optional<std::string> scalar_text(const toml::node& n) {
  if (auto v = n.value_exact<std::string>()) return *v;
  if (auto v = n.value_exact<int64_t>()) return std::to_string(*v);
  if (auto v = n.value_exact<bool>()) return std::string(*v ? "true" : "false");
  if (auto v = n.value_exact<double>()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", *v);
    return std::string(buf);
  }
  return std::nullopt;
}

// [[cluster.node]] tables: address = "HOST:PORT", instances = N, and
// engine keys that differ on that node.
std::vector<node_entry> parse_node_entries(const std::string& path, const toml::node& value) {
  static const std::vector<std::string> engine_keys = {
      "kv_mb",      "batch",  "max_seqs", "max_batch_tokens",
      "chunk_size", "kv_f32", "platform", "device"};
  const auto* arr = value.as_array();
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("config " + path + ": cluster.node: " + why);
  };
  if (!arr) throw bad("must be [[cluster.node]] tables");
  std::vector<node_entry> out;
  for (const auto& el : *arr) {
    const auto* t = el.as_table();
    if (!t) throw bad("must be [[cluster.node]] tables");
    node_entry e;
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (key == "address") {
        auto a = v.value_exact<std::string>();
        if (!a) throw bad("address must be a string HOST:PORT");
        split_address(*a, "cluster.node.address");
        e.address = *a;
      } else if (key == "instances") {
        auto n = v.value_exact<int64_t>();
        if (!n || *n < 1 || *n > 64) throw bad("instances must be an integer in [1, 64]");
        e.instances = static_cast<int>(*n);
      } else if (std::find(engine_keys.begin(), engine_keys.end(), key) != engine_keys.end()) {
        if (auto b = v.value_exact<bool>())
          e.overrides[key] = *b ? 1 : 0;
        else if (auto n = v.value_exact<int64_t>(); n && *n >= 0)
          e.overrides[key] = *n;
        else
          throw bad(key + " must be a non-negative integer (kv_f32: true/false)");
      } else {
        std::string known = "address, instances";
        for (const auto& x : engine_keys) known += ", " + x;
        throw bad("unknown key " + key + " (known: " + known + ")");
      }
    }
    if (e.address.empty()) throw bad("a [[cluster.node]] needs an address");
    out.push_back(std::move(e));
  }
  return out;
}

void load_config(const std::string& path, std::vector<key_spec>& keys, serve_settings& s) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "config " << path << ": " << e.description() << " (line " << e.source().begin.line << ")";
    throw std::invalid_argument(os.str());
  }
  for (const auto& [section, node] : tbl) {
    const std::string sec(section.str());
    const auto* t = node.as_table();
    if (!t || (sec != "engine" && sec != "service" && sec != "cluster"))
      throw std::invalid_argument("config " + path + ": unknown section [" + sec +
                                  "] (known: [engine], [service], [cluster])");
    for (const auto& [key, value] : *t) {
      const std::string name = sec + "." + std::string(key.str());
      if (name == "cluster.node") {
        s.node_entries = parse_node_entries(path, value);
        continue;
      }
      auto it = std::find_if(keys.begin(), keys.end(),
                             [&](const key_spec& k) { return k.name() == name; });
      if (it == keys.end()) throw std::invalid_argument("config " + path + ": unknown key " + name);
      if (!it->deprecated_for.empty())
        std::fprintf(stderr, "troupe serve: config %s: %s is deprecated; use %s\n", path.c_str(),
                     name.c_str(), it->deprecated_for.c_str());
      if (it->opt && it->opt->count() > 0) continue;  // the command line wins
      std::vector<std::string> values;
      if (const auto* arr = value.as_array(); arr && it->list) {
        for (const auto& el : *arr) {
          auto v = scalar_text(el);
          if (!v)
            throw std::invalid_argument("config " + path + ": " + name + ": not a list of values");
          values.push_back(*v);
        }
      } else if (auto v = scalar_text(value)) {
        values.push_back(*v);
      } else {
        throw std::invalid_argument("config " + path + ": " + name + ": not a value");
      }
      for (const auto& v : values)
        if (auto why = it->set(v); !why.empty())
          throw std::invalid_argument("config " + path + ": " + name + ": " + why);
    }
  }
}

int run_serve(serve_settings& s, std::vector<key_spec>& keys, const std::string& config) {
  if (!config.empty()) load_config(config, keys, s);
  for (auto& k : keys) {
    if (!k.opt || k.opt->count() == 0) continue;
    if (!k.deprecated_for.empty()) {
      auto now = std::find_if(keys.begin(), keys.end(),
                              [&](const key_spec& x) { return x.name() == k.deprecated_for; });
      std::fprintf(stderr, "troupe serve: %s is deprecated; use %s (%s)\n", k.flag().c_str(),
                   now == keys.end() ? "" : now->flag().c_str(), k.deprecated_for.c_str());
    }
    std::vector<std::string> values = k.list ? k.cli_values : std::vector<std::string>{k.cli_value};
    if (!k.list && values[0].empty() && k.get().is_boolean()) values[0] = "true";
    for (const auto& v : values)
      if (auto why = k.set(v); !why.empty())
        throw std::invalid_argument(k.flag() + " (" + k.name() + "): " + why);
  }
  if (s.engine.model.empty())
    throw std::invalid_argument("engine.model: required (--model, or model in [engine])");
  if (s.listen.empty())
    throw std::invalid_argument("service.listen: required (--listen, or listen in [service])");
  scheduler_limits lim;
  lim.max_batch_tokens = s.max_batch_tokens;
  lim.max_seqs = s.max_seqs;
  lim.chunk_size = s.chunk_size;
  lim.page_size = s.engine.page_size;
  if (auto why = validate(lim); !why.empty())
    throw std::invalid_argument("engine.max_batch_tokens/max_seqs/chunk_size: " + why);

  // Every client connection and every PoCL kernel build takes fds: use all
  // the process may have, so a connection flood meets the bounded
  // endpoints' limits long before PoCL's dlopen fails.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }

  // Signals go to the thread that waits for them, not to CAF's workers:
  // block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto model = open_model(s.engine);
  std::shared_ptr<const tokenizer> tok = tokenizer::create(model->vocab());

  // Where the instances run: --nodes (one each), [[cluster.node]] tables,
  // and --local-instances in this process.
  std::vector<node_entry> nodes = s.node_entries;
  for (const auto& a : s.nodes) nodes.push_back(node_entry{a, 1, {}});
  const int local = s.local_instances >= 0 ? s.local_instances : (nodes.empty() ? 1 : 0);
  if (local == 0 && nodes.empty())
    throw std::invalid_argument(
        "service.local_instances: 0 and no nodes (--nodes, [[cluster.node]]): no instance "
        "would serve");
  std::unique_ptr<actor_env> envp =
      nodes.empty() ? std::make_unique<actor_env>()
                    : std::make_unique<actor_env>(load_cluster_secret(s.cluster), s.cluster);
  actor_env& env = *envp;

  instance_spec base;
  base.model = s.engine.model;
  base.tokenizer = s.engine.tokenizer;
  base.platform = s.engine.platform;
  base.device = s.engine.device;
  base.page_size = s.engine.page_size;
  base.kv_mb = s.engine.kv_mb;
  base.kv_f32 = s.engine.kv_f32;
  base.batch = s.engine.batch;
  base.max_batch_tokens = s.max_batch_tokens;
  base.max_seqs = s.max_seqs;
  base.chunk_size = s.chunk_size;
  base.preemption = s.preemption;
  base.prefix_caching = s.prefix_caching;
  base.offline_yields = s.colocate;
  base.step_history = s.step_history;
  base.draft_tokens = s.draft_tokens;
  base.int8_dot = s.int8_dot;
  base.graph = s.graph;
  base.flash_attention = s.flash_attention;
  base.fuse_layers = s.fuse_layers;
  base.fuse_step = s.fuse_step;
  base.pipeline = s.pipeline;
  base.step_overlap = s.step_overlap;
  base.expert_devices = s.engine.expert_devices;
  base.tpot_target_ms = s.tpot_target_ms;
  if (s.role_switching && !s.pd)
    throw std::invalid_argument("service.role_switching: needs service.pd (--pd)");
  std::vector<instance_role> roles;
  for (const auto& r : s.roles) roles.push_back(*parse_role(r));

  if (s.dp_group) {
    if (s.pd) throw std::invalid_argument("service.dp_group: not with service.pd");
    // Local instances and the nodes' (which join as their nodes link).
    int replicas = local;
    for (const auto& n : nodes) replicas += n.instances;
    if (replicas < 2)
      throw std::invalid_argument(
          "service.dp_group: needs 2 or more instances (service.local_instances, nodes)");
  }
  const bool moe = model->hparams().n_expert > 0;

  // Local instances: each owns a device actor (its queue, its KV arena).
  std::vector<device_actor> local_devices;
  std::vector<caf::actor> owned;  // told to stop at the end (or when start fails)
  std::vector<router_instance> registry;
  std::vector<device_info> infos;
  for (int i = 0; i < local; ++i) {
    instance_spec spec = base;
    if (s.pd) spec.role = to_string(pd_start_role(roles, size_t(i)));
    if (s.instance_cores > 0) {
      spec.cores = s.instance_cores;
      spec.slice = i;
    }
    auto h = spawn_engine(*env.sys, i, spec);
    owned.push_back(caf::actor_cast<caf::actor>(h.hosted.actor));
    owned.push_back(caf::actor_cast<caf::actor>(h.device));
    local_devices.push_back(h.device);
    infos.push_back(h.hosted.info);
    router_instance ri;
    ri.id = static_cast<uint64_t>(i + 1);
    ri.actor = h.hosted.actor;
    registry.push_back(std::move(ri));
  }
  router_options ro;
  ro.policy = *parse_placement_policy(s.router);
  ro.ttft_target_ms = s.ttft_target_ms;
  ro.drain_migrates = s.drain == "migrate";
  ro.pd = s.pd;
  ro.role_switching = s.role_switching;
  ro.tpot_target_ms = s.tpot_target_ms;
  ro.pd_cfg = s.pd_cfg;
  ro.window = std::chrono::milliseconds(s.window_ms);
  ro.roles = roles;
  ro.page_size = s.engine.page_size;  // every instance's, local or on a node
  auto monitor = spawn_monitor(*env.sys, s.window_ms / 1000.0);
  ro.monitor = monitor;
  // The data-parallel group places requests for the router (issue 15).
  admin_groups groups;
  if (s.dp_group) {
    dp_group_config dc = s.dp;
    dc.lockstep = s.dp_lockstep == "on" || (s.dp_lockstep == "auto" && moe);
    groups.dp = spawn_dp_group(*env.sys, registry, dc, s.engine.page_size);
    ro.dp_group = groups.dp;
    owned.push_back(caf::actor_cast<caf::actor>(groups.dp));
    std::fprintf(stderr, "troupe serve: dp group of %d local instances%s (lockstep %s)\n", local,
                 nodes.empty() ? "" : " and the nodes' instances", dc.lockstep ? "on" : "off");
  }
  // Experts spread over sub-devices: the controller balances them live,
  // in every engine (nodes' engines join it as their instances join).
  if (moe && s.engine.expert_devices >= 2) {
    groups.experts = spawn_expert_controller(*env.sys, local_devices, s.experts);
    ro.experts = groups.experts;
    owned.push_back(caf::actor_cast<caf::actor>(groups.experts));
    std::fprintf(stderr,
                 "troupe serve: expert controller over %d expert devices per engine "
                 "(threshold %.2f)\n",
                 s.engine.expert_devices, s.experts.threshold);
  }
  auto router = spawn_router(*env.sys, registry, ro);
  owned.push_back(caf::actor_cast<caf::actor>(router));
  owned.push_back(caf::actor_cast<caf::actor>(monitor));

  // Remote instances: a link per node; each reports how its start went.
  const std::string service_id = make_secret().substr(0, 16);
  std::vector<node_link_full_actor> links;
  int next_role = local;
  for (const auto& n : nodes) {
    node_link_options lo;
    std::tie(lo.host, lo.port) = split_address(n.address, "node");
    lo.service_id = service_id;
    lo.model_fingerprint = model->fingerprint();
    lo.router = router;
    instance_spec spec = base;
    for (const auto& [key, v] : n.overrides) {
      const auto x = static_cast<int32_t>(v);
      if (key == "kv_mb") spec.kv_mb = x;
      if (key == "batch") spec.batch = x;
      if (key == "max_seqs") spec.max_seqs = x;
      if (key == "max_batch_tokens") spec.max_batch_tokens = x;
      if (key == "chunk_size") spec.chunk_size = x;
      if (key == "kv_f32") spec.kv_f32 = x != 0;
      if (key == "platform") spec.platform = x;
      if (key == "device") spec.device = x;
    }
    lo.specs.assign(static_cast<size_t>(n.instances), spec);
    // Roles continue the local instances' order (the router's ids).
    for (auto& sp : lo.specs) {
      if (s.pd) sp.role = to_string(pd_start_role(roles, size_t(next_role)));
      ++next_role;
    }
    links.push_back(spawn_node_link(*env.sys, std::move(lo)));
    owned.push_back(caf::actor_cast<caf::actor>(links.back()));
  }
  {
    caf::scoped_actor self{*env.sys};
    for (size_t i = 0; i < links.size(); ++i) {
      link_status ls;
      ls.address = nodes[i].address;
      ls.state = "down";
      ls.error = "no answer during start-up";
      self->request(links[i], std::chrono::minutes(11), settled_atom::value)
          .receive([&](link_status& x) { ls = std::move(x); }, [](caf::error&) {});
      if (ls.state == "up") {
        infos.push_back(ls.info);
        std::fprintf(stderr, "troupe serve: node %s: up, %zu instances, %d cores, %.1f GiB\n",
                     ls.address.c_str(), ls.instances.size(), ls.resources.cores,
                     static_cast<double>(ls.resources.mem_total) / (1u << 30));
      } else {
        std::fprintf(stderr, "troupe serve: node %s: %s: %s\n", ls.address.c_str(),
                     ls.state.c_str(), ls.error.c_str());
      }
    }
  }
  if (infos.empty()) {
    for (const auto& a : owned) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    throw std::runtime_error("no instance: every node failed to start (see above)");
  }
  device_info info = infos.front();
  int32_t max_len = std::min(info.n_ctx, info.n_pages * info.page_size);
  for (const auto& i : infos)
    max_len = std::min(max_len, std::min(i.n_ctx, i.n_pages * i.page_size));

  auto ctx = std::make_shared<serve_context>();
  ctx->router = router;
  ctx->tok = tok;
  ctx->model_name = s.engine.model;
  ctx->chat_template = model->vocab().chat_template;
  ctx->add_bos = model->vocab().add_bos;
  ctx->max_len = max_len;
  ctx->page_size = info.page_size;
  ctx->prefix_salt = fingerprint_salt(info.model_fingerprint);
  {
    uint64_t tag = std::stoull(make_secret().substr(0, 6), nullptr, 16);
    ctx->seq_id_tag = tag << 40;
  }
  ctx->default_max_tokens = s.default_max_tokens;
  ctx->max_queue = s.max_queue;
  ctx->monitor = monitor;
  ctx->online_ttft_ms = s.ttft_target_ms;
  ctx->online_tpot_ms = s.tpot_target_ms;
  ctx->offline_ttft_ms = s.offline_ttft_ms;
  ctx->offline_tpot_ms = s.offline_tpot_ms;
  auto metrics = std::make_shared<metrics_registry>();
  declare_request_metrics(*metrics);
  ctx->metrics = metrics;
  gateway_options go;
  go.endpoints = s.listen;
  go.max_frame_bytes = static_cast<size_t>(s.max_frame_bytes);
  go.max_inflight = s.max_inflight;
  go.poll_ms = s.poll_ms;
  go.trace_history = static_cast<size_t>(s.trace_history);
  go.client_backlog = s.client_backlog;
  auto gw = spawn_gateway(*env.sys, ctx, go);

  // The admin and metrics endpoints; if one cannot open, the actors are
  // told to stop before the error leaves (the actor system waits for them).
  // The gateway learns the admin port before the ready line, so every Pong
  // a client can get names it.
  std::map<std::string, node_grow_actor> node_links;
  for (size_t i = 0; i < links.size(); ++i)
    node_links[nodes[i].address] = caf::actor_cast<node_grow_actor>(links[i]);
  auto admin = spawn_admin(*env.sys, gw.actor, router, std::move(node_links), monitor, groups);
  std::optional<admin_endpoint_handle> admin_ep;
  std::vector<std::string> secret_files;  // made here, removed at exit
  std::unique_ptr<metrics_server> metrics_http;
  std::unique_ptr<http_front> http;
  auto draining = std::make_shared<std::atomic<bool>>(false);
  try {
    if (s.admin_port >= 0) {
      admin_endpoint_options ao;
      ao.host = s.admin_host;
      ao.port = s.admin_port;
      // A given file, else a fresh secret; a bad file names its key.
      auto secret = [](const std::string& file, const char* key) {
        if (file.empty()) return make_secret();
        try {
          return read_secret_file(file);
        } catch (const std::exception& e) {
          throw std::runtime_error(std::string("service.") + key + ": " + e.what());
        }
      };
      // The effective config, for `admin config` (values, never secrets:
      // the secret keys name files).
      nlohmann::json effective = nlohmann::json::object();
      for (const auto& k : keys)
        if (k.get && k.deprecated_for.empty()) effective[k.section][k.key] = k.get();
      if (!config.empty()) effective["config_file"] = config;
      ao.config = effective;
      ao.control_secret = secret(s.admin_secret_file, "admin_secret_file");
      ao.read_secret = secret(s.admin_read_secret_file, "admin_read_secret_file");
      const std::string control = ao.control_secret, read = ao.read_secret;
      if (const int stale = remove_stale_run_secrets(); stale > 0)
        spdlog::info("removed {} secret files of admin endpoints that no longer listen", stale);
      admin_ep = spawn_admin_endpoint(*env.sys, admin, std::move(ao));
      // The same user's tools find the secrets by port (docs/security.md).
      for (const auto& [kind, secret] : {std::pair{"admin", control}, {"admin-read", read}}) {
        const auto path = run_secret_path(kind, admin_ep->port);
        write_secret_file(path, secret);
        secret_files.push_back(path);
      }
      caf::scoped_actor self{*env.sys};
      caf::error err;
      self->request(gw.actor, std::chrono::seconds(10), admin_port_atom::value,
                    static_cast<uint32_t>(admin_ep->port))
          .receive([](uint32_t) {}, [&](caf::error& e) { err = std::move(e); });
      if (err)
        throw std::runtime_error("service.admin_port: the gateway did not take the admin port: " +
                                 env.sys->render(err));
    }
    if (s.metrics_port > 0)
      metrics_http =
          std::make_unique<metrics_server>(*env.sys, admin, metrics, s.admin_host, s.metrics_port);
    if (s.http_port > 0) {
      http_front_options ho;
      ho.host = s.http_host;
      ho.port = s.http_port;
      ho.model = s.engine.model;
      ho.endpoint = gw.endpoints.at(0);
      ho.token_text = [tok](int32_t id) { return tok->decode({id}); };
      ho.detokenize = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
      ho.tokenize = [tok, bos = ctx->add_bos](const std::string& text, bool add_special) {
        return tok->encode(text, add_special && bos, true);
      };
      ho.vocab_size = tok->n_vocab();
      ho.api_keys = s.api_keys;
      if (!s.api_key_file.empty()) {
        std::string keys;
        try {
          keys = read_secret_file(s.api_key_file);
        } catch (const std::exception& e) {
          throw std::runtime_error(std::string("service.api_key_file: ") + e.what());
        }
        std::stringstream lines(keys);
        for (std::string k; std::getline(lines, k);)
          if (auto b = k.find_first_not_of(" \t\r"); b != std::string::npos)
            ho.api_keys.push_back(k.substr(b, k.find_last_not_of(" \t\r") - b + 1));
      }
      ho.cors_origins = s.cors_origins;
      ho.metrics = [sys = env.sys.get(), admin, metrics] {
        poll_metrics(*sys, admin, *metrics);
        return metrics->render();
      };
      ho.draining = [draining] { return draining->load(); };
      ho.serving = [sys = env.sys.get(), router] { return any_instance_serving(*sys, router); };
      http = std::make_unique<http_front>(std::move(ho));
    }
  } catch (...) {
    for (const auto& a :
         {caf::actor_cast<caf::actor>(admin), caf::actor_cast<caf::actor>(gw.actor)})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (const auto& a : owned) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (admin_ep) caf::anon_send_exit(admin_ep->actor, caf::exit_reason::user_shutdown);
    for (const auto& f : secret_files) std::remove(f.c_str());
    throw;
  }

  std::string eps;
  for (const auto& ep : gw.endpoints) eps += (eps.empty() ? "" : " ") + ep;
  std::printf("troupe serve: listening on %s (model %s on %s, context %d tokens)\n", eps.c_str(),
              s.engine.model.c_str(), info.device_name.c_str(), ctx->max_len);
  if (admin_ep) std::printf("troupe serve: admin on %s:%d\n", s.admin_host.c_str(), admin_ep->port);
  if (metrics_http)
    std::printf("troupe serve: metrics on http://%s:%d/metrics\n", s.admin_host.c_str(),
                s.metrics_port);
  if (http)
    std::printf("troupe serve: http on http://%s:%d/v1\n", s.http_host.c_str(), http->port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "troupe serve: %s, draining (grace %.1f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", s.grace_s);
  draining->store(true);

  // Stop taking requests, let those in flight finish, cancel the rest.
  caf::scoped_actor self{*env.sys};
  auto in_flight = [&](bool cancel) {
    int32_t n = 0;
    self->request(gw.actor, std::chrono::seconds(5), drain_atom::value, cancel)
        .receive([&](int32_t k) { n = k; }, [&](caf::error&) { n = 0; });
    return n;
  };
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(s.grace_s * 1000));
  int32_t left = in_flight(false);
  while (left > 0 && std::chrono::steady_clock::now() < grace_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = in_flight(false);
  }
  if (left > 0) {
    std::fprintf(stderr, "troupe serve: cancelling %d requests still in flight\n", left);
    left = in_flight(true);
    const auto cancel_end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (left > 0 && std::chrono::steady_clock::now() < cancel_end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      left = in_flight(false);
    }
  }
  metrics_http.reset();
  http.reset();
  if (admin_ep) self->send_exit(admin_ep->actor, caf::exit_reason::user_shutdown);
  for (const auto& f : secret_files) std::remove(f.c_str());
  self->send_exit(admin, caf::exit_reason::user_shutdown);
  self->send_exit(gw.actor, caf::exit_reason::user_shutdown);
  for (const auto& a : owned) self->send_exit(a, caf::exit_reason::user_shutdown);
  env.exit_limit = std::chrono::seconds(5);
  std::fprintf(stderr, "troupe serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto s = std::make_shared<serve_settings>();
  auto keys = std::make_shared<std::vector<key_spec>>(make_keys(*s));
  auto config = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("serve", "serve a model to clients over ZeroMQ (client.proto)");
  cmd->add_option("-c,--config", *config, "TOML config file ([engine], [service])")
      ->check(CLI::ExistingFile);
  for (auto& k : *keys) {
    std::string flags = k.flag();
    if (k.key == "model") flags = "-m," + flags;
    if (k.key == "listen") flags = "-l," + flags;
    const std::string help = k.help + " [" + k.name() + "]";
    k.opt = k.list ? cmd->add_option(flags, k.cli_values, help)
                   : cmd->add_option(flags, k.cli_value, help);
    // A true/false key may be given as a bare flag (--pd means --pd true).
    if (k.get().is_boolean()) k.opt->expected(0, 1);
    if (!k.deprecated_for.empty()) k.opt->group("");  // not in --help
  }
  cmd->callback([s, keys, config] {
    int rc = run_serve(*s, *keys, *config);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
