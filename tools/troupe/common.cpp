#include "tools/troupe/common.hpp"

#include <caf/io/all.hpp>
#include <caf/openssl/manager.hpp>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "net/secret.hpp"
#include "runtime/common/user_text.hpp"
#include "runtime/model/model_registry.hpp"

namespace troupe::cli {

void add_engine_flags(CLI::App& cmd, engine_settings& out, settings_flags::pick_fn pick) {
  auto flags = std::make_shared<settings_flags>(cmd, std::move(pick));
  // Before the command's own callback, which reads `out`.
  cmd.parse_complete_callback([flags, &out] { out = flags->resolve().engine; });
}

engine_options device_options(const engine_settings& e) {
  engine_options o = engine_options_from(e, {e.platform, e.device});
  // No scheduler here: the scratch is for --batch rows (max_batch_tokens
  // is serve's, not a flag of these commands).
  o.max_batch_tokens = e.batch;
  return o;
}

std::shared_ptr<const model_file> open_model(const engine_settings& e) {
  auto r = resolve_model(e.model);
  return model_file::open(r.model_path, e.tokenizer.empty() ? r.tokenizer_path : e.tokenizer);
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

actor_env::actor_env(const std::string& secret, const cluster_settings& c) {
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

CLI::Validator finite_number(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < 0 ||
            (!zero_ok && v == 0))
          return std::string(zero_ok ? "a finite number >= 0" : "a finite number > 0") + " (got " +
                 quoted_value(text) + ")";
        return {};
      },
      zero_ok ? "NUMBER >= 0" : "NUMBER > 0");
}

CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        if (!whole_text_as(text, v)) return "a whole number >= 0 (got " + quoted_value(text) + ")";
        return {};
      },
      "N >= 0");
}

// "host:port" -> (host, port); the host may be empty for all interfaces.
std::pair<std::string, uint16_t> split_address(const std::string& a, const char* what) {
  const auto colon = a.rfind(':');
  if (colon == std::string::npos)
    throw std::invalid_argument(std::string(what) + ": " + quoted_value(a) + " is not HOST:PORT");
  const long p = port_number(std::string_view(a).substr(colon + 1));
  if (p < 0)
    throw std::invalid_argument(std::string(what) + ": " + quoted_value(a) +
                                " has no port in [0, 65535]");
  return {a.substr(0, colon), static_cast<uint16_t>(p)};
}

std::string load_cluster_secret(const cluster_settings& c) {
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
