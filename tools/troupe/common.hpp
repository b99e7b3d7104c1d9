#pragma once
// What the troupe subcommands share: model/engine options on the command
// line, opening the model, and calling the device actor synchronously.
#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <memory>
#include <string>

#include "messages/actors.hpp"
#include "runtime/llama_forward.hpp"
#include "runtime/model_file.hpp"
#include "runtime/sequence_runner.hpp"

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
};

void add_engine_flags(CLI::App& app, engine_flags& f);
engine_options to_engine_options(const engine_flags& f);

// Resolves a model name or path and opens it (throws model_error).
std::shared_ptr<const model_file> open_model(const engine_flags& f);

// An actor system configured with troupe's message types.
struct actor_env {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  // With `network`, the middleman is loaded (publish, remote_actor).
  explicit actor_env(bool network = false);
};

// A forward_fn that sends to the device actor and waits for the reply.
forward_fn blocking_forward(caf::actor_system& sys, device_actor dev);

device_info query_info(caf::actor_system& sys, device_actor dev);

// Subcommands
void add_generate(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_bench(CLI::App& app);
// `troupe client admin ...` under the client command (cmd_admin.cpp);
// `server` and `json` are the client command's --server and --json.
CLI::App* add_client_admin(CLI::App& client, const std::string& server, const bool& json);

}  // namespace troupe::cli
