#pragma once
// What the troupe subcommands share: model/engine options on the command
// line, opening the model, and calling the device actor synchronously.
#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "messages/actors.hpp"
#include "net/cluster_tls.hpp"
#include "runtime/device/llama_forward.hpp"
#include "runtime/engine/sequence_runner.hpp"
#include "runtime/model/model_file.hpp"

namespace troupe::cli {

struct engine_flags {
  std::string model;
  std::string tokenizer;
  int platform = 0;
  int device = 0;
  int page_size = 16;
  int kv_mb = 256;
  bool kv_f32 = false;
  int batch = 512;  // max rows per forward call
  bool int8_dot = true;
  bool graph = false;
  bool flash_attention = false;
  bool fuse_layers = true;
  bool fuse_step = true;
  bool pipeline = true;
  int expert_devices = 0;
};

void add_engine_flags(CLI::App& app, engine_flags& f);

// Step overlap's default for the commands that run instances: on, unless
// TROUPE_STEP_OVERLAP=0 (bench/engine_ab.py's on/off variants set it).
bool step_overlap_default();
engine_options to_engine_options(const engine_flags& f);

// Resolves a model name or path and opens it (throws model_error).
std::shared_ptr<const model_file> open_model(const engine_flags& f);

// How a process joins the cluster (troupe node, troupe serve --nodes).
struct cluster_flags {
  std::string secret_file;           // empty: run_dir()/cluster.secret, made if missing
  int heartbeat_ms = 250;            // CAF's BASP heartbeat between nodes
  int connection_timeout_ms = 2000;  // no message for this long: the peer is lost
};

// The cluster secret the flags name (a bad file names the flag).
std::string load_cluster_secret(const cluster_flags& c);

// --cluster-secret-file, --heartbeat-ms, --connection-timeout-ms.
void add_cluster_flags(CLI::App& cmd, cluster_flags& c);

// "host:port" -> (host, port); throws naming `what` when it is not one.
std::pair<std::string, uint16_t> split_address(const std::string& a, const char* what);

// An actor system configured with troupe's message types.
struct actor_env {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::optional<cluster_identity> identity;  // removed at exit
  actor_env();
  // With the middleman on the cluster's TLS: only peers holding `secret`
  // get past the handshake (net/cluster_tls.hpp).
  actor_env(const std::string& secret, const cluster_flags& c);
  // Waits for every actor to end, at most `exit_limit` when it is set.
  ~actor_env();
  // Set by serve and node once they told their actors to stop: the wait
  // for the actor system to wind down then costs this long at most, not
  // forever.  Past it the process says how many actors still run and
  // exits, with 70 when some do (a bug), else 0 (~actor_env explains).
  std::chrono::seconds exit_limit{0};
  actor_env(const actor_env&) = delete;
  actor_env& operator=(const actor_env&) = delete;

 private:
  void configure();
};

// A forward_fn that sends to the device actor and waits for the reply.
forward_fn blocking_forward(caf::actor_system& sys, device_actor dev);

device_info query_info(caf::actor_system& sys, device_actor dev);

// Subcommands
void add_generate(CLI::App& app);
void add_node(CLI::App& app);
void add_shell(CLI::App& app);  // cmd_shell.cpp
void add_perplexity(CLI::App& app);
void add_bench(CLI::App& app);
// `troupe client admin ...` under the client command (cmd_admin.cpp);
// `server` and `json` are the client command's --server and --json.
CLI::App* add_client_admin(CLI::App& client, const std::string& server, const bool& json);

}  // namespace troupe::cli
