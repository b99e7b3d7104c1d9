#include "runtime/vision/encode_ledger.hpp"

#include <functional>

namespace troupe {

encode_ledger::encode_ledger(int32_t max_waiting, uint64_t cache_bytes)
    : max_waiting_(max_waiting), cache_budget_(cache_bytes) {}

bool encode_ledger::admit(uint64_t owner, int32_t images) {
  std::lock_guard lock(m_);
  if (images <= 0) return true;
  if (stats_.waiting + images > max_waiting_) {
    ++stats_.refused;
    return false;
  }
  auto& o = owners_[owner];
  o.waiting += images;
  o.withdrawn = false;
  stats_.waiting += images;
  return true;
}

void encode_ledger::withdraw(uint64_t owner) {
  std::lock_guard lock(m_);
  if (auto it = owners_.find(owner); it != owners_.end()) it->second.withdrawn = true;
}

bool encode_ledger::take(uint64_t owner) {
  std::lock_guard lock(m_);
  auto it = owners_.find(owner);
  // Not admitted (a caller that skipped admit): encode it, uncounted.
  if (it == owners_.end()) return true;
  const bool wanted = !it->second.withdrawn;
  --stats_.waiting;
  if (!wanted) ++stats_.skipped;
  if (--it->second.waiting <= 0) owners_.erase(it);
  return wanted;
}

std::optional<std::vector<float>> encode_ledger::cached(const std::string& bytes) {
  std::lock_guard lock(m_);
  auto [first, last] = by_hash_.equal_range(std::hash<std::string>{}(bytes));
  for (auto it = first; it != last; ++it) {
    if (it->second->bytes != bytes) continue;
    lru_.splice(lru_.begin(), lru_, it->second);  // most recent first; iterators stay valid
    ++stats_.cache_hits;
    return it->second->rows;
  }
  return std::nullopt;
}

void encode_ledger::remember(const std::string& bytes, const std::vector<float>& rows) {
  std::lock_guard lock(m_);
  ++stats_.encoded;
  const uint64_t size = bytes.size() + rows.size() * sizeof(float);
  if (size > cache_budget_) return;
  const size_t h = std::hash<std::string>{}(bytes);
  auto [first, last] = by_hash_.equal_range(h);
  for (auto it = first; it != last; ++it)
    if (it->second->bytes == bytes) return;  // encoded twice at once: one copy kept
  lru_.push_front(entry{bytes, rows});
  by_hash_.emplace(h, lru_.begin());
  stats_.cache_bytes += size;
  while (stats_.cache_bytes > cache_budget_ && !lru_.empty()) {
    auto victim = std::prev(lru_.end());
    auto [vf, vl] = by_hash_.equal_range(std::hash<std::string>{}(victim->bytes));
    for (auto it = vf; it != vl; ++it)
      if (it->second == victim) {
        by_hash_.erase(it);
        break;
      }
    stats_.cache_bytes -= victim->size();
    lru_.erase(victim);
  }
}

encode_ledger::stats encode_ledger::snapshot() const {
  std::lock_guard lock(m_);
  return stats_;
}

}  // namespace troupe
