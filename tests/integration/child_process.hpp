#pragma once
// A long-running troupe command as a child of the test: `sh -c "exec CMD
// 2>FILE"` with its stdout on a pipe the test reads start-up lines from,
// its stderr in a file, killed when the test process dies however it ends
// (PR_SET_PDEATHSIG) and by its pid when the object goes, pass or fail.
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, not the
// process: create a child on a thread that outlives it (a child started
// from a std::async task dies when the task ends).
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "process.hpp"

namespace troupe::testing {

class child_process {
 public:
  // `tag` names the stderr file (/tmp/troupe_TAG_PID_N.err).
  child_process(const std::string& command, const std::string& tag) {
    err_path_ = "/tmp/troupe_" + tag + "_" + std::to_string(::getpid()) + "_" +
                std::to_string(counter_++) + ".err";
    const std::string cmd = "exec " + command + " 2>" + err_path_;
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~child_process() {
    kill9();
    if (out_ >= 0) ::close(out_);
    std::remove(err_path_.c_str());
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  // Reads its stdout until a whole line starting with `prefix` has come;
  // false when it closed stdout or `timeout` passed first.
  bool wait_line(const std::string& prefix, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!has_line(prefix) && std::chrono::steady_clock::now() < until) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) break;
      text_.append(buf, static_cast<size_t>(n));
    }
    return has_line(prefix);
  }

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

  // The stdout text after `prefix` up to `stop` (or the end of the line).
  std::string field_after(const std::string& prefix, const std::string& stop) const {
    const auto at = text_.find(prefix);
    if (at == std::string::npos) return {};
    const auto from = at + prefix.size();
    const auto to = std::min(text_.find(stop, from), text_.find('\n', from));
    return text_.substr(from, to - from);
  }

  const std::string& stdout_text() const { return text_; }  // as read so far
  std::string stderr_text() const { return slurp(err_path_); }
  pid_t pid() const { return pid_; }
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Kills it as a crash would (a stopped process too), and reaps it.
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
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
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int out_ = -1;
  std::string text_;
  std::string err_path_;
};

}  // namespace troupe::testing
