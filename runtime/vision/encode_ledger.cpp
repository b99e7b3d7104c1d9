#include "runtime/vision/encode_ledger.hpp"

#include <functional>
#include <unordered_set>

namespace troupe {

encode_ledger::encode_ledger(int32_t max_waiting, uint64_t cache_bytes)
    : max_waiting_(max_waiting), cache_budget_(cache_bytes) {}

size_t encode_ledger::key(std::string_view bytes) {
  return std::hash<std::string_view>{}(bytes);
}

bool encode_ledger::admit(uint64_t owner, const std::vector<size_t>& images) {
  std::lock_guard lock(m_);
  if (images.empty()) return true;
  // The distinct images this request adds: not waiting, not cached, and
  // not counted already among its own.
  std::unordered_set<size_t> seen;
  int32_t added = 0;
  for (size_t k : images) {
    if (waiting_keys_.count(k) || seen.count(k) || by_hash_.count(k)) continue;
    seen.insert(k);
    ++added;
  }
  if (static_cast<int32_t>(waiting_keys_.size()) + added > max_waiting_) {
    ++stats_.refused;
    return false;
  }
  auto& o = owners_[owner];
  for (size_t k : images) {
    o.waiting.push_back(k);
    ++waiting_keys_[k];
  }
  o.withdrawn = false;
  stats_.waiting += static_cast<int32_t>(images.size());
  stats_.distinct = static_cast<int32_t>(waiting_keys_.size());
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
  auto& o = it->second;
  const bool wanted = !o.withdrawn;
  if (!o.waiting.empty()) {
    const size_t k = o.waiting.front();
    o.waiting.pop_front();
    if (auto w = waiting_keys_.find(k); w != waiting_keys_.end() && --w->second <= 0)
      waiting_keys_.erase(w);
    --stats_.waiting;
  }
  stats_.distinct = static_cast<int32_t>(waiting_keys_.size());
  if (!wanted) ++stats_.skipped;
  if (o.waiting.empty()) owners_.erase(it);
  return wanted;
}

std::optional<std::vector<float>> encode_ledger::cached(const std::string& bytes) {
  std::lock_guard lock(m_);
  auto [first, last] = by_hash_.equal_range(key(bytes));
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
  const size_t h = key(bytes);
  auto [first, last] = by_hash_.equal_range(h);
  for (auto it = first; it != last; ++it)
    if (it->second->bytes == bytes) return;  // encoded twice at once: one copy kept
  lru_.push_front(entry{bytes, rows});
  by_hash_.emplace(h, lru_.begin());
  stats_.cache_bytes += size;
  while (stats_.cache_bytes > cache_budget_ && !lru_.empty()) {
    auto victim = std::prev(lru_.end());
    auto [vf, vl] = by_hash_.equal_range(key(victim->bytes));
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
