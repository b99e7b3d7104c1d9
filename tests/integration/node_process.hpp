#pragma once
// `troupe node` as a child process for the cluster tests: on 127.0.0.1 at
// a port the OS picked, with the test's cluster secret file; ready once it
// printed "troupe node: listening on"; killed by its pid when the object
// goes, pass or fail.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "child_process.hpp"
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
      : port_(free_port()),
        child_(troupe_bin() + " node --listen 127.0.0.1:" + std::to_string(port_) +
                   " --cluster-secret-file " + secret_path + " " + extra_args,
               "node") {
    if (!child_.wait_line("troupe node: listening on 127.0.0.1:" + std::to_string(port_),
                          std::chrono::seconds(30)))
      throw std::runtime_error("node did not get ready: '" + child_.stdout_text() + "' " +
                               child_.stderr_text());
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return child_.pid(); }
  std::string stderr_text() const { return child_.stderr_text(); }
  void signal(int sig) const { child_.signal(sig); }
  // Kills it as a crash would, and reaps it.
  void kill9() { child_.kill9(); }
  // Waits for it to exit by itself; its exit code, or -1 when it did not.
  int wait_exit(std::chrono::milliseconds timeout) { return child_.wait_exit(timeout); }

 private:
  int port_;
  child_process child_;
};

}  // namespace troupe::testing
