#include "runtime/kvstore/memory_tier.hpp"

namespace troupe {

memory_tier::memory_tier(uint64_t budget_bytes, tier_eviction policy)
    : budget_(budget_bytes), policy_(policy) {
  st_.name = "host";
  st_.budget = budget_bytes;
}

// Evicts until `incoming` more bytes fit the budget.
void memory_tier::evict_for(uint64_t incoming) {
  if (st_.bytes + incoming <= budget_) return;
  std::vector<tier_entry_use> uses;
  std::vector<kv_page_key> keys;
  uses.reserve(entries_.size());
  keys.reserve(entries_.size());
  for (const auto& [k, e] : entries_) {
    uses.push_back({e.page.footprint(), e.last_use, e.hits, e.page.depth});
    keys.push_back(k);
  }
  for (size_t i : pick_victims(uses, st_.bytes + incoming - budget_, policy_)) {
    auto it = entries_.find(keys[i]);
    st_.bytes -= it->second.page.footprint();
    --st_.pages;
    ++st_.evictions;
    evicted_.push_back(std::move(it->second.page));
    entries_.erase(it);
  }
}

std::vector<kv_page> memory_tier::put(std::vector<kv_page> pages) {
  evicted_.clear();
  // One use for the whole call: among its pages the policy's tie-break
  // (deepest first) decides, so a prefix's first pages stay longest.
  const uint64_t now = ++tick_;
  uint64_t incoming = 0;
  std::vector<kv_page> fresh;
  std::unordered_map<kv_page_key, bool, kv_page_key_hash> seen;
  for (auto& p : pages) {
    auto it = entries_.find({p.space, p.hash});
    if (it != entries_.end()) {
      it->second.last_use = now;
      continue;
    }
    if (!seen.emplace(kv_page_key{p.space, p.hash}, true).second) continue;
    if (p.footprint() > budget_) {
      evicted_.push_back(std::move(p));
      continue;
    }
    incoming += p.footprint();
    fresh.push_back(std::move(p));
  }
  // Room for all of them at once: one pass of the policy.  When the new
  // pages alone exceed the budget, the first ones pass straight through.
  size_t first = 0;
  while (incoming > budget_) {
    incoming -= fresh[first].footprint();
    evicted_.push_back(std::move(fresh[first++]));
  }
  evict_for(incoming);
  for (size_t i = first; i < fresh.size(); ++i) {
    auto& p = fresh[i];
    st_.bytes += p.footprint();
    st_.bytes_in += p.bytes.size();
    ++st_.pages;
    const kv_page_key k{p.space, p.hash};
    entries_.emplace(k, entry{std::move(p), now, 0});
  }
  return std::move(evicted_);
}

std::vector<kv_page> memory_tier::take_run(uint64_t space, std::span<const uint64_t> hashes) {
  std::vector<kv_page> out;
  const uint64_t now = ++tick_;  // one use for the run (see put)
  for (uint64_t h : hashes) {
    auto it = entries_.find({space, h});
    if (it == entries_.end()) {
      ++st_.misses;
      break;
    }
    auto& e = it->second;
    e.last_use = now;
    ++e.hits;
    ++st_.hits;
    st_.bytes_out += e.page.bytes.size();
    out.push_back(e.page);
  }
  return out;
}

size_t memory_tier::run_length(uint64_t space, std::span<const uint64_t> hashes) const {
  size_t n = 0;
  while (n < hashes.size() && entries_.count({space, hashes[n]})) ++n;
  return n;
}

std::vector<uint64_t> memory_tier::hashes(uint64_t space) const {
  std::vector<uint64_t> out;
  for (const auto& [k, e] : entries_)
    if (k.space == space) out.push_back(k.hash);
  return out;
}

tier_stats memory_tier::stats() const {
  tier_stats out = st_;
  out.hashes.reserve(entries_.size());
  for (const auto& [k, e] : entries_) out.hashes.push_back(k.hash);
  out.check = check_invariants();
  return out;
}

std::string memory_tier::check_invariants() const {
  uint64_t bytes = 0;
  for (const auto& [k, e] : entries_) {
    if (k.space != e.page.space || k.hash != e.page.hash)
      return "host tier: an entry's key is not its page's";
    bytes += e.page.footprint();
  }
  if (bytes != st_.bytes)
    return "host tier: " + std::to_string(bytes) + " bytes held, counted " +
           std::to_string(st_.bytes);
  if (int64_t(entries_.size()) != st_.pages)
    return "host tier: " + std::to_string(entries_.size()) + " pages held, counted " +
           std::to_string(st_.pages);
  if (bytes > budget_)
    return "host tier: " + std::to_string(bytes) + " bytes over its budget of " +
           std::to_string(budget_);
  return {};
}

}  // namespace troupe
