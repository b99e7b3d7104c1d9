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
#include "tools/troupe/settings_flags.hpp"

namespace troupe::cli {

// The schema's [engine] keys a one-process command takes (trait local;
// runtime/config/settings.def) as its flags; once the command line is
// parsed, `out` holds them with every layer applied (settings_flags.hpp).
// `pick` widens or narrows the keys (bench batch adds step_overlap).
void add_engine_flags(CLI::App& cmd, engine_settings& out,
                      settings_flags::pick_fn pick = settings_flags::local_keys);

// The device options for a one-process command: the whole device.
engine_options device_options(const engine_settings& e);

// Resolves a model name or path and opens it (throws model_error).
std::shared_ptr<const model_file> open_model(const engine_settings& e);

// The cluster secret the settings name (a bad file names the flag).
std::string load_cluster_secret(const cluster_settings& c);

// "host:port" -> (host, port); throws naming `what` when it is not one.
std::pair<std::string, uint16_t> split_address(const std::string& a, const char* what);

// A number that is finite and > 0 (>= 0 with zero_ok): CLI11's
// PositiveNumber, NonNegativeNumber and Range let NaN through.
CLI::Validator finite_number(bool zero_ok);

// Digits only (an id, a seed): CLI11 reads "-1" into an unsigned as its
// wrap-around, 18446744073709551615.
CLI::Validator whole_number();

// An actor system configured with troupe's message types.
struct actor_env {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::optional<cluster_identity> identity;  // removed at exit
  actor_env();
  // With the middleman on the cluster's TLS: only peers holding `secret`
  // get past the handshake (net/cluster_tls.hpp).
  actor_env(const std::string& secret, const cluster_settings& c);
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
void add_cluster(CLI::App& app);  // cmd_cluster.cpp
void add_shell(CLI::App& app);    // cmd_shell.cpp
void add_perplexity(CLI::App& app);
void add_bench(CLI::App& app);
// `troupe client admin ...` under the client command (cmd_admin.cpp);
// `server` and `json` are the client command's --server and --json.
CLI::App* add_client_admin(CLI::App& client, const std::string& server, const bool& json);

}  // namespace troupe::cli
