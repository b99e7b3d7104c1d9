#include "runtime/kvstore/tier_policy.hpp"

#include <algorithm>
#include <numeric>

namespace troupe {

std::optional<tier_eviction> parse_tier_eviction(std::string_view name) {
  if (name == "lru") return tier_eviction::lru;
  if (name == "lfu") return tier_eviction::lfu;
  return std::nullopt;
}

const char* to_string(tier_eviction p) {
  return p == tier_eviction::lfu ? "lfu" : "lru";
}

std::vector<size_t> pick_victims(std::span<const tier_entry_use> entries, uint64_t bytes_to_free,
                                 tier_eviction policy) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto older = [&](size_t a, size_t b) {
    const auto &x = entries[a], &y = entries[b];
    if (x.last_use != y.last_use) return x.last_use < y.last_use;
    return x.depth > y.depth;
  };
  if (policy == tier_eviction::lfu)
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (entries[a].hits != entries[b].hits) return entries[a].hits < entries[b].hits;
      return older(a, b);
    });
  else
    std::sort(order.begin(), order.end(), older);
  uint64_t freed = 0;
  size_t n = 0;
  while (n < order.size() && freed < bytes_to_free) freed += entries[order[n++]].bytes;
  order.resize(n);
  return order;
}

}  // namespace troupe
