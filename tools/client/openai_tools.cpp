#include "tools/client/openai_tools.hpp"

#include <random>

namespace troupe::openai {

namespace {

using json = nlohmann::json;
using in_json = nlohmann::ordered_json;

std::string call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[25];
  std::snprintf(buf, sizeof buf, "call_%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

const char* const k_open = "<tool_call>";
const char* const k_close = "</tool_call>";

// One {"name", "arguments"} object naming a known tool, as a call.
std::optional<tool_call> as_call(const in_json& j, const tool_request& t) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  bool known = false;
  for (const auto& spec : t.tools) known = known || spec.name == name;
  if (!known) return std::nullopt;
  const in_json args = j.contains("arguments") ? j["arguments"] : in_json::object();
  if (!args.is_object()) return std::nullopt;
  return tool_call{call_id(), name, args.dump()};
}

}  // namespace

std::optional<api_error> parse_tools(const in_json& body, tool_request& out) {
  out = tool_request{};
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array())
      return invalid_request("tools", "'tools' must be a list of {type: function, function}");
    if (it->size() > 128) return invalid_request("tools", "at most 128 tools");
    for (const auto& t : *it) {
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
          !t.contains("function") || !t["function"].is_object())
        return invalid_request("tools",
                               "each tool must be {\"type\": \"function\", \"function\": {...}}");
      const auto& f = t["function"];
      tool_spec spec;
      if (!f.contains("name") || !f["name"].is_string() ||
          !valid_name(f["name"].get<std::string>()))
        return invalid_request("tools",
                               "a function's 'name' must be 1 to 64 letters, digits, '_' or '-'");
      spec.name = f["name"].get<std::string>();
      for (const auto& other : out.tools)
        if (other.name == spec.name)
          return invalid_request("tools", "two tools named '" + spec.name + "'");
      if (f.contains("description") && !f["description"].is_null()) {
        if (!f["description"].is_string())
          return invalid_request("tools", "a function's 'description' must be a string");
        spec.description = f["description"].get<std::string>();
      }
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object())
          return invalid_request("tools", "a function's 'parameters' must be a JSON schema object");
        spec.parameters = f["parameters"];
      }
      out.tools.push_back(std::move(spec));
    }
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c == "none")
        out.pick = tool_request::choice::none;
      else if (c == "auto")
        out.pick = tool_request::choice::automatic;
      else if (c == "required")
        out.pick = tool_request::choice::required;
      else
        return invalid_request("tool_choice",
                               "'tool_choice' must be none, auto, required or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
               (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
      out.pick = tool_request::choice::named;
      out.named = (*it)["function"]["name"].get<std::string>();
      bool known = false;
      for (const auto& t : out.tools) known = known || t.name == out.named;
      if (!known)
        return invalid_request("tool_choice",
                               "'tool_choice' names '" + out.named + "', not a tool");
    } else {
      return invalid_request("tool_choice",
                             "'tool_choice' must be none, auto, required or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (out.tools.empty() && out.pick != tool_request::choice::none &&
        out.pick != tool_request::choice::automatic)
      return invalid_request("tool_choice", "'tool_choice' needs 'tools'");
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return invalid_request("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    out.parallel = it->get<bool>();
  }
  return std::nullopt;
}

std::string tools_prompt(const tool_request& t) {
  // Qwen 2.5's wording, which Hermes-trained and ChatML models know.
  std::string s =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& spec : t.tools) {
    in_json f = {{"name", spec.name}};
    if (!spec.description.empty()) f["description"] = spec.description;
    f["parameters"] = spec.parameters;
    s += '\n';
    s += in_json{{"type", "function"}, {"function", f}}.dump();
  }
  s += "\n</tools>\n\nFor each function call, return a json object with function name and "
       "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
       "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
  return s;
}

std::string forced_schema(const tool_request& t) {
  in_json alternatives = in_json::array();
  for (const auto& spec : t.tools) {
    if (t.pick == tool_request::choice::named && spec.name != t.named) continue;
    alternatives.push_back(
        {{"type", "object"},
         {"properties", {{"name", {{"const", spec.name}}}, {"arguments", spec.parameters}}}});
  }
  const in_json one = alternatives.size() == 1 ? alternatives[0] : in_json{{"anyOf", alternatives}};
  if (t.parallel && t.pick == tool_request::choice::required)
    return in_json{{"type", "array"}, {"items", one}, {"minItems", 1}, {"maxItems", 4}}.dump();
  return one.dump();
}

