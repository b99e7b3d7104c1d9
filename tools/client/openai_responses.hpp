#pragma once
// OpenAI's Responses API (POST /v1/responses) for text: a request is
// translated into the chat completions body that asks the same thing (so
// it runs through the same checks and the same Generate), and the chat
// call's outcome is written back as a Response object or as the Responses
// stream's typed events.  Plain functions of JSON; the HTTP front carries
// them (tools/troupe/http_front.cpp).
//
// Supported: `input` (a string, or messages with string content or
// input_text / output_text parts; roles user, assistant, system,
// developer), `instructions`, `max_output_tokens`, `temperature`, `top_p`,
// `stream`, `text.format` (text, json_object, json_schema), `metadata`,
// `user`, `store` and `truncation: disabled` (accepted; nothing is stored),
// and the chat API's scheduling fields (`service_tier`, `request_class`,
// `slo_ttft_ms`, `slo_tpot_ms`, `prompt_class`).
// Refused with a 400 naming the field: `previous_response_id` (troupe keeps
// no responses), `tools`, `tool_choice` other than none/auto,
// non-text input parts, `background`, `include`, `reasoning`.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tools/client/openai_api.hpp"

namespace troupe::openai {

// The chat completions body for a Responses request body.
std::optional<api_error> responses_as_chat(const nlohmann::ordered_json& body,
                                           nlohmann::ordered_json& chat);

// A Response object: `status` completed, incomplete (the output hit
// max_output_tokens) or in_progress (the stream's first event, no output).
struct response_state {
  std::string id;       // resp_...
  std::string item_id;  // msg_...: the one output message
  std::string model;
  int64_t created = 0;
  std::string status = "in_progress";
  std::string text;
  uint64_t input_tokens = 0, output_tokens = 0;
  std::optional<int64_t> max_output_tokens;
};
nlohmann::json response_object(const response_state& r);

// The whole output item (a message with one output_text part).
nlohmann::json output_message(const response_state& r, const std::string& status);

// One server-sent event of a Responses stream: "event: TYPE\ndata: {...}".
// `fields` get "type" and "sequence_number" added.
std::string response_event(const std::string& type, nlohmann::json fields, uint64_t sequence);

}  // namespace troupe::openai
