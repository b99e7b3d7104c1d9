// troupe::openai::parse (tools/client/openai_api, with its tools from
// openai_tools): the input is the body of POST /v1/completions and
// /v1/chat/completions, parsed as ordered JSON as the HTTP front does
// (non-JSON is discarded: the front answers 400 itself); the same body also
// goes to parse_tokenize and parse_detokenize (openai_endpoints), and the
// raw bytes to bearer_key as an Authorization header; and the body as one
// of POST /v1/responses (openai_responses), whose chat translation is
// parsed in turn; and as one of POST /v1/embeddings (openai_embeddings),
// whose response is built for what it accepts.  These report a bad
// body as an api_error, never by exception: anything escaping is a
// finding.  An accepted call has n Generates per prompt.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <string>
#include <vector>

#include "runtime/common/json_depth.hpp"
#include "tools/client/openai_api.hpp"
#include "tools/client/openai_embeddings.hpp"
#include "tools/client/openai_endpoints.hpp"
#include "tools/client/openai_responses.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)troupe::openai::bearer_key(std::string(reinterpret_cast<const char*>(data), size));
  // As the HTTP front parses a body: its text's depth bounded first.
  const auto body = troupe::parse_json_within<nlohmann::ordered_json>(
      std::string_view(reinterpret_cast<const char*>(data), size),
      troupe::openai::k_max_body_depth);
  if (body.is_discarded()) return 0;
  if (body.is_object()) {
    troupe::openai::tokenize_request t;
    (void)troupe::openai::parse_tokenize(body, t);
    std::vector<int32_t> ids;
    if (!troupe::openai::parse_detokenize(body, 32000, ids))
      for (const int32_t id : ids)
        if (id < 0 || id >= 32000) std::abort();
  }
  {
    troupe::openai::embeddings_call e;
    if (!troupe::openai::parse_embeddings(body, "stories15m", e)) {
      if (e.generates.empty() || e.generates.size() > troupe::openai::k_max_embedding_inputs)
        std::abort();
      std::vector<std::vector<float>> vectors(e.generates.size(), std::vector<float>(3, 0.5f));
      (void)troupe::openai::embeddings_response(e, "stories15m", vectors, 1).dump();
    }
  }
  {
    nlohmann::ordered_json chat;
    troupe::openai::call c;
    if (!troupe::openai::responses_as_chat(body, chat) &&
        !troupe::openai::parse(chat, true, "stories15m", c) && c.generates.size() != 1)
      std::abort();  // a Response is one choice
  }
  for (const bool chat : {false, true}) {
    troupe::openai::call c;
    const auto error = troupe::openai::parse(body, chat, "stories15m", c);
    if (error) {
      if (error->status < 400 || error->status > 599 || error->message.empty()) std::abort();
      (void)troupe::openai::error_body(*error).dump();
      continue;
    }
    if (c.n < 1 || c.generates.empty() || c.generates.size() % static_cast<size_t>(c.n) != 0)
      std::abort();
  }
  return 0;
}
