#pragma once
// Runs a command in a real process and captures its exit code, stdout and
// stderr: the integration tests drive the troupe binary the way users do.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace troupe::testing {

struct process_result {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline process_result run_process(const std::string& command) {
  static int counter = 0;
  const std::string base =
      "/tmp/troupe_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string full = command + " >" + base + ".out 2>" + base + ".err";
  process_result r;
  int status = std::system(full.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

// The troupe binary the tests run: $TROUPE_BIN when set (to check a test
// against another build, e.g. one from before a fix), else this build's.
inline std::string troupe_bin() {
  if (const char* b = std::getenv("TROUPE_BIN"); b && *b) return b;
  return std::string(TROUPE_BINARY_DIR) + "/troupe";
}

}  // namespace troupe::testing
