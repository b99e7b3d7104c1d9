#include "tools/troupe/common.hpp"

#include <caf/io/all.hpp>
#include <caf/openssl/manager.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "net/secret.hpp"
#include "runtime/model/model_registry.hpp"

namespace troupe::cli {

void add_engine_flags(CLI::App& app, engine_flags& f) {
  app.add_option(
         "-m,--model", f.model,
         "model name (smollm2-135m-instruct, stories15m) or path to a .gguf / llama2.c .bin")
      ->required();
  app.add_option("--tokenizer", f.tokenizer,
                 "tokenizer.bin for a llama2.c model (default: beside it)");
  app.add_option("--platform", f.platform, "OpenCL platform index")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", f.device, "OpenCL device index on the platform")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--page-size", f.page_size, "KV page size in tokens")
      ->default_val(16)
      ->check(CLI::Range(1, 4096));
  app.add_option("--kv-mb", f.kv_mb, "KV arena size in MiB")
      ->default_val(256)
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--kv-f32", f.kv_f32,
               "store the KV cache as F32 (default: half, with llama.cpp's attention numerics)");
  app.add_option("--batch", f.batch, "most tokens per forward call (prefill chunk)")
      ->default_val(512)
      ->check(CLI::Range(1, 65536));
  app.add_option("--int8-dot", f.int8_dot,
                 "4- and 8-bit weights: activations quantized to 8 bits, integer dot products "
                 "(false: weights dequantized to float)")
      ->default_val(true);
  app.add_option("--graph", f.graph,
                 "graph mode: record steps of up to 64 rows as OpenCL command buffers and replay "
                 "them")
      ->default_val(false);
  app.add_option("--flash-attention", f.flash_attention,
                 "one-pass attention over the half KV cache (llama.cpp's -fa) instead of "
                 "llama.cpp's default two-pass numerics")
      ->default_val(false);
  app.add_option("--fuse-layers", f.fuse_layers,
                 "on a CPU device, each dense decoder layer as one kernel launch instead of "
                 "seven (the same results; false: one launch per operation)")
      ->default_val(true);
  app.add_option("--fuse-step", f.fuse_step,
                 "with fused layers: the embedding, every layer and the final norm as one kernel "
                 "launch where the layers share a weight type (the same results; false: one "
                 "launch per layer)")
      ->default_val(true);
  app.add_option("--queue-steps", f.pipeline,
                 "queue each step on the device behind the one running, greedy tokens drawn on "
                 "the device (the same results; false: each step waits for the last one's result)")
      ->default_val(true);
  // The old name of --queue-steps (it would collide with pipeline
  // parallelism): still taken, with a note on stderr, not in --help.
  app.add_option("--pipeline", f.pipeline, "deprecated: --queue-steps")
      ->group("")
      ->check(CLI::Validator(
          [](std::string&) {
            std::fprintf(stderr, "troupe: --pipeline is deprecated; use --queue-steps\n");
            return std::string();
          },
          "", "deprecated"));
  app.add_option("--expert-devices", f.expert_devices,
                 "mixture-of-experts models: spread the experts over this many sub-devices of one "
                 "compute unit each (expert parallelism; 0: on the device itself)")
      ->default_val(0)
      ->check(CLI::Range(0, 256));
}

bool step_overlap_default() {
  const char* v = std::getenv("TROUPE_STEP_OVERLAP");
  return v ? std::atoi(v) != 0 : true;
}

engine_options to_engine_options(const engine_flags& f) {
  engine_options o;
  o.device = {f.platform, f.device};
  o.page_size = f.page_size;
  o.kv_bytes = static_cast<size_t>(f.kv_mb) << 20;
  o.kv_f16 = !f.kv_f32;
  o.max_batch_tokens = f.batch;
  o.int8_dot = f.int8_dot;
  o.graph = f.graph;
  o.flash_attention = f.flash_attention;
  o.fuse_layers = f.fuse_layers;
  o.fuse_step = f.fuse_step;
  o.pipeline = f.pipeline;
  o.expert_devices = f.expert_devices;
  apply_tuning_env(o);
  return o;
}

std::shared_ptr<const model_file> open_model(const engine_flags& f) {
  auto r = resolve_model(f.model);
  return model_file::open(r.model_path, f.tokenizer.empty() ? r.tokenizer_path : f.tokenizer);
}

