#pragma once
// `troupe node` as a child process for the cluster tests: on 127.0.0.1 at
// a port the OS picked, with the test's cluster secret file; ready once it
// printed "troupe node: listening on"; killed by its pid when the object
// goes, pass or fail.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "process.hpp"
#include "server_process.hpp"

namespace troupe::testing {

// A cluster secret file (mode 600) for one test, removed with it.
class secret_file {
 public:
  explicit secret_file(const std::string& secret) {
    path_ = "/tmp/troupe_cluster_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) +
            ".secret";
    std::FILE* f = std::fopen(path_.c_str(), "w");
    std::fputs(secret.c_str(), f);
    std::fclose(f);
    ::chmod(path_.c_str(), 0600);
  }
  ~secret_file() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

class node_process {
 public:
  node_process(const std::string& secret_path, const std::string& extra_args = "")
      : port_(free_port()) {
    err_path_ =
        "/tmp/troupe_node_" + std::to_string(::getpid()) + "_" + std::to_string(port_) + ".err";
    const std::string cmd =
        "exec " + troupe_bin() + " node --listen 127.0.0.1:" + std::to_string(port_) +
        " --cluster-secret-file " + secret_path + " " + extra_args + " 2>" + err_path_;
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
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
    std::string text;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (text.find("troupe node: listening on") == std::string::npos &&
           std::chrono::steady_clock::now() < until) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    if (text.find("troupe node: listening on 127.0.0.1:" + std::to_string(port_)) ==
        std::string::npos) {
      const std::string why = "node did not get ready: '" + text + "' " + stderr_text();
      kill9();
      std::remove(err_path_.c_str());
      throw std::runtime_error(why);
    }
  }
  ~node_process() {
    kill9();
    std::remove(err_path_.c_str());
  }
  node_process(const node_process&) = delete;
  node_process& operator=(const node_process&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string stderr_text() const { return slurp(err_path_); }
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Kills it as a crash would, and reaps it.
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);  // a stopped process dies too
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Waits for it to exit by itself; its exit code, or -1 when it did not.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      ::usleep(20000);
    }
    return -1;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  std::string err_path_;
};

}  // namespace troupe::testing
