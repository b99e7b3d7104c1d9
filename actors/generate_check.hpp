#pragma once
// A client's Generate checked and turned into the sequence the request
// actor enqueues (actors/request.cpp): the prompt encoded (text, token ids
// or chat messages through the model's template), max_tokens fitted to the
// context, sampling, stop strings and tokens, the output constraint
// compiled.  No CAF: tests/fuzz/fuzz_client_message.cpp runs it alone.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "messages/client.pb.h"
#include "runtime/common/media_marker.hpp"
#include "runtime/engine/ngram_draft.hpp"  // k_max_draft_tokens
#include "runtime/engine/prompt_embeds.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/scheduler.hpp"
#include "runtime/text/tokenizer.hpp"

namespace troupe {

// What a Generate is checked against: the service's model and settings
// (serve_context's fields that matter here).
struct generate_limits {
  const tokenizer* tok = nullptr;
  std::string_view chat_template;  // Jinja source from the model; empty: no chat
  bool add_bos = false;
  int32_t max_len = 0;               // prompt + generated tokens per sequence
  int32_t default_max_tokens = 256;  // when the client gives none (cut to the context)
  // Latency targets by class, in ms (0: none); a request may give its own.
  double online_ttft_ms = 0, online_tpot_ms = 0;
  double offline_ttft_ms = 0, offline_tpot_ms = 0;
  // Images: the prompt rows each stands for (the vision encoder's); 0:
  // the service has no encoder, and images are refused.
  int32_t image_rows = 0;
};

// Bytes of a request's prompt_class at most.
constexpr size_t k_max_prompt_class = 128;

// Images one request may carry.
constexpr int k_max_images = 16;

// The sequence a Generate asks for.  The fields are filled in the order the
// checks run; after a rejection those already reached keep their values.
struct generate_plan {
  std::vector<int32_t> prompt;  // set once the output constraint passed
  sampling_params sampling;
  int32_t max_tokens = 256;
  std::vector<int32_t> stop_tokens;
  bool ignore_eos = false;
  seq_class cls = seq_class::online;
  std::string constraint;  // the output's regular expression; empty: free
  double ttft_target_ms = 0;
  int32_t draft_tokens = -1;  // -1: the instance's default
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  std::string prompt_class;  // the output-length predictor's class (empty: by prompt)
  bool stream = true;
  std::vector<std::string> stops;
  bool embed = false;  // Generate.embedding: the pooled prompt, no tokens
  // Where Generate.images go in `prompt` (each span's data is the
  // encoder's, still to come), in order.
  std::vector<prompt_embeds> images;
};

// A request the client got wrong: the code and what to tell it.
struct generate_rejection {
  wire::ErrorCode code;
  std::string message;
};

// Fills `plan` from `g`, or says why the request is refused.
std::optional<generate_rejection> check_generate(const wire::Generate& g,
                                                 const generate_limits& limits,
                                                 generate_plan& plan);

}  // namespace troupe
