#pragma once
// Prompt-lookup drafting for speculative decoding (vLLM's n-gram proposer,
// llama.cpp's lookup decoding): text that repeats itself (summaries that
// quote, code edits, retrieval answers) is predicted by what followed the
// last time the same few tokens occurred.  Pure: no actors, no device.
#include <cstdint>
#include <span>
#include <vector>

namespace troupe {

// The most draft tokens a request or an instance may ask for per step.
constexpr int32_t k_max_draft_tokens = 16;

struct ngram_options {
  int max_draft = 4;  // most tokens proposed
  int max_ngram = 3;  // longest suffix matched first
  int min_ngram = 1;  // shortest suffix tried
};

// The tokens that followed the most recent earlier occurrence of the last n
// tokens of `tokens`, for n from max_ngram down to min_ngram (the first n
// that matches wins), at most max_draft of them; empty when nothing matches.
std::vector<int32_t> propose_ngram_draft(std::span<const int32_t> tokens, const ngram_options& o);

}  // namespace troupe
