#include "net/admin_request.hpp"

#include <climits>
#include <nlohmann/json.hpp>

namespace troupe {

namespace {

using json = nlohmann::json;

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

// A string field: absent is "", any other type is an error.
bool string_field(const json& req, const char* key, std::string& out) {
  const auto it = req.find(key);
  if (it == req.end()) return true;
  if (!it->is_string()) return false;
  out = it->get<std::string>();
  return true;
}

bool unsigned_field(const json& req, const char* key, uint64_t& out) {
  const auto it = req.find(key);
  if (it == req.end() || !it->is_number_unsigned()) return false;
  out = it->get<uint64_t>();
  return true;
}

// A small count or index: an integer in [0, 65535].
bool small_field(const json& req, const char* key, int32_t& out) {
  const auto it = req.find(key);
  if (it == req.end() || !it->is_number_integer()) return false;
  const bool fits = it->is_number_unsigned()
                        ? it->get<uint64_t>() <= 65535
                        : it->get<int64_t>() >= 0 && it->get<int64_t>() <= 65535;
  if (!fits) return false;
  out = static_cast<int32_t>(it->get<int64_t>());
  return true;
}

// The command's own arguments; "" when they are fine.
std::string check_arguments(const json& req, admin_request& r) {
  const std::string& c = r.command;
  if (one_of(c, {"trace", "cancel", "migrate", "preempt"}) && !unsigned_field(req, "id", r.id))
    return c + " needs \"id\": a request id (unsigned)";
  if (one_of(c, {"migrate", "drain", "kill", "role", "layers", "heads"}) &&
      !unsigned_field(req, "instance", r.instance))
    return c + " needs \"instance\": an instance id (unsigned)";
  if (c == "set" && (!string_field(req, "key", r.key) || !string_field(req, "value", r.value) ||
                     r.key.empty() || r.value.empty()))
    return "set needs \"key\" and \"value\" (strings)";
  if (c == "node_remove" && (!string_field(req, "node", r.node) || r.node.empty()))
    return "node_remove needs \"node\" (HOST:PORT)";
  if (c == "node_add" && req.find("count") == req.end()) r.count = 1;
  if (c == "spawn" || (c == "node_add" && req.find("count") != req.end())) {
    const auto count = req.find("count");
    if (!string_field(req, "node", r.node) || r.node.empty() || count == req.end() ||
        !count->is_number_integer())
      return c + " needs \"node\" (HOST:PORT) and \"count\"";
    // Read wide: get<int32_t> wrapped 2^32 + 1 to 1.  The node link
    // checks the range (1 to 64).
    const bool fits = count->is_number_unsigned() ? count->get<uint64_t>() <= INT32_MAX
                                                  : count->get<int64_t>() >= INT32_MIN &&
                                                        count->get<int64_t>() <= INT32_MAX;
    if (!fits) return c + ": give 1 to 64 instances, not " + count->dump();
    r.count = static_cast<int32_t>(count->get<int64_t>());
  }
  if (c == "node_add" && (!string_field(req, "node", r.node) || r.node.empty()))
    return "node_add needs \"node\" (HOST:PORT)";
  if (c == "layers" && (!small_field(req, "from", r.from) || !small_field(req, "to", r.to) ||
                        !small_field(req, "layers", r.layers)))
    return "layers needs \"from\" and \"to\" (neighbouring stages) and \"layers\" (how many "
           "move), integers 0 to 65535";
  if (c == "heads" && (!small_field(req, "from", r.from) || !small_field(req, "to", r.to) ||
                       !small_field(req, "heads", r.heads)))
    return "heads needs \"from\" and \"to\" (two stages) and \"heads\" (how many KV heads "
           "move; 0 brings them home), integers 0 to 65535";
  if (c == "role" && (!string_field(req, "role", r.role) || r.role.empty()))
    return "role needs \"role\": prefill, decode, mixed or encode";
  return "";
}

}  // namespace

std::variant<admin_request, admin_refusal> parse_admin_request(std::string_view body) {
  // nlohmann's parser and destructor keep their own stacks (no recursion
  // per level), so a deeply nested body costs heap, bounded by the
  // endpoint's frame cap (admin_endpoint_options::max_message_bytes).
  json req = json::parse(body, nullptr, false);
  if (req.is_discarded() || !req.is_object())
    return admin_refusal{"bad_request", "the request is not a JSON object"};
  admin_request r;
  if (!string_field(req, "secret", r.secret))
    return admin_refusal{"bad_request", "\"secret\" must be a string"};
  if (!string_field(req, "command", r.command))
    return admin_refusal{"bad_request", "\"command\" must be a string"};
  r.argument_error = check_arguments(req, r);
  return r;
}

bool admin_command_is_read_only(const std::string& command) {
  return one_of(command, {"instances", "nodes", "requests", "trace", "kv", "config", "monitor",
                          "steps", "dp", "experts"});
}

}  // namespace troupe
