#include "runtime/text/json_schema_regex.hpp"

#include <cmath>
#include <string_view>
#include <utility>

#include "runtime/common/json_depth.hpp"
#include "runtime/text/regex_dfa.hpp"

namespace troupe {

namespace {

using json = nlohmann::ordered_json;  // properties keep their order

// A recursive $ref expanded as deep as the limit allows: that branch has
// no finite instance left.  An anyOf drops it, an array's items make the
// array empty; elsewhere it is an error.
struct ref_too_deep : schema_error {
  using schema_error::schema_error;
};

// A JSON string's body character: ASCII but a quote, a backslash or a
// control byte; an escape; or one whole UTF-8 sequence (so the output is
// valid UTF-8 whatever bytes the tokens carry).
const std::string kChar =
    R"(([\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\/bfnrt]|[\xc2-\xdf][\x80-\xbf]|)"
    R"(\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|)"
    R"(\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}))";
const std::string kInteger = "-?(0|[1-9][0-9]{0,15})";
const std::string kNumber = kInteger + R"((\.[0-9]{1,8})?([eE][-+]?[0-9]{1,2})?)";

// The most bytes a schema's regex may have: more than regex_dfa compiles
// (its 200000 NFA states) and far more than any schema needs.  Checked as
// the regex grows, so a schema whose parts repeat (a list of types that each
// take the same nested items) is refused before it builds gigabytes.
constexpr size_t k_max_regex_bytes = size_t{1} << 20;

// How deeply the schema's JSON may nest.  nlohmann's dump, copy and
// comparison recurse once per level, so a `const` or `items` nested 100000
// deep (a 200 KB body) would overflow the stack before value_regex's own
// limit (16 schema levels, at most about 40 JSON levels) is reached.
constexpr int k_max_json_depth = 64;

void append(std::string& out, std::string_view part) {
  if (part.size() > k_max_regex_bytes - std::min(out.size(), k_max_regex_bytes))
    throw schema_error("schema: its regex would be longer than " +
                       std::to_string(k_max_regex_bytes) + " bytes");
  out += part;
}

// "(a|b|...)", built one part at a time.
class alternation {
 public:
  void add(std::string_view part) {
    append(out_, first_ ? "" : "|");
    append(out_, part);
    first_ = false;
  }
  std::string done() && {
    append(out_, ")");
    return std::move(out_);
  }

