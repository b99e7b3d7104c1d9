#pragma once
// The KV store's keys and counters (docs/architecture.md §4.10 "The KV
// store").  A page (kv_page, runtime/engine/kv_blob.hpp) is named by the
// chained prefix hash its arena's page_pool gave it (the model's
// fingerprint is in that hash) within a KV space: the geometry its bytes
// fit (kv_space_of), so a page means the same thing in every arena of the
// same model and geometry, on any node.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine/kv_blob.hpp"

namespace troupe {

struct kv_page_key {
  uint64_t space = 0;
  uint64_t hash = 0;
  bool operator==(const kv_page_key&) const = default;
};

struct kv_page_key_hash {
  size_t operator()(const kv_page_key& k) const {
    return std::hash<uint64_t>{}(k.hash ^ (k.space * 0x9e3779b97f4a7c15ull));
  }
};

}  // namespace troupe
