#include "runtime/json_schema_regex.hpp"

#include "runtime/regex_dfa.hpp"

namespace troupe {

namespace {

using json = nlohmann::ordered_json;  // properties keep their order

// A JSON string's body character: ASCII but a quote, a backslash or a
// control byte; an escape; or one whole UTF-8 sequence (so the output is
// valid UTF-8 whatever bytes the tokens carry).
const std::string kChar =
    R"(([\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\/bfnrt]|[\xc2-\xdf][\x80-\xbf]|)"
    R"(\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|)"
    R"(\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}))";
const std::string kInteger = "-?(0|[1-9][0-9]{0,15})";
const std::string kNumber = kInteger + R"((\.[0-9]{1,8})?([eE][-+]?[0-9]{1,2})?)";

std::string alternatives(const std::vector<std::string>& parts) {
  std::string out = "(";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "|" : "") + parts[i];
  return out + ")";
}

std::string string_regex(const json& s) {
  const int lo = s.value("minLength", 0);
  const int hi = s.contains("maxLength") ? s["maxLength"].get<int>() : -1;
  if (lo < 0 || (hi >= 0 && hi < lo)) throw schema_error("schema: bad minLength/maxLength");
  return "\"" + kChar + "{" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "}\"";
}

std::string literal(const json& v) {
  return regex_escape(v.dump());
}

std::string value_regex(const json& s, int depth);

std::string typed(const std::string& type, const json& s, int depth) {
  if (type == "string") return string_regex(s);
  if (type == "integer") return kInteger;
  if (type == "number") return kNumber;
  if (type == "boolean") return "(true|false)";
  if (type == "null") return "null";
  if (type == "array") {
    const json items = s.value("items", json::object());
    const std::string item = value_regex(items, depth + 1);
    const int lo = s.value("minItems", 0);
    const int hi = s.contains("maxItems") ? s["maxItems"].get<int>() : -1;
    if (lo < 0 || (hi >= 0 && hi < lo)) throw schema_error("schema: bad minItems/maxItems");
    if (hi == 0) return R"(\[\])";
    const std::string more = "(," + item + "){" + std::to_string(std::max(0, lo - 1)) + "," +
                             (hi < 0 ? "" : std::to_string(hi - 1)) + "}";
    return lo > 0 ? R"(\[)" + item + more + R"(\])" : R"(\[()" + item + more + R"()?\])";
  }
  if (type == "object") {
    if (!s.contains("properties")) return depth >= 2 ? R"(\{\})" : json_object_regex();
    const auto& props = s["properties"];
    if (!props.is_object()) throw schema_error("schema: 'properties' must be an object");
    std::string out = R"(\{)";
    bool first = true;
    for (const auto& [k, v] : props.items()) {
      out += (first ? "" : ",") + regex_escape(json(k).dump()) + ":" + value_regex(v, depth + 1);
      first = false;
    }
    return out + R"(\})";
  }
  throw schema_error("schema: unsupported type '" + type + "'");
}

std::string value_regex(const json& s, int depth) {
  if (depth > 16) throw schema_error("schema: nested more than 16 levels");
  if (s.is_boolean() && s.get<bool>()) return value_regex(json::object(), depth);
  if (!s.is_object()) throw schema_error("schema: a schema must be an object");
  static const std::vector<std::string> known = {
      "type",    "properties", "items",       "minItems",  "maxItems",
      "enum",    "const",      "minLength",   "maxLength", "anyOf",
      "oneOf",   "title",      "description", "required",  "additionalProperties",
      "default", "examples",   "$schema",     "$id"};
  for (const auto& [k, v] : s.items())
    if (std::find(known.begin(), known.end(), k) == known.end())
      throw schema_error("schema: '" + k + "' is not supported");
  if (s.contains("const")) return literal(s["const"]);
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty())
      throw schema_error("schema: 'enum' must be a non-empty array");
    std::vector<std::string> parts;
    for (const auto& v : s["enum"]) parts.push_back(literal(v));
    return alternatives(parts);
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      if (!s[key].is_array() || s[key].empty())
        throw schema_error(std::string("schema: '") + key + "' must be a non-empty array");
      std::vector<std::string> parts;
      for (const auto& alt : s[key]) parts.push_back(value_regex(alt, depth + 1));
      return alternatives(parts);
    }
  if (!s.contains("type")) {
    // Any value: scalars, or shallow containers.
    return alternatives({string_regex(json::object()), kNumber, "(true|false)", "null",
                         depth >= 2 ? R"(\{\})" : json_object_regex()});
  }
  const auto& t = s["type"];
  if (t.is_string()) return typed(t.get<std::string>(), s, depth);
  if (t.is_array()) {
    std::vector<std::string> parts;
    for (const auto& one : t) {
      if (!one.is_string()) throw schema_error("schema: 'type' entries must be strings");
      parts.push_back(typed(one.get<std::string>(), s, depth));
    }
    return alternatives(parts);
  }
  throw schema_error("schema: 'type' must be a string or a list of strings");
}

}  // namespace

std::string schema_regex(const nlohmann::ordered_json& schema) {
  return value_regex(schema, 0);
}

std::string json_object_regex() {
  // Members and elements are bounded; strings are not (a bounded string is
  // a copy of the UTF-8 pattern per character, too many states here):
  // give max_tokens room.
  const std::string str = "\"" + kChar + "*\"";
  const std::string scalar = alternatives({str, kNumber, "(true|false)", "null"});
  const std::string inner_obj =
      R"(\{()" + str + ":" + scalar + "(," + str + ":" + scalar + R"(){0,4})?\})";
  const std::string arr = R"(\[()" + scalar + "(," + scalar + R"(){0,4})?\])";
  const std::string value = alternatives({scalar, inner_obj, arr});
  return R"(\{()" + str + ":" + value + "(," + str + ":" + value + R"(){0,6})?\})";
}

std::string choice_regex(const std::vector<std::string>& choices) {
  if (choices.empty()) throw schema_error("choice: the list is empty");
  std::vector<std::string> parts;
  for (const auto& c : choices) parts.push_back(regex_escape(c));
  return alternatives(parts);
}

}  // namespace troupe
