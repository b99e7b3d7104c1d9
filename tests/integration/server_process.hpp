#pragma once
// `troupe serve` as a child process for the integration tests: started on a
// port the OS picks (and an admin port it picks), ready once it has printed
// its start-up lines, killed when the object goes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "child_process.hpp"
#include "net.hpp"
#include "process.hpp"

namespace troupe::testing {

// Whether a TCP socket can bind 127.0.0.1:port now (no SO_REUSEADDR, so a
// port still in TIME_WAIT counts as taken too).
inline bool port_bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a = loopback(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The ports a test may hand out: those outside the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), below it where there is room, else above.
// Read once a process: free_port() calls it under its lock.
inline std::pair<int, int> test_port_range() {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  if (lo - 1 - 10000 >= 4096) return {10000, lo - 1};
  if (65535 - (hi + 1) >= 4096) return {hi + 1, 65535};
  return {0, 0};  // no room outside it: the OS picks
}

// A TCP port on 127.0.0.1 nobody listens on now, for a child told to listen
// on it.  Not one the OS picks by bind(port 0): that port is free again
// once this returns, and every bind(0) on the host (a parallel test's server
// taking its ZeroMQ or admin port, the child itself) draws from the
// ephemeral range, so one of them could take it first ("service.metrics_port:
// cannot listen on 127.0.0.1:34827: Address already in use" in a fresh-clone
// CI).  Outside that range only callers of this function compete: each
// process draws from its own random sequence and never hands out a port
// twice.
inline int free_port() {
  static std::mutex mutex;
  static std::set<int> given;
  static std::mt19937 rng(
      static_cast<unsigned>(::getpid()) * 2654435761u ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  const std::lock_guard<std::mutex> lock(mutex);
  static const std::pair<int, int> range = test_port_range();
  const auto [lo, hi] = range;
  if (lo != 0) {
    std::uniform_int_distribution<int> pick(lo, hi);
    for (int tries = 0; tries < 2000; ++tries) {
      const int port = pick(rng);
      if (given.count(port) == 0 && port_bindable(port)) {
        given.insert(port);
        return port;
      }
    }
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("no free port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

class server_process {
 public:
  // `extra_args` go to `troupe serve -m MODEL --listen tcp://127.0.0.1:*` (stories15m unless
  // `model` says otherwise).
  // Ready when a whole stdout line starting with `ready_line` has come (the
  // listening line by default; "troupe serve: metrics on " waits for the
  // metrics endpoint too).  Throws with the server's stderr if it is not
  // ready within 60 s or exits.
  explicit server_process(const std::string& extra_args = "",
                          const std::string& ready_line = "troupe serve: listening on ",
                          const std::string& model = "stories15m")
      : child_(troupe_bin() + " serve -m " + model + " --listen 'tcp://127.0.0.1:*' " + extra_args,
               "serve") {
    const std::string listening = "troupe serve: listening on ";
    if (!child_.wait_line(ready_line, std::chrono::seconds(60)) ||
        child_.stdout_text().rfind(listening, 0) != 0)
      throw std::runtime_error("server did not get ready: '" + child_.stdout_text() + "' " +
                               child_.stderr_text());
    endpoint_ = child_.field_after(listening, " ");
    if (child_.has_line("troupe serve: admin on "))
      admin_port_ = std::stoi(child_.field_after("troupe serve: admin on 127.0.0.1:", "\n"));
    if (child_.has_line("troupe serve: metrics on "))
      metrics_port_ =
          std::stoi(child_.field_after("troupe serve: metrics on http://127.0.0.1:", "/"));
  }

  const std::string& endpoint() const { return endpoint_; }
  int admin_port() const { return admin_port_; }      // 0: none printed
  int metrics_port() const { return metrics_port_; }  // 0: none printed
  const std::string& startup_text() const { return child_.stdout_text(); }
  std::string stderr_text() const { return child_.stderr_text(); }

  void signal(int sig) { child_.signal(sig); }
  pid_t pid() const { return child_.pid(); }

  // Resident memory of the server now, in KiB (VmRSS), or -1.
  long rss_kib() const {
    const std::string status = slurp("/proc/" + std::to_string(pid()) + "/status");
    const auto at = status.find("VmRSS:");
    return at == std::string::npos ? -1 : std::stol(status.substr(at + 6));
  }

  // `troupe client --server EP admin ARGS --json` (the command-line
  // contract: the admin endpoint found through the server), as it ended.
  process_result admin_command(const std::string& args,
                               const std::string& client_flags = "") const {
    return run_process(troupe_bin() + " client --server " + shell_quote(endpoint_) + " " +
                       client_flags + " admin " + args + " --json");
  }

  // The same, its stdout as JSON.  Throws with the command's stderr when it
  // fails.
  nlohmann::json admin(const std::string& args, const std::string& client_flags = "") const {
    auto r = admin_command(args, client_flags);
    if (r.exit_code != 0)
      throw std::runtime_error("admin " + args + ": exit " + std::to_string(r.exit_code) + ": " +
                               r.err);
    return nlohmann::json::parse(r.out);
  }

  // Polls admin until no instance holds a sequence or a used page, up to
  // `timeout`; returns the last `admin instances` answer.
  nlohmann::json wait_engine_idle(std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    nlohmann::json last;
    for (;;) {
      last = admin("instances");
      bool idle = true;
      for (const auto& i : last)
        idle = idle && i["running"] == 0 && i["waiting"] == 0 && i["kv"]["used_pages"] == 0;
      if (idle || std::chrono::steady_clock::now() >= until) return last;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // Polls `admin instances` until `n` instances are listed, up to `timeout`;
  // returns the last answer.  A node whose first start-up attempt failed
  // (a 2-core host under load) is tried again by its link, so a test of
  // nodes waits for them rather than reading the first answer.
  nlohmann::json wait_instances(size_t n, std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto last = admin("instances");
      if (last.size() >= n || std::chrono::steady_clock::now() >= until) return last;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // Waits for the exit; the exit code, or -1 if it did not exit in time.
  int wait_exit(std::chrono::milliseconds timeout) { return child_.wait_exit(timeout); }

 private:
  child_process child_;
  std::string endpoint_;
  int admin_port_ = 0, metrics_port_ = 0;
};

}  // namespace troupe::testing
