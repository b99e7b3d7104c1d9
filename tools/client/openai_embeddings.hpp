#pragma once
// POST /v1/embeddings (issue 34) as troupe's client protocol: each input
// becomes a Generate with `embedding` set, and the vectors that come back
// in Finished.embedding become OpenAI's list of embedding objects.  The
// vector is the prompt's final hidden states (after the output norm),
// mean-pooled and L2-normalised, as llama-server computes it for a
// decoder model with `--pooling mean` (docs/openai_api.md).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "messages/client.pb.h"
#include "tools/client/openai_api.hpp"

namespace troupe::openai {

// OpenAI's limit on inputs per call.
constexpr size_t k_max_embedding_inputs = 2048;

struct embeddings_call {
  std::vector<wire::Generate> generates;  // one per input, in order
  bool base64 = false;                    // encoding_format "base64" (the openai SDK's default)
};

// `input` as a string, a list of strings, a list of token ids or a list of
// lists of token ids; `encoding_format` float or base64; `model` must be
// `served`; `user` is ignored; `dimensions` is refused (troupe does not
// shorten vectors).
std::optional<api_error> parse_embeddings(const nlohmann::ordered_json& body,
                                          const std::string& served, embeddings_call& out);

// The response: {"object": "list", "data": [{"object": "embedding",
// "index", "embedding"}], "model", "usage"}; a base64 embedding is the
// little-endian float32 bytes, as OpenAI sends them.
nlohmann::json embeddings_response(const embeddings_call& c, const std::string& model,
                                   const std::vector<std::vector<float>>& vectors,
                                   uint64_t prompt_tokens);

}  // namespace troupe::openai
