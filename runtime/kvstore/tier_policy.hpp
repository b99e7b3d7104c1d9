#pragma once
// Which pages leave a KV store tier when it needs room: a plain function
// over the tier's entries, shared by the host and disk tiers and the
// simulator.  LRU by default; LFU keeps pages many prompts share (a long
// system prompt) over ones read once.  Ties go to the deeper page first: a
// prompt's later pages leave before its first ones, which more prompts
// share, and without which the later ones cannot be reached.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace troupe {

enum class tier_eviction { lru, lfu };
std::optional<tier_eviction> parse_tier_eviction(std::string_view name);
const char* to_string(tier_eviction p);

// What the policy knows of an entry.
struct tier_entry_use {
  uint64_t bytes = 0;
  uint64_t last_use = 0;  // a tick the tier advances at each store and hit
  uint64_t hits = 0;
  int32_t depth = 0;  // the page's index in its prompt
};

// Indices of the entries to evict, in eviction order: the fewest, in the
// policy's order, whose bytes add up to at least `bytes_to_free` (all of
// them when they add up to less).
std::vector<size_t> pick_victims(std::span<const tier_entry_use> entries, uint64_t bytes_to_free,
                                 tier_eviction policy);

}  // namespace troupe