std::optional<api_error> tool_message(const in_json& m, std::string& role, std::string& content,
                                      bool& is_tool_message) {
  is_tool_message = false;
  const std::string r = m["role"].get<std::string>();
  if (r == "tool") {
    is_tool_message = true;
    const auto c = m.find("content");
    std::string text;
    if (c != m.end() && c->is_string())
      text = c->get<std::string>();
    else if (c != m.end() && c->is_array()) {
      for (const auto& part : *c)
        if (part.is_object() && part.contains("text") && part["text"].is_string())
          text += part["text"].get<std::string>();
    } else {
      return invalid_request("messages",
                             "a tool message's 'content' must be a string or text parts");
    }
    // Tool results come back as the user's words (Qwen's template does so).
    role = "user";
    content = "<tool_response>\n" + text + "\n</tool_response>";
    return std::nullopt;
  }
  if (r != "assistant" || !m.contains("tool_calls") || m["tool_calls"].is_null())
    return std::nullopt;
  const auto& calls = m["tool_calls"];
  if (!calls.is_array())
    return invalid_request("messages", "an assistant's 'tool_calls' must be a list");
  is_tool_message = true;
  role = "assistant";
  content.clear();
  if (m.contains("content") && m["content"].is_string()) content = m["content"].get<std::string>();
  for (const auto& call : calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string())
      return invalid_request("messages", "each tool call needs 'function': {'name', 'arguments'}");
    const auto& f = call["function"];
    in_json args = in_json::object();
    if (f.contains("arguments") && f["arguments"].is_string())
      args = in_json::parse(f["arguments"].get<std::string>(), nullptr, false);
    else if (f.contains("arguments") && f["arguments"].is_object())
      args = f["arguments"];
    if (args.is_discarded() || !args.is_object())
      return invalid_request("messages",
                             "a tool call's 'arguments' must be a JSON object (or its text)");
    if (!content.empty()) content += "\n";
    content += std::string(k_open) + "\n" +
               in_json{{"name", f["name"]}, {"arguments", args}}.dump() + "\n" + k_close;
  }
  return std::nullopt;
}

parsed_reply parse_reply(const std::string& text, const tool_request& t) {
  parsed_reply r;
  if (t.forced()) {
    // The constraint made the whole output one call, or a list of them.
    const in_json j = in_json::parse(text, nullptr, false);
    if (j.is_array()) {
      for (const auto& one : j)
        if (auto c = as_call(one, t)) r.calls.push_back(*c);
    } else if (auto c = as_call(j, t)) {
      r.calls.push_back(*c);
    }
    if (r.calls.empty()) r.content = text;
    return r;
  }
  std::string rest;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(k_open, at);
    if (open == std::string::npos) break;
    const size_t body = open + std::string(k_open).size();
    const size_t close = text.find(k_close, body);
    const std::string inner =
        text.substr(body, close == std::string::npos ? std::string::npos : close - body);
    auto c = as_call(in_json::parse(inner, nullptr, false), t);
    if (c && (t.parallel || r.calls.empty())) {
      rest += text.substr(at, open - at);
      r.calls.push_back(*c);
      at = close == std::string::npos ? text.size() : close + std::string(k_close).size();
    } else {
      rest += text.substr(at, body - at);
      at = body;
    }
  }
  rest += text.substr(std::min(at, text.size()));
  const size_t b = rest.find_first_not_of(" \t\r\n"), e = rest.find_last_not_of(" \t\r\n");
  const std::string trimmed = b == std::string::npos ? "" : rest.substr(b, e - b + 1);
  if (r.calls.empty())
    r.content = text;
  else if (!trimmed.empty())
    r.content = trimmed;
  return r;
}

json tool_calls_json(const std::vector<tool_call>& calls, bool delta) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json one = {{"id", calls[i].id},
                {"type", "function"},
                {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (delta) one["index"] = i;
    out.push_back(std::move(one));
  }
  return out;
}

}  // namespace troupe::openai
