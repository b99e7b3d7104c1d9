#pragma once
// The KV store's host-memory tier: pages in a byte budget, evicted by the
// tier policy (runtime/kvstore/tier_policy).  Pure bookkeeping, no actors:
// the kv_pool actor (actors/kv_pool) owns one and sends what it evicts to
// the disk tier.
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kvstore/kv_page.hpp"
#include "runtime/kvstore/tier_policy.hpp"

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
  // Empty when the byte and page counts match the entries and the budget
  // holds, else the first violation.
  std::string check_invariants() const;

 private:
  struct entry {
    kv_page page;
    uint64_t last_use = 0;
    uint64_t hits = 0;
  };
  void evict_for(uint64_t incoming);

  uint64_t budget_;
  tier_eviction policy_;
  uint64_t tick_ = 0;
  std::unordered_map<kv_page_key, entry, kv_page_key_hash> entries_;
  std::vector<kv_page> evicted_;  // put()'s answer, filled while it runs
  tier_stats st_;
};

}  // namespace troupe
