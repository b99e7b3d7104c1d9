#pragma once
// Prompt rows given as embeddings instead of tokens: an image's encoder
// output (runtime/vision) in place of placeholder tokens.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

// Prompt positions [first, first + rows) computed from `data` (rows x
// n_embd, the model's input width) instead of their tokens' embeddings.
// A request carries its spans to every instance that computes its prompt,
// so one that recomputes (preemption, recovery) has them too.
struct prompt_embeds {
  int32_t first = 0;
  int32_t rows = 0;
  std::vector<float> data;
};

// "" when `spans` fit a prompt of n_prompt tokens and rows of width n_embd
// (sorted, apart, inside the prompt, finite, sized right); else why not.
std::string check_embeds(const std::vector<prompt_embeds>& spans, int32_t n_prompt, int32_t n_embd);

// Position `pos`'s embedding row (n_embd values), or null where its token's
// embedding is the input.
const float* embedding_at(const std::vector<prompt_embeds>& spans, int32_t pos, int32_t n_embd);

// The tokens the prefix cache keys a prompt by: `tokens` with each span's
// placeholder positions given ids drawn from a hash of the span's rows and
// the position in it (negative: no vocabulary id is), so a page of image
// rows is shared only by prompts holding the same image at the same place
// (vLLM keys its blocks by an image's hash the same way).  Positions past
// the spans keep their tokens.
std::vector<int32_t> keyed_tokens(std::vector<int32_t> tokens,
                                  const std::vector<prompt_embeds>& spans);

}  // namespace troupe
