#pragma once
// Perplexity by llama.cpp's method: cut the tokenized text into
// non-overlapping chunks of n_ctx tokens (a partial tail is dropped), put
// BOS first in each chunk when the model adds BOS, and score the second
// half of every chunk: -log p(tok[i+1] | tok[..i]) for i in [n_ctx/2, n_ctx-1).
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/engine/sequence_runner.hpp"

namespace troupe {

struct perplexity_result {
  double ppl = 0.0;
  double nll = 0.0;    // mean negative log-likelihood
  int64_t scored = 0;  // tokens scored
  int chunks = 0;
};

// tokens: the whole text, tokenized with BOS when the model adds one.
// Chunks are batched as separate sequences, up to max_rows rows a call.
perplexity_result perplexity(const forward_fn& fwd, int n_pages, int page_size,
                             const std::vector<int32_t>& tokens, int n_ctx, int32_t bos,
                             int max_rows,
                             const std::function<void(int, int, double)>& progress = {});

}  // namespace troupe
