#pragma once
// Penalized draws on the device (kernels/penalty.cl, penalize_rows): a draw whose
// sampling has repetition, frequency or presence penalties gets a row of
// its own beside the step's logits, a copy of its logit row with its
// logit_bias and penalties applied as the host sampler applies them (bias
// first, then draw::penalize), and argmax_rows / sample_rows then draw from
// that row with no bias of their own.  The window's counts come from the
// instance (presample_row::counts); the row's input token, which may be a
// draw of the step before still on the device, is counted there.
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/engine/forward_batch.hpp"

namespace troupe {

// No input token to count (penalize_rows' `input`).
constexpr int32_t k_no_input = std::numeric_limits<int32_t>::min();

// Every penalized draw of a step, as penalize_rows reads them.
struct penalty_inputs {
  std::vector<int32_t> src, dst;  // per draw: its logit row, the row it is penalized into
  std::vector<int32_t> input;     // per draw: the token to count once more (device_draw_token
                                  // names a draw of the step before; k_no_input: none)
  std::vector<float> par;         // per draw: repetition, its inverse, frequency, presence
  std::vector<int32_t> off{0};    // draw j's entries: [off[j], off[j + 1])
  std::vector<int32_t> tok, cnt;  // per entry: the token, its count (0: a bias alone)
  std::vector<int32_t> has_bias;  // per entry: whether it has a logit_bias, and which
  std::vector<float> bias;
  size_t draws() const { return dst.size(); }
};

// Whether the device draws p from a penalized row of its own.
bool penalized_draw(const presample_row& p);

// Adds draw p, of logit row `src`, penalized into row `dst`, whose input
// token is `input` (b.tokens' value for its logit row: a token, or a
// device_draw_token).  p's logit_bias must be sorted by token without
// repeats (draws_on_device), as its counts are.
void add_penalized_draw(penalty_inputs& in, const presample_row& p, int32_t src, int32_t dst,
                        int32_t input);

}  // namespace troupe
