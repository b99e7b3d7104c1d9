#pragma once
// Which waiting sequences an instance may admit, in what order (issue 36
// item 2: SLO-ODBS on a real instance).  A plain function the engine calls
// before each step plan; the scheduler (runtime/engine/scheduler) then
// admits from the list it is given, first to last, as pages and the
// sequence cap allow.
//
// Orders (runtime/engine/slo_batching's batch_order, plus the default):
//   deadline  today's rule, left to the scheduler: online before offline,
//             the earliest TTFT deadline first, then arrival;
//   fifo, length, slo, slo-odbs  plan_batches over the queue: arrival,
//             predicted output length, completion SLO, or SLO-ODBS's
//             batches (deadline order, grouped by SLO and length spread);
//             the batches run in the order they opened.
// Modes:
//   continuous  every waiting sequence may be admitted, in that order, as
//               rows free up (vLLM's continuous batching);
//   static      a batch (the plan's first, at most max_batch) is admitted,
//               and no other new sequence until every member has left
//               (finished, failed, cancelled, moved away): static batching
//               as in the thesis.  Members free their rows as they finish,
//               so unlike a GPU's static batch no padding is computed; the
//               cost of mixing lengths is the wait behind the longest.
// Sequences that already ran (preempted, or imported with their KV) are
// always admissible and come first, by arrival: they are not new work, and
// holding them back would strand the KV they keep.
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "runtime/engine/slo_batching.hpp"

namespace troupe {

enum class batching_mode { continuous, static_batches };
const char* to_string(batching_mode m);
std::optional<batching_mode> parse_batching_mode(std::string_view name);

struct admission_policy {
  batching_mode mode = batching_mode::continuous;
  std::optional<batch_order> order;  // none: deadline (the scheduler's own)
  odbs_params odbs;                  // odbs.max_batch: the static batch's size too
};

// One waiting sequence, given in arrival order.
struct admission_candidate {
  uint64_t key = 0;
  bool started = false;          // it ran before (preempted, or imported with KV)
  double slo_s = 0;              // its completion deadline, seconds from now
  int32_t predicted_tokens = 0;  // its predicted output length still to come
};

// The static batch running now (its members' keys); kept by the caller
// between calls.
struct admission_state {
  std::unordered_set<uint64_t> batch;
  uint64_t formed = 0;  // static batches formed so far
};

// New sequences an order plans over at most, the oldest first (the rest
// follow in arrival order; a static batch forms from these).
constexpr size_t k_admission_window = 256;

// The keys the scheduler may admit, first to try first.  With no order and
// continuous batching it returns `waiting` as given (the scheduler sorts
// by deadline).  `alive(key)`: whether a batch member is still in the
// engine (running or waiting); members that left are dropped from `state`.
std::vector<uint64_t> admission_order(const std::vector<admission_candidate>& waiting,
                                      const admission_policy& p, admission_state& state,
                                      const std::function<bool(uint64_t)>& alive);

}  // namespace troupe
