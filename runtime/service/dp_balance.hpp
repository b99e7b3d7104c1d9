#pragma once
// Data-parallel balance (xLLM's hierarchical DP balancing, layers 1 and 2,
// REFERENCES.md 6.7): plain functions over the replicas' KV load, called by
// the dp_group actor and testable alone.
//
//   admit     each request to the replica with the most free KV tokens
//   rebalance when (max - min) KV tokens exceeds a share of the mean, move
//             sequences from the most to the least loaded replica
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

// One replica as the group last heard of it, plus what it admitted since.
struct replica_load {
  uint64_t instance = 0;
  bool serving = true;
  int64_t capacity_tokens = 0;  // KV pages x page size
  int64_t kv_tokens = 0;        // tokens of the sequences it holds (their KV, now or soon)
};

// The prompts admitted to one replica that its reports may not count yet,
// oldest first.  The request travels to the replica by its own actor, so
// a report asked for after an admission may be answered before the request
// arrives (clearing admissions by ask time showed a replica holding a long
// prompt as empty, and the next prompts went there: a flaky DpGroup test
// found it).  They leave as the replica's count of enqueues received says
// that many arrived, or, never arriving (their client left first), after
// `expiry`.
class pending_admissions {
 public:
  using clock = std::chrono::steady_clock;
  explicit pending_admissions(clock::duration expiry = std::chrono::seconds(5)) : expiry_(expiry) {}

  void admit(int64_t prompt_tokens, clock::time_point now) {
    queue_.push_back({prompt_tokens, now});
  }
  // A report: the replica has received `enqueues` enqueues in all.  The
  // first after reset() has no count to compare with: what was admitted
  // before it stays until later reports or its expiry.
  void report(uint64_t enqueues, clock::time_point now);
  // A replica that joined (again): nothing pending, no count known.
  void reset() {
    queue_.clear();
    seen_.reset();
  }
  int64_t tokens() const;
  size_t size() const { return queue_.size(); }

 private:
  struct admission {
    int64_t tokens = 0;
    clock::time_point at;
  };
  clock::duration expiry_;
  std::deque<admission> queue_;
  std::optional<uint64_t> seen_;  // the count at the last report
};

// The replica with the most free KV tokens (capacity - kv_tokens); ties go
// to the lower load, then the lower id.  0 when none serves.
uint64_t admit_most_free_kv(const std::vector<replica_load>& replicas);

struct dp_balance {
  int64_t max_tokens = 0, min_tokens = 0;
  double mean_tokens = 0;
  uint64_t most_loaded = 0, least_loaded = 0;  // instance ids (0: none)
  // (max - min) / mean; 0 when idle or fewer than two replicas serve.
  double gap_over_mean = 0;
};

dp_balance balance_of(const std::vector<replica_load>& replicas);

// A sequence on the most loaded replica, as a candidate to move.
struct movable_sequence {
  uint64_t id = 0;
  int64_t tokens = 0;  // its KV tokens (what moving it shifts)
};

struct dp_move {
  uint64_t sequence = 0;
  uint64_t from = 0, to = 0;
  int64_t tokens = 0;
};

// The moves that bring the gap between the most and the least loaded
// replica under `gap_share` of the mean: none while it is under already;
// else sequences of the most loaded replica to the least loaded one, each
// time the one leaving the smallest gap (moving t tokens turns a gap g into
// g - 2t; only 0 < t < g shrinks it), until the gap is under the threshold,
// the target holds more than the source, or `max_moves` are chosen.
// Deterministic (ties to the larger sequence, then the lower id).
std::vector<dp_move> plan_dp_moves(const std::vector<replica_load>& replicas,
                                   const std::vector<movable_sequence>& on_most_loaded,
                                   double gap_share, int max_moves);

}  // namespace troupe