void actor_env::configure() {
  register_message_types(cfg);
  // CAF's default work-stealing workers poll for work (spinning, then 50 us
  // sleeps) after every message; on 2 cores that steals time from PoCL's
  // kernel threads.  The sharing policy's workers block on a condition
  // variable: decode through the instance +30% (docs/bench_engine.md).
  // TROUPE_CAF_POLICY=stealing restores CAF's default for comparison.
  const char* policy = std::getenv("TROUPE_CAF_POLICY");
  cfg.set("scheduler.policy", caf::atom_from_string(policy ? policy : "sharing"));
}

actor_env::actor_env() {
  configure();
  sys = std::make_unique<caf::actor_system>(cfg);
}

actor_env::actor_env(const std::string& secret, const cluster_flags& c) {
  configure();
  identity = write_cluster_identity(secret);
  cfg.load<caf::io::middleman>();
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = identity->cert;
  cfg.openssl_key = identity->key;
  cfg.openssl_cafile = identity->cert;
  // A peer that stops answering without closing its connection (hung, cut
  // off) is declared lost after the timeout: its proxies go down and every
  // actor monitoring them hears of it (docs/architecture.md §3.4 "Recovery").
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(c.heartbeat_ms)});
  cfg.set("middleman.connection-timeout",
          caf::timespan{std::chrono::milliseconds(c.connection_timeout_ms)});
  try {
    sys = std::make_unique<caf::actor_system>(cfg);
  } catch (...) {
    remove_cluster_identity(*identity);
    throw;
  }
}

actor_env::~actor_env() {
  std::mutex m;
  std::condition_variable cv;
  bool ended = false;
  std::thread watchdog;
  if (exit_limit.count() > 0)
    watchdog = std::thread([&, raw = sys.get()] {
      std::unique_lock<std::mutex> lock(m);
      if (cv.wait_for(lock, exit_limit, [&] { return ended; })) return;
      // Every actor ended but the system still waits: CAF 0.17 frees a
      // detached actor (a device) only when the last reference to it goes,
      // and a message a cluster peer sent it around the stop can keep one.
      // Nothing is left to do, so that wait is cut short.  Actors that
      // still run are a bug: exit 70 says so.
      const size_t running = raw->registry().running();
      std::fprintf(stderr, "troupe: %zu actors still running %lld s after the stop; exiting\n",
                   running, static_cast<long long>(exit_limit.count()));
      if (identity) remove_cluster_identity(*identity);
      std::_Exit(running == 0 ? 0 : 70);
    });
  sys.reset();
  {
    std::lock_guard<std::mutex> lock(m);
    ended = true;
  }
  cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  if (identity) remove_cluster_identity(*identity);
}

// "host:port" -> (host, port); the host may be empty for all interfaces.
std::pair<std::string, uint16_t> split_address(const std::string& a, const char* what) {
  const auto colon = a.rfind(':');
  if (colon == std::string::npos)
    throw std::invalid_argument(std::string(what) + ": '" + a + "' is not HOST:PORT");
  const std::string port = a.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535)
    throw std::invalid_argument(std::string(what) + ": '" + a + "' has no port in [0, 65535]");
  return {a.substr(0, colon), static_cast<uint16_t>(p)};
}

std::string load_cluster_secret(const cluster_flags& c) {
  try {
    return c.secret_file.empty() ? read_or_make_secret_file(run_dir() + "/cluster.secret")
                                 : read_secret_file(c.secret_file);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--cluster-secret-file: ") + e.what());
  }
}

forward_fn blocking_forward(caf::actor_system& sys, device_actor dev) {
  auto self = std::make_shared<caf::scoped_actor>(sys);
  return [self, dev](const forward_batch& b) {
    forward_result out;
    std::string err;
    (*self)
        ->request(dev, caf::infinite, forward_atom::value, b)
        .receive([&](forward_result& r) { out = std::move(r); },
                 [&](caf::error& e) { err = (*self)->system().render(e); });
    if (!err.empty()) throw std::runtime_error(err);
    return out;
  };
}

device_info query_info(caf::actor_system& sys, device_actor dev) {
  caf::scoped_actor self{sys};
  device_info info;
  std::string err;
  self->request(dev, caf::infinite, info_atom::value)
      .receive([&](device_info& i) { info = std::move(i); },
               [&](caf::error& e) { err = sys.render(e); });
  if (!err.empty()) throw std::runtime_error("device info: " + err);
  return info;
}

}  // namespace troupe::cli
