#include "tools/client/openai_tools.hpp"

#include <algorithm>
#include <cstring>
#include <random>

#include "runtime/common/json_depth.hpp"

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

constexpr int k_max_arguments_depth = 100;  // as the request body's (openai_api.cpp)

const char* const k_open = "<tool_call>";
const char* const k_close = "</tool_call>";

// Mistral's v3 templates put a space after each tag, v3-tekken's none.
const char* gap(tool_format f) {
  return f == tool_format::mistral_v3 ? " " : "";
}

// The key of a call's arguments in t's format.
const char* args_key(tool_format f) {
  return f == tool_format::llama3 ? "parameters" : "arguments";
}

// One {"name", "arguments"} object ("parameters" for Llama 3) naming a
// known tool, as a call.
std::optional<tool_call> as_call(const in_json& j, const tool_request& t) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  bool known = false;
  for (const auto& spec : t.tools) known = known || spec.name == name;
  if (!known) return std::nullopt;
  // Llama 3 models write "parameters" as their template asks, and at
  // times "arguments": either is read.
  const char* key = args_key(t.format);
  if (!j.contains(key) && j.contains("arguments")) key = "arguments";
  const in_json args = j.contains(key) ? j[key] : in_json::object();
  if (!args.is_object()) return std::nullopt;
  return tool_call{call_id(), name, args.dump()};
}

// JSON as Python's json.dumps writes it by default (", " and ": "), which
// the templates' `tojson` filter is.
std::string py_json(const in_json& j) {
  if (j.is_object()) {
    std::string s = "{";
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it != j.begin()) s += ", ";
      s += in_json(it.key()).dump() + ": " + py_json(it.value());
    }
    return s + "}";
  }
  if (j.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < j.size(); ++i) s += (i ? ", " : "") + py_json(j[i]);
    return s + "]";
  }
  return j.dump(-1, ' ', false, in_json::error_handler_t::replace);
}

// The tool as OpenAI's request wrote it, for the templates that print it.
in_json tool_object(const tool_spec& spec) {
  in_json f = {{"name", spec.name}};
  if (!spec.description.empty()) f["description"] = spec.description;
  f["parameters"] = spec.parameters;
  return {{"type", "function"}, {"function", f}};
}

// Mistral's call ids are 9 letters or digits: an OpenAI id's last ones.
std::string mistral_id(const std::string& id) {
  std::string alnum;
  for (char c : id)
    if (std::isalnum(static_cast<unsigned char>(c))) alnum += c;
  if (alnum.size() > 9) alnum = alnum.substr(alnum.size() - 9);
  return std::string(9 - alnum.size(), '0') + alnum;
}

// A message's text content: a string or text parts.
std::optional<std::string> text_of(const in_json& m) {
  const auto c = m.find("content");
  if (c != m.end() && c->is_string()) return c->get<std::string>();
  if (c == m.end() || !c->is_array()) return std::nullopt;
  std::string text;
  for (const auto& part : *c) {
    // Only text parts (an image in a tool's result is refused, as in a
    // user message, not dropped).
    if (!part.is_object() || !part.contains("text") || !part["text"].is_string())
      return std::nullopt;
    if (part.contains("type") && part["type"] != "text") return std::nullopt;
    text += part["text"].get<std::string>();
  }
  return text;
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
    s += '\n';
    s += tool_object(spec).dump();
  }
  s += "\n</tools>\n\nFor each function call, return a json object with function name and "
       "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
       "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
  return s;
}

