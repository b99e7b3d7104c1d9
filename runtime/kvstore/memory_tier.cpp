#include "runtime/kvstore/memory_tier.hpp"

namespace troupe {

memory_tier::memory_tier(uint64_t budget_bytes, tier_eviction policy)
    : index_("host", budget_bytes, policy) {}

std::vector<kv_page> memory_tier::put(std::vector<kv_page> pages) {
  std::vector<kv_page> evicted;
  const uint64_t now = index_.tick();
  const uint64_t budget = index_.budget();
  uint64_t incoming = 0;
  std::vector<kv_page> fresh;
  std::unordered_map<kv_page_key, bool, kv_page_key_hash> seen;
  for (auto& p : pages) {
    const kv_page_key k{p.space, p.hash};
    if (index_.touch(k, now) || !seen.emplace(k, true).second) continue;
    if (p.footprint() > budget) {
      evicted.push_back(std::move(p));
      continue;
    }
    incoming += p.footprint();
    fresh.push_back(std::move(p));
  }
  // Room for all of them at once: one pass of the policy.  When the new
  // pages alone exceed the budget, the first ones pass straight through.
  size_t first = 0;
  while (incoming > budget) {
    incoming -= fresh[first].footprint();
    evicted.push_back(std::move(fresh[first++]));
  }
  for (const auto& v : index_.evict_for(incoming)) {
    auto it = pages_.find(v.key);
    evicted.push_back(std::move(it->second));
    pages_.erase(it);
  }
  for (size_t i = first; i < fresh.size(); ++i) {
    auto& p = fresh[i];
    const kv_page_key k{p.space, p.hash};
    index_.counters().bytes_in += p.bytes.size();
    index_.insert(k, p.footprint(), p.depth, now);
    pages_.emplace(k, std::move(p));
  }
  return evicted;
}

std::vector<kv_page> memory_tier::take_run(uint64_t space, std::span<const uint64_t> hashes) {
  std::vector<kv_page> out;
  const uint64_t now = index_.tick();  // one use for the run (see put)
  for (uint64_t h : hashes) {
    if (!index_.hit({space, h}, now)) break;
    const kv_page& p = pages_.at({space, h});
    index_.counters().bytes_out += p.bytes.size();
    out.push_back(p);
  }
  return out;
}

size_t memory_tier::run_length(uint64_t space, std::span<const uint64_t> hashes) const {
  return index_.run_length(space, hashes);
}

std::vector<uint64_t> memory_tier::hashes(uint64_t space) const {
  return index_.hashes(space);
}

tier_stats memory_tier::stats() const {
  tier_stats out = index_.stats();  // its check: the index's invariants
  if (out.check.empty()) out.check = check_pages();
  return out;
}

std::string memory_tier::check_invariants() const {
  if (auto why = index_.check_invariants(); !why.empty()) return why;
  return check_pages();
}

std::string memory_tier::check_pages() const {
  if (pages_.size() != index_.size())
    return "host tier: " + std::to_string(pages_.size()) + " pages of data, " +
           std::to_string(index_.size()) + " indexed";
  for (const auto& [k, p] : pages_)
    if (k.space != p.space || k.hash != p.hash || index_.bytes_of(k) != p.footprint())
      return "host tier: an entry's key or size is not its page's";
  return {};
}

}  // namespace troupe
