#pragma once
// `troupe serve` as a child process for the integration tests: started on a
// port the OS picks (and an admin port it picks), ready once it has printed
// its start-up lines, killed when the object goes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "process.hpp"

namespace troupe::testing {

// A TCP port on 127.0.0.1 nobody listens on now (the OS picks it).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
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
  // `extra_args` go to `troupe serve -m stories15m --listen tcp://127.0.0.1:*`.
  // Ready when a whole stdout line starting with `ready_line` has come (the
  // listening line by default; "troupe serve: metrics on " waits for the
  // metrics endpoint too).  Throws with the server's stderr if it is not
  // ready within 60 s or exits.
  explicit server_process(const std::string& extra_args = "",
                          const std::string& ready_line = "troupe serve: listening on ") {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    err_path_ = "/tmp/troupe_serve_" + std::to_string(::getpid()) + "_" +
                std::to_string(counter_++) + ".err";
    const std::string cmd = "exec " + troupe_bin() +
                            " serve -m stories15m --listen 'tcp://127.0.0.1:*' " + extra_args +
                            " 2>" + err_path_;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the test, however it ends
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!has_line(ready_line) && std::chrono::steady_clock::now() < until) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) break;
      text_.append(buf, static_cast<size_t>(n));
    }
    const std::string listening = "troupe serve: listening on ";
    if (!has_line(ready_line) || text_.rfind(listening, 0) != 0) {
      const std::string why = "server did not get ready: '" + text_ + "' " + stderr_text();
      stop();
      throw std::runtime_error(why);
    }
    endpoint_ = field_after(listening, " ");
    if (has_line("troupe serve: admin on "))
      admin_port_ = std::stoi(field_after("troupe serve: admin on 127.0.0.1:", "\n"));
    if (has_line("troupe serve: metrics on "))
      metrics_port_ = std::stoi(field_after("troupe serve: metrics on http://127.0.0.1:", "/"));
  }

  ~server_process() { stop(); }
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  int admin_port() const { return admin_port_; }      // 0: none printed
  int metrics_port() const { return metrics_port_; }  // 0: none printed
  const std::string& startup_text() const { return text_; }
  std::string stderr_text() const { return slurp(err_path_); }

  void signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }

  // Resident memory of the server now, in KiB (VmRSS), or -1.
  long rss_kib() const {
    const std::string status = slurp("/proc/" + std::to_string(pid_) + "/status");
    const auto at = status.find("VmRSS:");
    return at == std::string::npos ? -1 : std::stol(status.substr(at + 6));
  }

  // `troupe client --server EP admin ARGS --json`, its stdout as JSON (the
  // command-line contract: the admin endpoint found through the server).
  // Throws with the command's stderr when it fails.
  nlohmann::json admin(const std::string& args, const std::string& client_flags = "") const {
    auto r = run_process(troupe_bin() + " client --server " + shell_quote(endpoint_) + " " +
                         client_flags + " admin " + args + " --json");
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

  // Waits for the exit; the exit code, or -1 if it did not exit in time.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  // A whole line (newline included) starting with `prefix` has come.
  bool has_line(const std::string& prefix) const {
    for (size_t at = 0; at < text_.size();) {
      const auto end = text_.find('\n', at);
      if (end == std::string::npos) return false;
      if (text_.compare(at, prefix.size(), prefix) == 0) return true;
      at = end + 1;
    }
    return false;
  }

  // The text after `prefix` up to `stop` (or the end of the line).
  std::string field_after(const std::string& prefix, const std::string& stop) const {
    const auto at = text_.find(prefix);
    if (at == std::string::npos) return {};
    const auto from = at + prefix.size();
    const auto to = std::min(text_.find(stop, from), text_.find('\n', from));
    return text_.substr(from, to - from);
  }

  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (out_ >= 0) ::close(out_);
    out_ = -1;
    std::remove(err_path_.c_str());
  }

  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int out_ = -1;
  std::string text_;  // what it printed to stdout until ready
  std::string endpoint_;
  int admin_port_ = 0, metrics_port_ = 0;
  std::string err_path_;
};

}  // namespace troupe::testing
