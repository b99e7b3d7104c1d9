#pragma once
// The KV store's host-memory tier: pages in a byte budget, evicted by the
// tier policy (its bookkeeping: runtime/kvstore/tier_index).  No actors:
// the kv_pool actor (actors/kv_pool) owns one and sends what it evicts to
// the disk tier.
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kvstore/kv_page.hpp"
#include "runtime/kvstore/tier_index.hpp"

namespace troupe {

class memory_tier {
 public:
  memory_tier(uint64_t budget_bytes, tier_eviction policy);

  // Stores the pages (one already held is only touched).  Returns the pages
  // that left to make room, and any page larger than the whole budget: the
  // tier below may take them.
  std::vector<kv_page> put(std::vector<kv_page> pages);

  // Copies of the leading run of `hashes` it holds, each a hit (and used
  // now); a miss is counted where the run ends before the list does.
  std::vector<kv_page> take_run(uint64_t space, std::span<const uint64_t> hashes);

  // How many leading `hashes` it holds, counting nothing.
  size_t run_length(uint64_t space, std::span<const uint64_t> hashes) const;

  // The hashes it holds in `space` (for the router's prefix index).
  std::vector<uint64_t> hashes(uint64_t space) const;

  tier_stats stats() const;
  // Empty when the index's invariants hold and every indexed page has its
  // data, else the first violation.
  std::string check_invariants() const;

 private:
  // That every indexed page has its data, under its own key and size.
  std::string check_pages() const;

  tier_index index_;
  std::unordered_map<kv_page_key, kv_page, kv_page_key_hash> pages_;
};

}  // namespace troupe
