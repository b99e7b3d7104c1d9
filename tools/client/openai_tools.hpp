#pragma once
// Tool calling in the OpenAI API (issue 34): `tools`, `tool_choice` and
// `parallel_tool_calls` read and checked; the tools rendered into the
// prompt in the Hermes format (Qwen's and ChatML models' `<tool_call>`
// convention); a forced choice (`required`, a named function) turned into
// a JSON-schema constraint on the output; tool-result and tool-calling
// messages rendered as text; and the output parsed back into `tool_calls`.
// Plain functions of JSON; openai_api.cpp and the HTTP front call them.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tools/client/openai_api.hpp"

namespace troupe::openai {

// tool_spec and tool_request are in openai_api.hpp (a call holds them).

// Reads `tools`, `tool_choice`, `parallel_tool_calls` of a chat body.
std::optional<api_error> parse_tools(const nlohmann::ordered_json& body, tool_request& out);

// The system prompt text that describes the tools and how to call them
// (the Hermes format).
std::string tools_prompt(const tool_request& t);

// Puts the tools into a conversation (role, content) as t.format's
// template does: Hermes into the system prompt (the first one's, or a new
// one); Llama 3 before the first user message's text (its template's
// tools_in_user_message); Mistral as an "available_tools" turn before the
// last user message.  An error when the format needs a user message and
// there is none.
std::optional<api_error> place_tools(const tool_request& t,
                                     std::vector<std::pair<std::string, std::string>>& msgs);

// For a forced choice: the JSON schema the whole output must follow, one
// call {"name", "arguments"} (an array of them when calls may be parallel).
std::string forced_schema(const tool_request& t);

// A message of role "tool" or an assistant message with `tool_calls`, as
// the turn `format`'s template writes (role, content): Hermes a user turn
// of <tool_response> and an assistant turn of <tool_call> blocks; Llama 3
// an "ipython" turn and an assistant turn per call ({"name",
// "parameters"}); Mistral "tool_results" and "tool_calls" turns the
// renderer writes as they are.  nullopt for other messages, or an error
// naming what is wrong.
std::optional<api_error> tool_message(const nlohmann::ordered_json& m, tool_format format,
                                      std::string& role, std::string& content,
                                      bool& is_tool_message);

struct tool_call {
  std::string id, name, arguments;  // arguments: a JSON object's text
};

struct parsed_reply {
  std::optional<std::string> content;  // nullopt when only calls came
  std::vector<tool_call> calls;
};

// Reads a reply: `<tool_call>{...}</tool_call>` blocks (Hermes), a reply
// that is one {"name", "parameters"} object (Llama 3) or [TOOL_CALLS] and
// a list of {"name", "arguments"} (Mistral), or for a forced choice the
// whole output, naming a known tool become calls; the rest is content.  A
// call that does not parse stays content.
parsed_reply parse_reply(const std::string& text, const tool_request& t);

// OpenAI's tool_calls array for a message or a stream delta.
nlohmann::json tool_calls_json(const std::vector<tool_call>& calls, bool delta);

}  // namespace troupe::openai
