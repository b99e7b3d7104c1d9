#include "runtime/kvstore/tier_index.hpp"

namespace troupe {

tier_index::tier_index(std::string name, uint64_t budget_bytes, tier_eviction policy)
    : policy_(policy) {
  st_.name = std::move(name);
  st_.budget = budget_bytes;
}

bool tier_index::touch(const kv_page_key& k, uint64_t now) {
  auto it = entries_.find(k);
  if (it == entries_.end()) return false;
  it->second.last_use = now;
  return true;
}

bool tier_index::hit(const kv_page_key& k, uint64_t now) {
  auto it = entries_.find(k);
  if (it == entries_.end()) {
    ++st_.misses;
    return false;
  }
  it->second.last_use = now;
  ++it->second.hits;
  ++st_.hits;
  return true;
}

std::vector<tier_victim> tier_index::evict_for(uint64_t incoming) {
  if (st_.bytes + incoming <= st_.budget) return {};
  std::vector<tier_entry_use> uses;
  std::vector<kv_page_key> keys;
  uses.reserve(entries_.size());
  keys.reserve(entries_.size());
  for (const auto& [k, e] : entries_) {
    uses.push_back({e.bytes, e.last_use, e.hits, e.depth});
    keys.push_back(k);
  }
  std::vector<tier_victim> out;
  for (size_t i : pick_victims(uses, st_.bytes + incoming - st_.budget, policy_)) {
    out.push_back({keys[i], uses[i].depth});
    erase(keys[i]);
    ++st_.evictions;
  }
  return out;
}

void tier_index::insert(const kv_page_key& k, uint64_t bytes, int32_t depth, uint64_t now) {
  erase(k);
  entries_.emplace(k, entry{bytes, now, 0, depth});
  st_.bytes += bytes;
  ++st_.pages;
}

void tier_index::erase(const kv_page_key& k) {
  auto it = entries_.find(k);
  if (it == entries_.end()) return;
  st_.bytes -= it->second.bytes;
  --st_.pages;
  entries_.erase(it);
}

int32_t tier_index::depth_of(const kv_page_key& k) const {
  auto it = entries_.find(k);
  return it == entries_.end() ? -1 : it->second.depth;
}

uint64_t tier_index::bytes_of(const kv_page_key& k) const {
  auto it = entries_.find(k);
  return it == entries_.end() ? 0 : it->second.bytes;
}

size_t tier_index::run_length(uint64_t space, std::span<const uint64_t> hashes) const {
  size_t n = 0;
  while (n < hashes.size() && entries_.count({space, hashes[n]})) ++n;
  return n;
}

std::vector<uint64_t> tier_index::hashes(uint64_t space) const {
  std::vector<uint64_t> out;
  for (const auto& [k, e] : entries_)
    if (k.space == space) out.push_back(k.hash);
  return out;
}

tier_stats tier_index::stats() const {
  tier_stats out = st_;
  out.hashes.reserve(entries_.size());
  for (const auto& [k, e] : entries_) out.hashes.push_back(k.hash);
  out.check = check_invariants();
  return out;
}

std::string tier_index::check_invariants() const {
  uint64_t bytes = 0;
  for (const auto& [k, e] : entries_) bytes += e.bytes;
  const std::string who = st_.name + " tier: ";
  if (bytes != st_.bytes)
    return who + std::to_string(bytes) + " bytes held, counted " + std::to_string(st_.bytes);
  if (int64_t(entries_.size()) != st_.pages)
    return who + std::to_string(entries_.size()) + " pages held, counted " +
           std::to_string(st_.pages);
  if (bytes > st_.budget)
    return who + std::to_string(bytes) + " bytes over its budget of " + std::to_string(st_.budget);
  return {};
}

}  // namespace troupe
