#pragma once
// A connection to a running `troupe serve`'s admin endpoint (JSON over
// ZeroMQ, docs/security.md), shared by `troupe client admin` and `troupe
// shell`: finds the endpoint (the server names its admin port in its Pong,
// or --admin HOST:PORT), finds the secret, and makes calls that never hang
// (each has a timeout; a call that timed out leaves no stale reply behind).
#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace troupe::cli {

struct admin_target {
  std::string server;       // the client endpoint (tcp://host:port), to ask for the admin port
  std::string admin;        // HOST:PORT given directly; empty: ask the server
  std::string secret_file;  // empty: $TROUPE_ADMIN_SECRET, else the run folder's
  int timeout_ms = 10000;
};

// The outcome of one call: the result, or an error code and message.
struct admin_reply {
  bool ok = false;
  nlohmann::json result;
  std::string code;     // when !ok: the endpoint's code, or "unreachable" / "timeout"
  std::string message;  // when !ok: what went wrong, for people
};

// How long `layers` (a pipeline's layer move) waits at least: the router
// and the admin endpoint give it 10 minutes.
constexpr int k_layer_move_wait_ms = 600000;

// --admin, --secret-file and --admin-timeout-ms on `cmd` (troupe client
// admin and troupe shell say the same).
void add_admin_target_flags(CLI::App& cmd, admin_target& t, int default_timeout_ms);

class admin_link {
 public:
  explicit admin_link(admin_target t);
  ~admin_link();
  admin_link(const admin_link&) = delete;
  admin_link& operator=(const admin_link&) = delete;

  // Finds and checks the endpoint; false (with why()) when it cannot.
  bool connect();
  bool connected() const;
  const std::string& why() const { return why_; }
  std::string where() const;  // HOST:PORT once found

  // One command: {"command": name, ...args}; the secret is added (control,
  // else read-only for a read command).  It waits `wait_ms` for the answer
  // where more than --admin-timeout-ms (a command that answers once done).
  admin_reply call(const std::string& command, nlohmann::json args = nlohmann::json::object(),
                   int wait_ms = 0);

 private:
  struct impl;
  admin_target target_;
  std::unique_ptr<impl> impl_;
  std::string why_;
};

}  // namespace troupe::cli
