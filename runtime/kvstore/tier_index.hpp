#pragma once
// A KV store tier's bookkeeping without its data: which pages it holds
// (by key), their sizes, uses and depths, its byte budget and counters, and
// which pages leave when it needs room (the tier policy, pick_victims).  The
// host tier keeps page data beside one, the disk tier files, and the
// cluster simulator (sim/cluster_sim) the index alone: one accounting for
// all three.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kvstore/kv_page.hpp"
#include "runtime/kvstore/tier_policy.hpp"

namespace troupe {

// A page evict_for took out: its key and depth (the disk tier's file name).
struct tier_victim {
  kv_page_key key;
  int32_t depth = 0;
};

class tier_index {
 public:
  tier_index(std::string name, uint64_t budget_bytes, tier_eviction policy);

  // A new use: the pages of one call share it, so among them the policy's
  // tie-break (deepest first) decides.
  uint64_t tick() { return ++tick_; }

  bool contains(const kv_page_key& k) const { return entries_.count(k) != 0; }
  // Marks a held page used at `now` (a store of a page already held);
  // false when it is not held.
  bool touch(const kv_page_key& k, uint64_t now);
  // A lookup that found the page (used at `now`, a hit) or did not (a miss).
  bool hit(const kv_page_key& k, uint64_t now);
  // Evicts the fewest pages, in the policy's order, that make room for
  // `incoming` more bytes; returns them in eviction order.
  std::vector<tier_victim> evict_for(uint64_t incoming);
  void insert(const kv_page_key& k, uint64_t bytes, int32_t depth, uint64_t now);
  // Removes a page (not an eviction: a drop or a replacement).
  void erase(const kv_page_key& k);
  // The held page's depth (its index in its prompt), or -1.
  int32_t depth_of(const kv_page_key& k) const;
  uint64_t bytes_of(const kv_page_key& k) const;

  // How many leading `hashes` it holds, counting nothing.
  size_t run_length(uint64_t space, std::span<const uint64_t> hashes) const;
  // The hashes it holds in `space` (for the router's prefix index).
  std::vector<uint64_t> hashes(uint64_t space) const;
  size_t size() const { return entries_.size(); }
  uint64_t budget() const { return st_.budget; }

  // The counters its owner adds to (bytes in and out, drops).
  tier_stats& counters() { return st_; }
  // The counters, every hash held, and the invariants' verdict.
  tier_stats stats() const;
  // Empty when the byte and page counts match the entries and the budget
  // holds, else the first violation (named after the tier).
  std::string check_invariants() const;

 private:
  struct entry {
    uint64_t bytes = 0;
    uint64_t last_use = 0;
    uint64_t hits = 0;
    int32_t depth = 0;
  };
  tier_eviction policy_;
  uint64_t tick_ = 0;
  std::unordered_map<kv_page_key, entry, kv_page_key_hash> entries_;
  tier_stats st_;
};

}  // namespace troupe
