// POST /v1/responses as the chat call it stands for, and the Response
// objects and events written back (tools/client/openai_responses).
#include <gtest/gtest.h>

#include "tools/client/openai_responses.hpp"

namespace troupe::openai {
namespace {

using ojson = nlohmann::ordered_json;

// "ok" and the chat body, or "400 PARAM".
std::string translate(const ojson& body, ojson* chat_out = nullptr) {
  ojson chat;
  if (auto e = responses_as_chat(body, chat)) return std::to_string(e->status) + " " + e->param;
  if (chat_out) *chat_out = chat;
  return "ok";
}

TEST(OpenAiResponses, TextInputBecomesTheSameChatCall) {
  ojson chat;
  ASSERT_EQ(translate({{"model", "m"},
                       {"instructions", "Be brief."},
                       {"input", "Hi"},
                       {"max_output_tokens", 12},
                       {"temperature", 0},
                       {"stream", true},
                       {"store", true},
                       {"metadata", {{"k", "v"}}}},
                      &chat),
            "ok");
  EXPECT_EQ(chat["model"], "m");
  EXPECT_EQ(chat["messages"], (ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                                             {{"role", "user"}, {"content", "Hi"}}})));
  EXPECT_EQ(chat["max_tokens"], 12);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_FALSE(chat.contains("store"));
  // The scheduling fields pass to the chat call, which checks them.
  ASSERT_EQ(translate({{"input", "Hi"}, {"service_tier", "flex"}, {"prompt_class", "c"}}, &chat),
            "ok");
  EXPECT_EQ(chat["service_tier"], "flex");
  EXPECT_EQ(chat["prompt_class"], "c");
  // Messages with text parts, an earlier assistant turn.
  ASSERT_EQ(
      translate(
          {{"model", "m"},
           {"input",
            {{{"role", "user"},
              {"content",
               {{{"type", "input_text"}, {"text", "a"}}, {{"type", "input_text"}, {"text", "b"}}}}},
             {{"type", "message"},
              {"role", "assistant"},
              {"content", {{{"type", "output_text"}, {"text", "c"}}}}},
             {{"role", "user"}, {"content", "d"}}}}},
          &chat),
      "ok");
  EXPECT_EQ(chat["messages"][0]["content"], "ab");
  EXPECT_EQ(chat["messages"][1]["role"], "assistant");
  EXPECT_EQ(chat["messages"][2]["content"], "d");
  // text.format maps onto response_format.
  ASSERT_EQ(translate({{"model", "m"},
                       {"input", "x"},
                       {"text",
                        {{"format",
                          {{"type", "json_schema"},
                           {"name", "city"},
                           {"schema", {{"type", "object"}}},
                           {"strict", true}}}}}},
                      &chat),
            "ok");
  EXPECT_EQ(chat["response_format"]["type"], "json_schema");
  EXPECT_EQ(chat["response_format"]["json_schema"]["name"], "city");
  EXPECT_EQ(chat["response_format"]["json_schema"]["schema"]["type"], "object");
}

TEST(OpenAiResponses, WhatItCannotDoIsRefusedByName) {
  EXPECT_EQ(translate({{"model", "m"}}), "400 input");
  EXPECT_EQ(translate({{"model", "m"}, {"input", 5}}), "400 input");
  EXPECT_EQ(translate({{"model", "m"}, {"input", ojson::array()}}), "400 input");
  EXPECT_EQ(translate({{"model", "m"}, {"input", "x"}, {"previous_response_id", "resp_1"}}),
            "400 previous_response_id");
  EXPECT_EQ(translate({{"model", "m"}, {"input", "x"}, {"tools", {{{"type", "function"}}}}}),
            "400 tools");
  EXPECT_EQ(translate({{"model", "m"}, {"input", "x"}, {"tool_choice", "required"}}),
            "400 tool_choice");
  EXPECT_EQ(translate({{"model", "m"}, {"input", "x"}, {"truncation", "auto"}}), "400 truncation");
  EXPECT_EQ(
      translate({{"model", "m"}, {"input", {{{"type", "function_call_output"}, {"output", "x"}}}}}),
      "400 input[0]");
  EXPECT_EQ(
      translate(
          {{"model", "m"},
           {"input",
            {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}}),
      "400 input[0].content");
  EXPECT_EQ(translate({{"model", "m"}, {"input", {{{"role", "tool"}, {"content", "x"}}}}}),
            "400 input[0]");
  EXPECT_EQ(translate({{"model", "m"}, {"input", "x"}, {"text", {{"format", {{"type", "x"}}}}}}),
            "400 text.format");
  // Wrong types inside text.format pass to the chat parser, never throw.
  EXPECT_EQ(
      translate({{"model", "m"},
                 {"input", "x"},
                 {"text", {{"format", {{"type", "json_schema"}, {"name", 5}, {"strict", "y"}}}}}}),
      "ok");
}

TEST(OpenAiResponses, TheResponseObjectAndEvents) {
  response_state r;
  r.id = "resp_1";
  r.item_id = "msg_1";
  r.model = "m";
  r.created = 7;
  auto start = response_object(r);
  EXPECT_EQ(start["status"], "in_progress");
  EXPECT_TRUE(start["output"].empty());
  EXPECT_FALSE(start.contains("usage"));
  r.status = "incomplete";
  r.text = "hello";
  r.input_tokens = 3;
  r.output_tokens = 2;
  auto done = response_object(r);
  EXPECT_EQ(done["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "hello");
  EXPECT_EQ(done["usage"]["total_tokens"], 5);
  const std::string ev = response_event("response.output_text.delta", {{"delta", "he"}}, 4);
  EXPECT_EQ(ev.rfind("event: response.output_text.delta\ndata: {", 0), 0u) << ev;
  EXPECT_NE(ev.find("\"sequence_number\":4"), std::string::npos);
  EXPECT_EQ(ev.substr(ev.size() - 2), "\n\n");
}

}  // namespace
}  // namespace troupe::openai
