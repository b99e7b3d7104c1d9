#pragma once
// The OpenAI-compatible HTTP API around its completions (issue 34): API
// keys, CORS origins, and the bodies of llama-server's /tokenize and
// /detokenize.  Plain functions; the HTTP front (tools/troupe/http_front)
// only carries them.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tools/client/openai_api.hpp"

namespace troupe::openai {

// The key an `Authorization` header carries ("Bearer KEY"), or nullopt.
std::optional<std::string> bearer_key(const std::string& authorization);

// OpenAI's 401 for a missing or wrong key.
api_error unauthorized();

// Whether `origin` may read responses: listed, or the list holds "*".
bool origin_allowed(const std::vector<std::string>& allowed, const std::string& origin);

// What /tokenize and /detokenize take at most.  They run on the HTTP
// front's event thread (no request actor, no queue): a 7.8 MB text with
// its pieces held the thread 2-6 s and answered 65 MB, which the
// connection kept while its client did not read.  At these sizes a call
// takes a fraction of a second and answers at most about 10 MB, and any
// context a model here has fits (a token is a few bytes of text).
constexpr size_t k_max_tokenize_bytes = 1 << 20;
constexpr size_t k_max_detokenize_tokens = 1 << 18;

// POST /tokenize: {"content": text, "add_special": false, "with_pieces": false}.
struct tokenize_request {
  std::string content;
  bool add_special = false;
  bool with_pieces = false;
};
std::optional<api_error> parse_tokenize(const nlohmann::ordered_json& body, tokenize_request& out);

// POST /detokenize: {"tokens": [ids]}, each in [0, vocab_size), at most
// k_max_detokenize_tokens.
std::optional<api_error> parse_detokenize(const nlohmann::ordered_json& body, int32_t vocab_size,
                                          std::vector<int32_t>& out);

}  // namespace troupe::openai
