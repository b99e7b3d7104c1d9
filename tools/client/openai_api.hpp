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

// How deeply a request body may nest.  nlohmann's dump and copy recurse once
// per level, so a body nested 100000 deep (200 KB) would overflow the stack
// where a value is quoted in an error or a schema is copied; a real body
// nests a few levels, a response_format schema at most 64 (json_schema_regex).
constexpr int k_max_body_depth = 100;

// OpenAI's error object with its HTTP status.
struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, when one is
  std::string code;
};
nlohmann::json error_body(const api_error& e);

// A 400 invalid_request_error naming the offending field.
api_error invalid_request(const std::string& param, const std::string& message);
// The 400 for a body nesting deeper than k_max_body_depth, whichever check
// (on the text, before parsing, or on a parsed tree) found it.
api_error body_too_deep();

// The tools a chat call offers (tools/client/openai_tools.hpp reads them).
struct tool_spec {
  std::string name, description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();
};

// How the model's chat template writes tools, calls and results: Hermes
// (<tool_call> blocks; ChatML, Qwen and the families without a convention
// of their own), Llama 3's JSON calls ({"name", "parameters"}, results in
// an "ipython" turn), Mistral's [AVAILABLE_TOOLS] / [TOOL_CALLS] /
// [TOOL_RESULTS] as its v3-tekken templates spell them (Nemo's) and as
// its v3 ones do (a space after each tag).
enum class tool_format { hermes, llama3, mistral, mistral_v3 };

inline bool is_mistral(tool_format f) {
  return f == tool_format::mistral || f == tool_format::mistral_v3;
}

struct tool_request {
  std::vector<tool_spec> tools;
  tool_format format = tool_format::hermes;
  enum class choice { none, automatic, required, named } pick = choice::automatic;
  std::string named;  // pick == named
  bool parallel = true;
  // Whether the output is read for tool calls at all.
  bool active() const { return !tools.empty() && pick != choice::none; }
  // Whether the output must be a call (constrained, no text around it).
  bool forced() const { return pick == choice::required || pick == choice::named; }
};

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
  tool_request tools;                     // chat: the tools offered, and the choice
};

// A 404 model_not_found where the body names a model other than `served`.
std::optional<api_error> check_model(const nlohmann::ordered_json& body, const std::string& served);

// Parses a request body (ordered: a JSON schema keeps its properties'
// order); `served` is the model name the server answers to, `tools` how
// its chat template writes tools.  Unknown fields are ignored; a bad
// value is an api_error naming it.
std::optional<api_error> parse(const nlohmann::ordered_json& body, bool chat,
                               const std::string& served, call& out,
                               tool_format tools = tool_format::hermes);

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
  std::vector<float> embedding;  // an embedding request's vector
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

// A chat stream's delta carrying a whole reply read for tool calls
// (content and tool_calls), sent when the choice ends: with tools, a
// choice's text is held back until it can be read whole.
nlohmann::json tool_reply_chunk(const call& c, const std::string& id, const std::string& model,
                                int64_t created, size_t index, const std::string& text);

// The finish reason of a chat choice: "tool_calls" where its text holds
// calls, else what the server said.
std::string chat_finish(const call& c, const choice& ch);

// The usage chunk (stream_options.include_usage): no choices, the totals.
nlohmann::json usage_chunk(const call& c, const std::string& id, const std::string& model,
                           int64_t created, uint64_t prompt_tokens, uint64_t completion_tokens);

}  // namespace troupe::openai
