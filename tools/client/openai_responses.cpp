#include "tools/client/openai_responses.hpp"

#include "runtime/common/json_depth.hpp"

namespace troupe::openai {

namespace {

using ojson = nlohmann::ordered_json;

// A message's content as chat text: a string, or text parts joined.
std::optional<api_error> content_text(const ojson& content, size_t index, std::string& out) {
  const std::string where = "input[" + std::to_string(index) + "].content";
  if (content.is_string()) {
    out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return invalid_request(where, "'" + where + "' must be a string or a list of text parts");
  for (const auto& part : content) {
    const std::string type =
        part.is_object() && part.contains("type") && part["type"].is_string() ? part["type"] : "";
    if ((type != "input_text" && type != "output_text") || !part.contains("text") ||
        !part["text"].is_string())
      return invalid_request(where, "'" + where +
                                        "' parts must be input_text or output_text with a text "
                                        "(images, files and audio are not supported)");
    out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

std::optional<api_error> responses_as_chat(const ojson& body, ojson& chat) {
  if (!body.is_object())
    return api_error{400, "the request body must be a JSON object", "invalid_request_error", "",
                     ""};
  // Checked before any field is copied (a copy recurses once per level).
  if (json_nests_deeper(body, k_max_body_depth)) return body_too_deep();
  // What troupe cannot do here is named, never dropped.
  for (const char* field : {"previous_response_id", "tools", "background", "include", "reasoning",
                            "conversation", "prompt"})
    if (auto it = body.find(field);
        it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
      return invalid_request(field, std::string("'") + field +
                                        "' is not supported on /v1/responses (troupe keeps no "
                                        "responses and runs text in, text out; for tools use "
                                        "/v1/chat/completions)");
  if (auto it = body.find("tool_choice");
      it != body.end() && !it->is_null() && !(it->is_string() && (*it == "none" || *it == "auto")))
    return invalid_request("tool_choice", "'tool_choice' other than none or auto needs tools");
  if (auto it = body.find("truncation"); it != body.end() && !it->is_null() && *it != "disabled")
    return invalid_request("truncation",
                           "'truncation' must be 'disabled' (troupe refuses a "
                           "prompt longer than the context)");

  chat = ojson::object();
  if (auto it = body.find("model"); it != body.end()) chat["model"] = *it;
  ojson messages = ojson::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return invalid_request("instructions", "'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", *it}});
  }
  const auto input = body.find("input");
  if (input == body.end() || input->is_null())
    return invalid_request("input", "'input' is required (a string or a list of messages)");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const auto& item = (*input)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (!item.is_object() || !item.contains("role") || !item["role"].is_string() ||
          (item.contains("type") && item["type"] != "message"))
        return invalid_request(where, "'" + where +
                                          "' must be a message with a role (function calls and "
                                          "their outputs are not supported here)");
      const std::string role = item["role"];
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return invalid_request(
            where, "'" + where + "' has role '" + role + "' (user, assistant, system, developer)");
      std::string text;
      if (!item.contains("content"))
        return invalid_request(where, "'" + where + "' has no content");
      if (auto e = content_text(item["content"], i, text)) return e;
      messages.push_back({{"role", role}, {"content", text}});
    }
  } else {
    return invalid_request("input", "'input' must be a string or a non-empty list of messages");
  }
  chat["messages"] = std::move(messages);
  if (auto it = body.find("max_output_tokens"); it != body.end()) chat["max_tokens"] = *it;
  for (const char* field : {"temperature", "top_p", "stream", "user", "seed", "service_tier",
                            "request_class", "slo_ttft_ms", "slo_tpot_ms", "prompt_class"})
    if (auto it = body.find(field); it != body.end()) chat[field] = *it;
  if (auto it = body.find("text"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_request("text", "'text' must be an object");
    if (auto f = it->find("format"); f != it->end() && !f->is_null()) {
      const std::string type =
          f->is_object() && f->contains("type") && (*f)["type"].is_string() ? (*f)["type"] : "";
      if (type == "json_schema") {
        // (Fields of the wrong type go through as they are: the chat
        // parser names them.)
        ojson schema = {{"name", f->contains("name") ? (*f)["name"] : ojson("output")},
                        {"schema", f->contains("schema") ? (*f)["schema"] : ojson()},
                        {"strict", f->contains("strict") ? (*f)["strict"] : ojson(false)}};
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
      } else if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        return invalid_request("text.format",
                               "'text.format.type' must be text, json_object or json_schema");
      }
    }
  }
  return std::nullopt;
}

nlohmann::json output_message(const response_state& r, const std::string& status) {
  return {{"type", "message"},
          {"id", r.item_id},
          {"status", status},
          {"role", "assistant"},
          {"content", nlohmann::json::array({{{"type", "output_text"},
                                              {"text", r.text},
                                              {"annotations", nlohmann::json::array()}}})}};
}

nlohmann::json response_object(const response_state& r) {
  nlohmann::json out = {
      {"id", r.id},
      {"object", "response"},
      {"created_at", r.created},
      {"status", r.status},
      {"error", nullptr},
      {"incomplete_details", nullptr},
      {"instructions", nullptr},
      {"max_output_tokens", r.max_output_tokens ? nlohmann::json(*r.max_output_tokens) : nullptr},
      {"model", r.model},
      {"output", nlohmann::json::array()},
      {"parallel_tool_calls", false},
      {"previous_response_id", nullptr},
      {"store", false},
      {"text", {{"format", {{"type", "text"}}}}},
      {"tool_choice", "none"},
      {"tools", nlohmann::json::array()},
      {"truncation", "disabled"},
      {"metadata", nlohmann::json::object()},
  };
  if (r.status == "in_progress") return out;
  if (r.status == "incomplete") out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  out["output"].push_back(output_message(r, r.status == "completed" ? "completed" : "incomplete"));
  out["usage"] = {{"input_tokens", r.input_tokens},
                  {"input_tokens_details", {{"cached_tokens", 0}}},
                  {"output_tokens", r.output_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", r.input_tokens + r.output_tokens}};
  return out;
}

std::string response_event(const std::string& type, nlohmann::json fields, uint64_t sequence) {
  fields["type"] = type;
  fields["sequence_number"] = sequence;
  return "event: " + type +
         "\ndata: " + fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n\n";
}

}  // namespace troupe::openai
