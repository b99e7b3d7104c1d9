#pragma once
// One admin request as the admin endpoint receives it (actors/admin_endpoint):
// a JSON object naming a command, carrying a secret and the command's
// arguments.  Parsed and type-checked here, apart from the socket, so that
// no field of any type can throw inside the endpoint's loop (a `"secret":
// null` once ended that loop for the life of the process) and so that the
// parser can be fuzzed alone (tests/fuzz/fuzz_admin_request.cpp).
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace troupe {

struct admin_request {
  std::string command, secret;
  uint64_t id = 0;                       // trace, cancel, migrate, preempt: a request id
  uint64_t instance = 0;                 // migrate, drain, kill, role: an instance id
  std::string key, value;                // set
  std::string node;                      // spawn, node_add, node_remove: HOST:PORT
  int32_t count = 0;                     // spawn, node_add (default 1)
  std::string role;                      // role
  int32_t from = 0, to = 0, layers = 0;  // layers: stages and how many layers move
  int32_t heads = 0;                     // heads: how many KV heads move (0: home)
  // Arguments the command cannot run with; empty when they are fine.  Kept
  // apart from admin_refusal so the endpoint answers an unauthenticated
  // peer "unauthenticated" before telling it anything about arguments.
  std::string argument_error;
};

// A body that is not a request at all (not a JSON object, a secret or a
// command that is not a string): refused before authentication.
struct admin_refusal {
  std::string code = "bad_request";
  std::string message;
};

// Never throws, for any bytes.
std::variant<admin_request, admin_refusal> parse_admin_request(std::string_view body);

// True for the commands a read-only secret may run.
bool admin_command_is_read_only(const std::string& command);

}  // namespace troupe