 private:
  std::string out_ = "(";
  bool first_ = true;
};

std::string alternatives(const std::vector<std::string>& parts) {
  alternation a;
  for (const auto& p : parts) a.add(p);
  return std::move(a).done();
}

// A size keyword (minLength, maxItems, ...): a whole number in
// [0, k_regex_max_repeat] (it becomes a regex repeat count, and no
// max_tokens budget writes more), or `absent` when the schema has none.
int size_keyword(const json& s, const char* key, int absent, const char* pair) {
  const auto it = s.find(key);
  if (it == s.end()) return absent;
  double x = -1;
  if (it->is_number_unsigned()) x = static_cast<double>(it->get<uint64_t>());
  if (it->is_number_float()) x = it->get<double>();
  if (x > k_regex_max_repeat)
    throw schema_error(std::string("schema: ") + key + " above " +
                       std::to_string(k_regex_max_repeat) + " is not supported");
  if (x >= 0 && x == std::floor(x)) return static_cast<int>(x);
  throw schema_error(std::string("schema: bad ") + pair);
}

// A string's "format", as llguidance and outlines read the common ones.
std::string format_regex(const std::string& f) {
  const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  const std::string time =
      "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]"
      ")";
  if (f == "date") return date;
  if (f == "time") return time;
  if (f == "date-time") return date + "T" + time;
  if (f == "uuid")
    return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  if (f == "email")
    return "[a-zA-Z0-9_+-]+(\\.[a-zA-Z0-9_+-]+){0,8}@[a-zA-Z0-9-]+(\\.[a-zA-Z0-9-]+){0,8}\\.[a-zA-"
           "Z]{2,24}";
  throw schema_error("schema: 'format' '" + f +
                     "' is not supported (date, time, date-time, uuid, email)");
}

// A string's "pattern" (ECMA-262 syntax, as far as runtime/text/regex_dfa reads
// it) as the regex of the string's body.  Unanchored ends match any
// characters there.  The body must stay valid JSON: a pattern that could
// produce a quote, a backslash or a control character is refused, since
// the output would need escapes the pattern does not spell.
std::string pattern_regex(const std::string& pattern) try {
  std::string p = pattern;
  const bool head = !p.empty() && p.front() == '^';
  if (head) p.erase(0, 1);
  bool tail = !p.empty() && p.back() == '$';
  if (tail) {  // an escaped "\$" is a literal dollar
    size_t slashes = 0;
    for (size_t i = p.size() - 1; i > 0 && p[i - 1] == '\\'; --i) ++slashes;
    tail = slashes % 2 == 0;
  }
  if (tail) p.pop_back();
  // A fifth of generation's work budget: this runs on a request's check,
  // before any engine sees it, and a pattern that needs more is refused.
  regex_dfa dfa(p.empty() ? "()" : p, k_regex_max_nfa_states, k_regex_max_work / 5);
  // Every state the pattern can reach, up to a bound, must refuse those bytes.
  // DFA states are numbered as they are made, so stepping every state in
  // turn, the new ones too, visits all that the pattern can reach.
  for (int st = 0; st < int(dfa.states()); ++st) {
    for (int b = 0; b < 256; ++b) {
      if (dfa.step(st, uint8_t(b)) < 0) continue;
      if (b == '"' || b == '\\' || b < 0x20)
        throw schema_error("schema: 'pattern' '" + pattern.substr(0, 80) +
                           "' can produce a quote, backslash or control character (a JSON "
                           "string would need escapes there)");
    }
    if (dfa.states() > 4096)
      throw schema_error("schema: 'pattern' '" + pattern.substr(0, 80) + "' is too complex");
  }
  const std::string any = kChar + "*";
  return (head ? "" : any) + "(" + (p.empty() ? "" : p) + ")" + (tail ? "" : any);
} catch (const regex_error& e) {
  // What regex_dfa refuses (syntax, size, states) is a bad schema here:
  // schema_regex reports by schema_error only (found by fuzz_json_schema).
  throw schema_error("schema: 'pattern' '" + pattern.substr(0, 80) + "': " + e.what());
}

std::string string_regex(const json& s) {
  const bool sized = s.contains("minLength") || s.contains("maxLength");
  for (const char* key : {"format", "pattern"}) {
    const auto it = s.find(key);
    if (it == s.end()) continue;
    if (!it->is_string()) throw schema_error(std::string("schema: '") + key + "' must be a string");
    if (sized)
      throw schema_error(std::string("schema: '") + key +
                         "' together with minLength/maxLength is not supported");
    if (s.contains("format") && s.contains("pattern"))
      throw schema_error("schema: 'format' together with 'pattern' is not supported");
    const std::string body = std::string(key) == "format" ? format_regex(it->get<std::string>())
                                                          : pattern_regex(it->get<std::string>());
    return "\"" + body + "\"";
  }
  const int lo = size_keyword(s, "minLength", 0, "minLength/maxLength");
  const int hi = size_keyword(s, "maxLength", -1, "minLength/maxLength");
  if (hi >= 0 && hi < lo) throw schema_error("schema: bad minLength/maxLength");
  return "\"" + kChar + "{" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "}\"";
}

std::string literal(const json& v) {
  return regex_escape(v.dump());
}

// What a walk over a schema carries: the root ($ref's base) and how many
// $refs the current path went through.
struct walk {
  const json& root;
  int refs = 0;
};

std::string value_regex(const json& s, int depth, walk& w);

std::string typed(const std::string& type, const json& s, int depth, walk& w) {
  if (type == "string") return string_regex(s);
  if (type == "integer") return kInteger;
  if (type == "number") return kNumber;
  if (type == "boolean") return "(true|false)";
  if (type == "null") return "null";
  if (type == "array") {
    const json items = s.value("items", json::object());
    const int lo = size_keyword(s, "minItems", 0, "minItems/maxItems");
    const int hi = size_keyword(s, "maxItems", -1, "minItems/maxItems");
    if (hi >= 0 && hi < lo) throw schema_error("schema: bad minItems/maxItems");
    if (hi == 0) return R"(\[\])";
    std::string item;
    try {
      item = value_regex(items, depth + 1, w);
    } catch (const ref_too_deep&) {
      if (lo > 0) throw;
      return R"(\[\])";  // the recursion ends in an empty list
    }
    std::string out = lo > 0 ? R"(\[)" : R"(\[()";
    append(out, item);
    append(out, "(,");
    append(out, item);
    append(out, "){" + std::to_string(std::max(0, lo - 1)) + "," +
                    (hi < 0 ? "" : std::to_string(hi - 1)) + "}");
    append(out, lo > 0 ? R"(\])" : R"()?\])");
    return out;
  }
  if (type == "object") {
    if (!s.contains("properties")) return depth >= 2 ? R"(\{\})" : json_object_regex();
    const auto& props = s["properties"];
    if (!props.is_object()) throw schema_error("schema: 'properties' must be an object");
    std::string out = R"(\{)";
    bool first = true;
    for (const auto& [k, v] : props.items()) {
      std::string key = first ? "" : ",";  // (built in steps: GCC 12 warns on "" + string)
      key += regex_escape(json(k).dump());
      key += ':';
      append(out, key);
      append(out, value_regex(v, depth + 1, w));
      first = false;
    }
    append(out, R"(\})");
    return out;
  }
  throw schema_error("schema: unsupported type '" + type + "'");
}

// The schema a "$ref" names: "#" or "#/$defs/Name" ("#/definitions/Name",
// any JSON pointer into the root schema).
const json& resolve(const json& ref, const json& root) {
  if (!ref.is_string()) throw schema_error("schema: '$ref' must be a string");
  const std::string r = ref.get<std::string>();
  if (r.empty() || r[0] != '#')
    throw schema_error("schema: only local '$ref's (#/...) are supported, got '" + r + "'");
  try {
    const json::json_pointer ptr(r.substr(1));
    if (!root.contains(ptr)) throw schema_error("schema: '$ref' " + r + " names nothing");
    return root.at(ptr);
  } catch (const json::exception&) {
    throw schema_error("schema: '$ref' " + r + " is not a JSON pointer");
  }
}

std::string value_regex(const json& s, int depth, walk& w) {
  if (depth > 16) {
    // Past the limit under a $ref: a recursive model unrolled this far.
    if (w.refs > 0)
      throw ref_too_deep(
          "schema: '$ref's nested more than 16 levels deep (a recursive one with no end, or a "
          "chain that long)");
    throw schema_error("schema: nested more than 16 levels");
  }
  if (s.is_boolean() && s.get<bool>()) return value_regex(json::object(), depth, w);
  if (!s.is_object()) throw schema_error("schema: a schema must be an object");
  static const std::vector<std::string> known = {
      "type",    "properties",  "items",       "minItems",  "maxItems",
      "enum",    "const",       "minLength",   "maxLength", "anyOf",
      "oneOf",   "title",       "description", "required",  "additionalProperties",
      "default", "examples",    "$schema",     "$id",       "$ref",
      "$defs",   "definitions", "format",      "pattern",   "$comment"};
  for (const auto& [k, v] : s.items())
    if (std::find(known.begin(), known.end(), k) == known.end())
      throw schema_error("schema: '" + k + "' is not supported");
  if (s.contains("$ref")) {
    const json& target = resolve(s["$ref"], w.root);
    ++w.refs;
    struct leave {
      walk& w;
      ~leave() { --w.refs; }
    } on_exit{w};
    return value_regex(target, depth + 1, w);
  }
  if (s.contains("const")) return literal(s["const"]);
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty())
      throw schema_error("schema: 'enum' must be a non-empty array");
    alternation parts;
    for (const auto& v : s["enum"]) parts.add(literal(v));
    return std::move(parts).done();
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      if (!s[key].is_array() || s[key].empty())
        throw schema_error(std::string("schema: '") + key + "' must be a non-empty array");
      alternation parts;
      bool any = false;
      for (const auto& alt : s[key]) try {
          parts.add(value_regex(alt, depth + 1, w));
          any = true;
        } catch (const ref_too_deep&) {
          // (a recursive branch past the limit: the others remain)
        }
      if (!any)
        throw ref_too_deep(
            "schema: '$ref's nested more than 16 levels deep (a recursive one with no end, or a "
            "chain that long)");
      return std::move(parts).done();
    }
  if (!s.contains("type")) {
    // Any value: scalars, or shallow containers.
    return alternatives({string_regex(json::object()), kNumber, "(true|false)", "null",
                         depth >= 2 ? R"(\{\})" : json_object_regex()});
  }
  const auto& t = s["type"];
  if (t.is_string()) return typed(t.get<std::string>(), s, depth, w);
  if (t.is_array()) {
    // No type at all would admit no value (an empty alternation matched
    // the empty output: a 200 with text "").
    if (t.empty()) throw schema_error("schema: 'type' must be a non-empty array");
    alternation parts;
    for (const auto& one : t) {
      if (!one.is_string()) throw schema_error("schema: 'type' entries must be strings");
      parts.add(typed(one.get<std::string>(), s, depth, w));
    }
    return std::move(parts).done();
  }
  throw schema_error("schema: 'type' must be a string or a list of strings");
}

}  // namespace

std::string schema_regex(const nlohmann::ordered_json& schema) {
  if (json_nests_deeper(schema, k_max_json_depth))
    throw schema_error("schema: nested more than " + std::to_string(k_max_json_depth) +
                       " levels deep");
  walk w{schema};
  return value_regex(schema, 0, w);  // (ref_too_deep is a schema_error)
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
