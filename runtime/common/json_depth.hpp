#pragma once
// How deeply a parsed JSON value nests, measured without recursion.
// nlohmann's parser and destructor keep their own stacks, but its dump(),
// copies and comparisons recurse once per level: a request body or schema
// nested 100,000 deep (200 KB of '[') overflows the stack there.  Callers
// refuse such values first (the OpenAI request translation, the JSON-schema
// translator).  Header-only: the client library links no runtime.
//
// Text bound for nlohmann::ordered_json before it is parsed
// (parse_json_within): its objects are vectors of (const key, value)
// pairs, whose moves may throw (the key is copied), so an object's vector
// that grows copies its earlier members, recursing once per level of their
// nesting.  {"a": <100,000 levels>, "b": 1} overflowed the stack inside the
// parser (found by a hostile-client probe: one HTTP request ended `troupe
// serve`), where the same value as the last member parsed.
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

// True when `root` holds arrays or objects nested deeper than `limit`
// (a scalar is depth 1).
template <class Json>
bool json_nests_deeper(const Json& root, int limit) {
  std::vector<std::pair<const Json*, int>> todo{{&root, 1}};
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (depth > limit) return true;
    if (v->is_structured())
      for (const auto& child : *v) todo.push_back({&child, depth + 1});
  }
  return false;
}

// True when the JSON text opens more than `limit` arrays or objects inside
// one another (brackets within strings do not count), found without
// parsing.  Never stricter than json_nests_deeper on the parsed value, so a
// caller may check both and say the same thing.
inline bool json_text_nests_deeper(std::string_view text, int limit) {
  int open = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++open > limit) return true;
    } else if (c == ']' || c == '}') {
      --open;
    }
  }
  return false;
}

// Json::parse(text) without exceptions, and a discarded value where the
// text nests deeper than `limit` (see above): what every parse of a
// client's or a model's text into ordered_json goes through.
template <class Json>
Json parse_json_within(std::string_view text, int limit) {
  if (json_text_nests_deeper(text, limit)) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, false);
}

}  // namespace troupe