std::optional<api_error> place_tools(const tool_request& t,
                                     std::vector<std::pair<std::string, std::string>>& msgs) {
  switch (t.format) {
    case tool_format::hermes:
      if (!msgs.empty() && msgs.front().first == "system")
        msgs.front().second += "\n\n" + tools_prompt(t);
      else
        msgs.insert(msgs.begin(), {"system", tools_prompt(t)});
      return std::nullopt;
    case tool_format::llama3: {
      // Llama 3.1-3.3's template with tools_in_user_message (its default).
      auto user =
          std::find_if(msgs.begin(), msgs.end(), [](const auto& m) { return m.first == "user"; });
      if (user == msgs.end())
        return invalid_request("messages", "tools for this model's template need a user message");
      std::string s =
          "Given the following functions, please respond with a JSON for a function call with its "
          "proper arguments that best answers the given prompt.\n\nRespond in the format "
          "{\"name\": function name, \"parameters\": dictionary of argument name and its "
          "value}.Do not use variables.\n\n";
      for (const auto& spec : t.tools) s += tool_object(spec).dump(4) + "\n\n";
      user->second = s + user->second;
      return std::nullopt;
    }
    case tool_format::mistral:
    case tool_format::mistral_v3: {
      // Mistral's v3 templates: the tools just before the last user turn.
      auto last =
          std::find_if(msgs.rbegin(), msgs.rend(), [](const auto& m) { return m.first == "user"; });
      if (last == msgs.rend())
        return invalid_request("messages", "tools for this model's template need a user message");
      std::string s = std::string("[AVAILABLE_TOOLS]") + gap(t.format) + "[";
      for (size_t i = 0; i < t.tools.size(); ++i) {
        const auto& spec = t.tools[i];
        // As the template prints it: string values between quotes as they
        // are, the parameters through tojson.
        s += "{\"type\": \"function\", \"function\": {\"name\": \"" + spec.name + "\"";
        if (!spec.description.empty()) s += ", \"description\": \"" + spec.description + "\"";
        s += ", \"parameters\": " + py_json(spec.parameters) + "}}";
        s += i + 1 < t.tools.size() ? ", " : "]";
      }
      s += "[/AVAILABLE_TOOLS]";
      msgs.insert(last.base() - 1, {"available_tools", s});
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string forced_schema(const tool_request& t) {
  in_json alternatives = in_json::array();
  for (const auto& spec : t.tools) {
    if (t.pick == tool_request::choice::named && spec.name != t.named) continue;
    alternatives.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"const", spec.name}}}, {args_key(t.format), spec.parameters}}}});
  }
  const in_json one = alternatives.size() == 1 ? alternatives[0] : in_json{{"anyOf", alternatives}};
  const bool several = t.parallel && t.pick == tool_request::choice::required;
  if (is_mistral(t.format))  // always a list (what follows [TOOL_CALLS])
    return in_json{
        {"type", "array"}, {"items", one}, {"minItems", 1}, {"maxItems", several ? 4 : 1}}
        .dump();
  if (several && t.format == tool_format::hermes)  // (Llama 3 calls one function at a time)
    return in_json{{"type", "array"}, {"items", one}, {"minItems", 1}, {"maxItems", 4}}.dump();
  return one.dump();
}

