#pragma once
// The OpenAI HTTP API as troupe's client protocol (issue 13): a request
// body of POST /v1/completions or /v1/chat/completions becomes Generate
// messages, and what the server streams back becomes OpenAI's response
// objects, stream chunks and error objects.  Plain functions of JSON and
// protobuf; the HTTP front (tools/troupe/http_front.cpp) only carries them.
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "messages/client.pb.h"

namespace troupe::openai {

// OpenAI's error object with its HTTP status.
struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, when one is
  std::string code;
};
nlohmann::json error_body(const api_error& e);

// A parsed call: one Generate per prompt and sample (choice index i is
// prompts[i / n], sample i % n), and how to answer.
struct call {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt text before the output
  bool logprobs = false;
  int top_logprobs = 0;
  int n = 1;
  std::vector<wire::Generate> generates;  // request ids 1.. in choice order
  std::vector<std::string> echo_text;     // per prompt, when echo
};

// Parses a request body (ordered: a JSON schema keeps its properties'
// order); `served` is the model name the server answers to.
// Unknown fields are ignored; a bad value is an api_error naming it.
std::optional<api_error> parse(const nlohmann::ordered_json& body, bool chat, const std::string& served,
                               call& out);

// The HTTP status and OpenAI error for a server Error message.
api_error from_wire(const wire::Error& e);

// "stop" / "length", or nullopt for an end that is an error.
std::optional<std::string> finish_reason(wire::FinishReason r);

// What one choice came to.
struct choice {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<wire::TokenLogprob> logprobs;
  std::string finish;  // stop or length
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
};

using token_text_fn = std::function<std::string(int32_t)>;

// The whole response (stream false).
nlohmann::json response(const call& c, const std::string& id, const std::string& model,
                        int64_t created, const std::vector<choice>& choices,
                        const token_text_fn& token_text);

// One stream chunk's JSON: a delta of choice `index` (text and logprobs),
// or its end (finish set, text empty).  `first` adds the chat role.
nlohmann::json stream_chunk(const call& c, const std::string& id, const std::string& model,
                            int64_t created, size_t index, const std::string& text,
                            const std::vector<wire::TokenLogprob>& logprobs,
                            const std::optional<std::string>& finish, bool first,
                            const token_text_fn& token_text);

// The usage chunk (stream_options.include_usage): no choices, the totals.
nlohmann::json usage_chunk(const call& c, const std::string& id, const std::string& model,
                           int64_t created, uint64_t prompt_tokens, uint64_t completion_tokens);

}  // namespace troupe::openai
