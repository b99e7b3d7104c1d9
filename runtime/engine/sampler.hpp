#pragma once
// Per-sequence token sampling over one row of logits: penalties, then
// temperature, top-k, top-p, min-p, then a seeded draw (or argmax when
// temperature is 0).  Pure: no device, no actors.
//
// Each draw is a function of the seed and the position being sampled
// alone (a counter-based generator), not of a state carried from draw to
// draw: a sequence that moves to another instance, or is recomputed there
// after its instance died, draws exactly what it would have drawn where it
// was, with nothing to carry.
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace troupe {

// OpenAI's logit_bias: added to a token's logit before anything else
// (-100 all but bans it, 100 all but forces it).
struct token_bias {
  int32_t token = 0;
  float bias = 0.0f;
};

// How often a token occurs in a sequence's penalty window.
struct token_count {
  int32_t token = 0;
  int32_t count = 0;
};

// At most this many biased tokens per request (OpenAI allows 300).
constexpr size_t k_max_logit_bias = 1024;

struct sampling_params {
  float temperature = 0.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off (llama.cpp / CTRL style)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;  // window of recent tokens the penalties see; -1: all
  uint64_t seed = 0;
  bool logprobs = false;               // report the chosen token's logprob
  int n_logprobs = 0;                  // and the top-n alternatives (implies logprobs)
  std::vector<token_bias> logit_bias;  // each in [-100, 100]; logprobs stay unbiased
};

// Returns an empty string when valid, else what is wrong ("top_p must be in (0, 1]").
std::string validate(const sampling_params& p);

struct token_logprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct sample_result {
  int32_t token = -1;
  float logprob = 0.0f;            // of the chosen token, under the unmodified distribution
  std::vector<token_logprob> top;  // n_logprobs best, highest first
};

// The uniform draw in [0, 1) for `position` under `seed` (splitmix64 of
// both): the same pair gives the same number on every machine.
double seeded_uniform(uint64_t seed, uint64_t position);

class sampler {
 public:
  explicit sampler(const sampling_params& p);

  // history: the sequence's tokens so far (prompt and generated), for penalties.
  // Throws std::invalid_argument when the logits are empty or hold a NaN.
  sample_result sample(std::span<const float> logits, std::span<const int32_t> history);

  // The token `sample` picks after a history of `position` tokens whose
  // penalty window holds `counts` (penalty_counts of that history; empty
  // without penalties): step overlap draws it on the device, ahead of the
  // instance, and both must agree.  Throws as `sample` does.
  int32_t sample_at(std::span<const float> logits, size_t position,
                    std::span<const token_count> counts = {});

  // The tokens of `history`'s penalty window (its last penalty_last_n)
  // with how often each occurs, by token.
  static std::vector<token_count> penalty_counts(const sampling_params& p,
                                                 std::span<const int32_t> history);

  // Whether sampling reads the history's tokens, not only its length.
  static bool needs_history(const sampling_params& p);

  // Whether the request wants logprobs reported (the sampled token's, or
  // the top alternatives').
  static bool wants_logprobs(const sampling_params& p);

  const sampling_params& params() const { return params_; }

 private:
  sample_result pick(std::span<const float> logits, std::span<const token_count> counts,
                     size_t position);
  sample_result with_logprobs(sample_result res, std::span<const float> logits) const;
  int32_t draw_sampled(size_t position);

  sampling_params params_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused scratch
  std::vector<float> biased_;                    // the logits with logit_bias added
  std::vector<float> weights_;                   // a sampled draw's exp((l - max) / T)
  std::vector<int32_t> order_;                   // its candidates
};

}  // namespace troupe
