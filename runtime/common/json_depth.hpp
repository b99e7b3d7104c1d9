#pragma once
// How deeply a parsed JSON value nests, measured without recursion.
// nlohmann's parser and destructor keep their own stacks, but its dump(),
// copies and comparisons recurse once per level: a request body or schema
// nested 100,000 deep (200 KB of '[') overflows the stack there.  Callers
// refuse such values first (the OpenAI request translation, the JSON-schema
// translator).  Header-only: the client library links no runtime.
#include <nlohmann/json.hpp>
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

}  // namespace troupe
