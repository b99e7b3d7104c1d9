#pragma once
// One step's work for the device: the new tokens of several sequences,
// flattened into rows (continuous batching without padding), each sequence
// with the page table its KV lives in.
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/engine/sampler.hpp"

namespace troupe {

struct forward_seq {
  int32_t first_row = 0;  // its rows are [first_row, first_row + n_rows)
  int32_t n_rows = 0;
  std::vector<int32_t> pages;  // page table, covering positions 0..last row's position
};

// Step overlap (runtime/engine/step_overlap.hpp): a token the device draws from
// this step's logits, as the instance's sampler will, for the next step.
struct presample_row {
  presample_row() = default;
  presample_row(int32_t logit_index_, sampling_params sampling_, int64_t position_)
      : logit_index(logit_index_), sampling(std::move(sampling_)), position(position_) {}
  int32_t logit_index = 0;  // into logit_rows
  sampling_params sampling;
  int64_t position = 0;  // the sequence's length when it samples (the seeded draw's counter)
  // Penalties: the counts of the sequence's penalty window but its last
  // token (sorted by token, sampler::penalty_counts); the draw counts the
  // last one too, the row's input token (with count_input), which on the
  // device may itself be a draw of the step before.
  std::vector<token_count> counts;
  bool count_input = false;
};

// Step overlap: a row whose token is still being sampled when the step is
// sent; the device takes it from the previous step's draws.
struct placeholder_row {
  int32_t row = 0;
  int32_t drawn_index = 0;  // into the previous step's presample
};

// The token that stands for draw k of the step before, made on the device
// (pipelined steps: llama_forward::submit; kernels/common.cl's token_at).
inline int32_t device_draw_token(int32_t k) {
  return -1 - k;
}

struct forward_batch {
  std::vector<int32_t> tokens;     // one per row
  std::vector<int32_t> positions;  // one per row
  std::vector<forward_seq> seqs;
  std::vector<int32_t> logit_rows;  // rows whose logits come back, in this order
  uint64_t step = 0;                // the sender's step id (0: none)
  std::vector<presample_row> presample;
  uint64_t after = 0;  // the step whose draws fill the placeholders
  std::vector<placeholder_row> placeholders;
  // Rows whose final normed hidden states come back (embedding requests'
  // rows), in this order; the classifier does not run on them.
  std::vector<int32_t> hidden_rows;
  // Pipeline stages after the first: every row's hidden state as the stage
  // before left it (rows x n_embd), in place of the embedding of tokens.
  std::vector<float> stage_input;
  // Rows whose input is an embedding instead of their token's (images:
  // sequence_spec::embeds), in this order; embed_input holds them, rows x
  // n_embd.  Their tokens are placeholders.
  std::vector<int32_t> embed_rows;
  std::vector<float> embed_input;
};

struct forward_result {
  int32_t n_vocab = 0;
  std::vector<float> logits;   // logit_rows.size() x n_vocab
  std::vector<int32_t> drawn;  // per presample row: the token (-1: the logits were refused)
  int32_t n_embd = 0;
  std::vector<float> hidden;  // hidden_rows.size() x n_embd: after the output norm
  double device_ms = 0;       // the device's time on this step
  double idle_ms = -1;        // the device's idle time before it (-1: its first step)
  // Pipeline stages before the last: every row's hidden state after the
  // stage's layers (rows x n_embd), the next stage's stage_input; no logits.
  std::vector<float> stage_output;
};

}  // namespace troupe
