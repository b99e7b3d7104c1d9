#pragma once
// A simulated process's KV store (sim/cluster_sim, issue 39): the host and
// disk tiers as the kv_pool actor keeps them (runtime/kvstore/tier_index's
// accounting and the tier policy's evictions), without page data.  Pages an
// arena evicts come in through put(); a prompt's missing pages go out
// through fetch(), host first and then disk, a disk page moving up to the
// host tier as the kv_pool's fetch moves it.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "runtime/engine/page_pool.hpp"
#include "runtime/kvstore/tier_index.hpp"

namespace troupe {

class sim_store {
 public:
  // `page_bytes`: what one page occupies in a tier (its KV and tokens).
  // No disk tier when disk_bytes is 0.
  sim_store(uint64_t host_bytes, uint64_t disk_bytes, uint64_t page_bytes, tier_eviction policy);

  // Offered pages: into the host tier; what leaves it goes to the disk tier,
  // and what leaves that is gone.
  void put(const std::vector<evicted_page>& pages);

  struct fetched {
    int32_t host = 0;           // pages found in the host tier
    int32_t disk = 0;           // in the disk tier (now in the host tier too)
    std::vector<uint8_t> from;  // each page's tier, in order: 0 host, 1 disk
    int32_t pages() const { return host + disk; }
  };
  // The leading run of `hashes` it holds, each page a hit in its tier.
  fetched fetch(std::span<const uint64_t> hashes);
  // The leading run it holds, counting nothing.
  int32_t run_length(std::span<const uint64_t> hashes) const;
  // Whether it holds the page, in the host tier (a page in both: the
  // host) or the disk tier.
  bool in_host(uint64_t hash) const;
  bool in_disk(uint64_t hash) const;
  // Both tiers' invariants: empty when they hold.
  std::string check_invariants() const;

 private:
  void into_host(const kv_page_key& k, int32_t depth, uint64_t now);
  void into_disk(const kv_page_key& k, int32_t depth, uint64_t now);

  uint64_t page_bytes_;
  tier_index host_;
  std::optional<tier_index> disk_;
};

}  // namespace troupe
