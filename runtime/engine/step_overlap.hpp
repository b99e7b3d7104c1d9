#pragma once
// Step overlap (xLLM's framework-layer pipelining; docs/architecture.md
// §4.6 "Step overlap"): the instance plans and sends step N+1 while the
// device runs step N, so the device starts N+1 as soon as N ends instead of
// waiting for the result to reach the instance, be sampled, and a plan to
// come back.
//
// A sequence that samples in step N has, in step N+1, a row whose token is
// not known when N+1 is sent: a placeholder.  The device draws that token
// itself right after N (the instance's sampler is a pure function of the
// logits, the parameters and the sequence's length, so the device draws the
// very token the instance will) and fills the placeholder before N+1 runs.
// The instance takes the draw as the token; where it samples anyway (the
// request wants logprobs) it checks its token against the draw.  Pure
// functions: the device actor calls them around its forward pass.
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/forward_batch.hpp"

namespace troupe {

// The device draws a sequence's next token exactly as the instance will
// from the sequence's length and, for penalties, its window's counts
// (presample_row::counts), which the instance sends with the row.
// Structured output and speculative drafts are the instance's to rule out
// (engine::drawable): they depend on the instance's own state.
//
// The presample row the instance sends for a sequence of `history` known
// tokens that samples at `position` (history holds every token before
// position - 1; the last, position - 1, may be a draw still on the device:
// the draw counts it itself).
presample_row make_presample_row(int32_t logit_index, const sampling_params& p, int64_t position,
                                 std::span<const int32_t> history);

// The window's counts for row p of b with its input token counted (the
// token of its logit row, which must be known by now), as the sampler
// takes them.  Throws std::invalid_argument for a row outside b.
std::vector<token_count> draw_counts(const forward_batch& b, const presample_row& p);

// `counts` (sorted by token) with `token` counted once more.
std::vector<token_count> count_one_more(std::vector<token_count> counts, int32_t token);

// After `b` ran with result `r`: the token each of b.presample draws (-1
// where the sampler refuses the logits, a NaN: the instance fails that
// sequence on the same logits, so its placeholder is never used).
// Throws std::invalid_argument for a presample row outside the logits.
std::vector<int32_t> presample(const forward_batch& b, const forward_result& r);

// Before `b` runs: its placeholder rows take their tokens from the draws of
// step `last_step` (the step the device ran last; 0 when it failed).
// Throws std::invalid_argument when b follows another step than the last,
// or names a draw that does not exist.  A refused draw fills token 0: the
// instance ends that sequence on the same logits and drops the row.
void fill_placeholders(forward_batch& b, uint64_t last_step, const std::vector<int32_t>& drawn);

// The same where step `last_step` made its n_drawn draws on the device and
// has not ended yet: each placeholder row takes the token that names its
// draw (device_draw_token), which the device resolves when
// the step runs.  Throws as fill_placeholders.
void name_device_draws(forward_batch& b, uint64_t last_step, size_t n_drawn);

}  // namespace troupe
