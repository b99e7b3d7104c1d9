#pragma once
// The TTFT predictor behind SLO-aware prefill placement (issue 36): what a
// prompt placed on an instance now waits for its first token, from a model
// of one step's time fitted online on every instance's steps.
//
// A step's time is linear in its prefill rows p, its decode rows d and its
// attention work c (the sum over rows of the positions they attend), as
// the simulator's cost model fits the engine (sim/cost_model):
//   ms = a + b p + e d + f c,
// fitted by recursive least squares with forgetting, from every step (the
// decode-only ones teach a, e and f too).
//
// The prompt's first token comes with the step that computes its last
// chunk.  Until then the instance computes the prefill work queued before
// it and the prompt's own, at most `step_rows` rows a step less the decode
// rows that share every step (a mixed instance's decoding sequences, each
// attending to its context), and at most `chunk_rows` of one prompt a step.
// So, with Q tokens queued, P the prompt's, D decoding sequences holding R
// context tokens:
//   steps = max(ceil((Q + P) / max(1, step_rows - D)), ceil(P / chunk_rows))
//   ttft  = steps (a + e D + f R) + b (Q + P) + f W + half a step in flight,
// W the prefills' attention work (a prompt of L tokens: L (L + 1) / 2).
// A view `age_ms` old (the router's last poll) is corrected by that much:
// the instance has since worked through as much of the work queued ahead.
// The old predictor summed a per-step model over whole prompts and missed
// the decode rows beside them: 30-50% off in the simulator
// (docs/bench_service.md).
#include <cstdint>

#include "runtime/service/pd_policy.hpp"
#include "runtime/service/rls.hpp"

namespace troupe {

class step_time_model {
 public:
  explicit step_time_model(double forgetting = 0.999);
  void observe(int32_t prefill_rows, int32_t decode_rows, int64_t context, double ms);
  // One step's predicted time, >= 0.
  double step_ms(double prefill_rows, double decode_rows, double context) const;
  uint64_t samples() const { return fit_.samples(); }

 private:
  rls<4> fit_;
};

// A view older than this is not corrected for its age (an instance that
// stopped answering polls: its queue is not known to be worked off).
constexpr double k_stale_view_ms = 500;

struct ttft_model {
  step_time_model steps;
  int32_t step_rows = 256;   // the instances' max_batch_tokens
  int32_t chunk_rows = 128;  // their chunk_size
};

// What `prompt_tokens` placed on `l` now waits for its first token (0
// before the model has a sample).
double predict_ttft_ms(const pd_load& l, int32_t prompt_tokens, const ttft_model& m);

}  // namespace troupe
