#pragma once
// Per-sequence token sampling over one row of logits: penalties, then
// temperature, top-k, top-p, min-p, then a draw from a seeded RNG (or
// argmax when temperature is 0).  Pure: no device, no actors.
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace troupe {

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
  bool logprobs = false;  // report the chosen token's logprob
  int n_logprobs = 0;     // and the top-n alternatives (implies logprobs)
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

class sampler {
 public:
  explicit sampler(const sampling_params& p);

  // history: the sequence's tokens so far (prompt and generated), for penalties.
  sample_result sample(std::span<const float> logits, std::span<const int32_t> history);

  const sampling_params& params() const { return params_; }

  // The RNG's state as text, and setting it back: a sequence that moves to
  // another instance (runtime/kv_blob) draws there exactly what it would
  // have drawn here.  set_rng_state throws std::invalid_argument for text
  // that is not such a state.
  std::string rng_state() const;
  void set_rng_state(const std::string& state);

 private:
  sampling_params params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused scratch
};

}  // namespace troupe