std::optional<api_error> tool_message(const in_json& m, tool_format format, std::string& role,
                                      std::string& content, bool& is_tool_message) {
  is_tool_message = false;
  const std::string r = m["role"].get<std::string>();
  if (r == "tool") {
    is_tool_message = true;
    const auto text = text_of(m);
    if (!text)
      return invalid_request("messages",
                             "a tool message's 'content' must be a string or text parts");
    if (format == tool_format::llama3) {
      role = "ipython";
      content = in_json(*text).dump();  // its template's tojson of the content, quotes and all
    } else if (is_mistral(format)) {
      const auto id = m.find("tool_call_id");
      role = "tool_results";
      content = std::string("[TOOL_RESULTS]") + gap(format) + "{\"content\": " + *text +
                ", \"call_id\": \"" +
                mistral_id(id != m.end() && id->is_string() ? id->get<std::string>() : "") +
                "\"}[/TOOL_RESULTS]";
    } else {
      // Tool results come back as the user's words (Qwen's template does so).
      role = "user";
      content = "<tool_response>\n" + *text + "\n</tool_response>";
    }
    return std::nullopt;
  }
  if (r != "assistant" || !m.contains("tool_calls") || m["tool_calls"].is_null())
    return std::nullopt;
  const auto& calls = m["tool_calls"];
  if (!calls.is_array())
    return invalid_request("messages", "an assistant's 'tool_calls' must be a list");
  is_tool_message = true;
  role = is_mistral(format) ? "tool_calls" : "assistant";
  content.clear();
  if (format == tool_format::hermes && m.contains("content") && m["content"].is_string())
    content = m["content"].get<std::string>();
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& call = calls[i];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string())
      return invalid_request("messages", "each tool call needs 'function': {'name', 'arguments'}");
    const auto& f = call["function"];
    in_json args = in_json::object();
    if (f.contains("arguments") && f["arguments"].is_string())
      args = parse_json_within<in_json>(f["arguments"].get<std::string>(), k_max_body_depth);
    else if (f.contains("arguments") && f["arguments"].is_object())
      args = f["arguments"];
    if (args.is_discarded() || !args.is_object())
      return invalid_request("messages",
                             "a tool call's 'arguments' must be a JSON object (or its text)");
    // Text the body's own depth check could not see into: dumping it
    // recurses once per level.
    if (json_nests_deeper(args, k_max_arguments_depth))
      return invalid_request("messages", "a tool call's 'arguments' nest more than " +
                                             std::to_string(k_max_arguments_depth) +
                                             " levels deep");
    const std::string name = f["name"].get<std::string>();
    if (format == tool_format::llama3) {
      // One call a turn in its template: the first (the others are
      // dropped, as llama.cpp's handler for it does).
      if (i == 0) content = "{\"name\": \"" + name + "\", \"parameters\": " + py_json(args) + "}";
    } else if (is_mistral(format)) {
      const auto id = call.find("id");
      std::string one = py_json(in_json{{"name", name}, {"arguments", args}});
      one.pop_back();
      one += ", \"id\": \"" +
             mistral_id(id != call.end() && id->is_string() ? id->get<std::string>() : "") + "\"}";
      content += (i == 0 ? std::string("[TOOL_CALLS]") + gap(format) + "[" : ", ") + one +
                 (i + 1 == calls.size() ? "]" : "");
    } else {
      if (!content.empty()) content += "\n";
      content += std::string(k_open) + "\n" + in_json{{"name", name}, {"arguments", args}}.dump() +
                 "\n" + k_close;
    }
  }
  return std::nullopt;
}

parsed_reply parse_reply(const std::string& text, const tool_request& t) {
  parsed_reply r;
  if (t.format != tool_format::hermes) {
    // The whole reply is the call(s) or it is content: Llama 3's one JSON
    // object (after an optional <|python_tag|>), Mistral's list after
    // [TOOL_CALLS] (the control token's text, where the detokenizer kept
    // it; a forced reply is the list alone).
    std::string body = text;
    for (const char* prefix : {"<|python_tag|>", "[TOOL_CALLS]"}) {
      const size_t b = body.find_first_not_of(" \t\r\n");
      if (b != std::string::npos && body.compare(b, std::strlen(prefix), prefix) == 0)
        body = body.substr(b + std::strlen(prefix));
    }
    const in_json j = parse_json_within<in_json>(body, k_max_body_depth);
    if (j.is_array() && t.format != tool_format::llama3) {  // (Llama 3: one call a turn)
      for (const auto& one : j)
        if (auto c = as_call(one, t); c && (t.parallel || r.calls.empty())) r.calls.push_back(*c);
    } else if (auto c = as_call(j, t)) {
      r.calls.push_back(*c);
    }
    if (r.calls.empty()) r.content = text;
    return r;
  }
  if (t.forced()) {
    // The constraint made the whole output one call, or a list of them.
    const in_json j = parse_json_within<in_json>(text, k_max_body_depth);
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
    auto c = as_call(parse_json_within<in_json>(inner, k_max_body_depth), t);
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
