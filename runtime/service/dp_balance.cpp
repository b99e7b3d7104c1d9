#include "runtime/service/dp_balance.hpp"

#include <algorithm>
#include <cstdlib>

namespace troupe {

void pending_admissions::report(uint64_t enqueues, clock::time_point now) {
  if (seen_) {
    // A count that went back: the replica restarted; nothing is known.
    const uint64_t arrived = enqueues >= *seen_ ? enqueues - *seen_ : queue_.size();
    for (uint64_t i = 0; i < arrived && !queue_.empty(); ++i) queue_.pop_front();
  }
  seen_ = enqueues;
  while (!queue_.empty() && now - queue_.front().at > expiry_) queue_.pop_front();
}

int64_t pending_admissions::tokens() const {
  int64_t n = 0;
  for (const auto& a : queue_) n += a.tokens;
  return n;
}

uint64_t admit_most_free_kv(const std::vector<replica_load>& replicas) {
  const replica_load* best = nullptr;
  for (const auto& r : replicas) {
    if (!r.serving) continue;
    if (!best) {
      best = &r;
      continue;
    }
    const int64_t free = r.capacity_tokens - r.kv_tokens;
    const int64_t best_free = best->capacity_tokens - best->kv_tokens;
    if (free != best_free ? free > best_free
                          : (r.kv_tokens != best->kv_tokens ? r.kv_tokens < best->kv_tokens
                                                            : r.instance < best->instance))
      best = &r;
  }
  return best ? best->instance : 0;
}

dp_balance balance_of(const std::vector<replica_load>& replicas) {
  dp_balance b;
  int n = 0;
  int64_t sum = 0;
  for (const auto& r : replicas) {
    if (!r.serving) continue;
    if (n == 0 || r.kv_tokens > b.max_tokens ||
        (r.kv_tokens == b.max_tokens && r.instance < b.most_loaded)) {
      b.max_tokens = r.kv_tokens;
      b.most_loaded = r.instance;
    }
    if (n == 0 || r.kv_tokens < b.min_tokens ||
        (r.kv_tokens == b.min_tokens && r.instance < b.least_loaded)) {
      b.min_tokens = r.kv_tokens;
      b.least_loaded = r.instance;
    }
    sum += r.kv_tokens;
    ++n;
  }
  if (n == 0) return b;
  b.mean_tokens = static_cast<double>(sum) / n;
  if (n >= 2 && b.mean_tokens > 0)
    b.gap_over_mean = static_cast<double>(b.max_tokens - b.min_tokens) / b.mean_tokens;
  return b;
}

std::vector<dp_move> plan_dp_moves(const std::vector<replica_load>& replicas,
                                   const std::vector<movable_sequence>& on_most_loaded,
                                   double gap_share, int max_moves) {
  const dp_balance b = balance_of(replicas);
  std::vector<dp_move> moves;
  if (b.most_loaded == b.least_loaded || b.gap_over_mean <= gap_share) return moves;
  const double allowed = gap_share * b.mean_tokens;  // the mean does not change with a move
  // Signed: the source's load minus the target's.  Moves only go one way,
  // so once the target holds more the planning stops.
  int64_t gap = b.max_tokens - b.min_tokens;
  std::vector<movable_sequence> left = on_most_loaded;
  while (static_cast<int>(moves.size()) < max_moves && static_cast<double>(gap) > allowed) {
    // The sequence that leaves the smallest gap |g - 2t|, among those that
    // shrink it (0 < t < g); ties to the larger, then the lower id.
    auto best = left.end();
    for (auto it = left.begin(); it != left.end(); ++it) {
      if (it->tokens <= 0 || it->tokens >= gap) continue;
      if (best == left.end()) {
        best = it;
        continue;
      }
      const int64_t a = std::llabs(gap - 2 * it->tokens), c = std::llabs(gap - 2 * best->tokens);
      if (a != c ? a < c
                 : (it->tokens != best->tokens ? it->tokens > best->tokens : it->id < best->id))
        best = it;
    }
    if (best == left.end()) break;
    moves.push_back({best->id, b.most_loaded, b.least_loaded, best->tokens});
    gap -= 2 * best->tokens;
    left.erase(best);
  }
  return moves;
}

}  // namespace troupe
