// Tool calling in the OpenAI API (tools/client/openai_tools, issue 34):
// tools and tool_choice read and checked (garbage is a 400 naming it),
// rendered into the system prompt, tool turns rendered as text, a forced
// choice turned into a constraint whose outputs parse back into calls.
#include <gtest/gtest.h>

#include "runtime/text/json_schema_regex.hpp"
#include "runtime/text/regex_dfa.hpp"
#include "tools/client/openai_tools.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::ordered_json;

const json k_weather = json::parse(R"({
  "type": "function",
  "function": {"name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "properties": {
                 "city": {"type": "string", "maxLength": 20},
                 "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}})");
const json k_time = json::parse(R"({
  "type": "function",
  "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}})");

json chat(json extra) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

std::string param(const json& body) {
  call c;
  auto e = parse(body, true, "m", c);
  return e ? std::to_string(e->status) + " " + e->param : "accepted";
}

TEST(OpenAiTools, GarbageToolsAndChoicesAreRefusedByName) {
  EXPECT_EQ(param(chat({{"tools", {k_weather}}})), "accepted");
  EXPECT_EQ(param(chat({{"tools", "all"}})), "400 tools");
  EXPECT_EQ(param(chat({{"tools", {{{"type", "function"}}}}})), "400 tools");
  EXPECT_EQ(param(chat({{"tools", {{{"type", "code"}, {"function", {{"name", "x"}}}}}}})),
            "400 tools");
  EXPECT_EQ(param(chat({{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}})),
            "400 tools");
  EXPECT_EQ(param(chat({{"tools", {k_weather, k_weather}}})), "400 tools");
  EXPECT_EQ(param(chat({{"tools", {k_weather}}, {"tool_choice", "sometimes"}})), "400 tool_choice");
  EXPECT_EQ(
      param(chat({{"tools", {k_weather}},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})),
      "400 tool_choice");
  EXPECT_EQ(param(chat({{"tool_choice", "required"}})), "400 tool_choice");
  EXPECT_EQ(param(chat({{"tools", {k_weather}}, {"parallel_tool_calls", "yes"}})),
            "400 parallel_tool_calls");
  EXPECT_EQ(param(chat({{"tools", {k_weather}},
                        {"tool_choice", "required"},
                        {"response_format", {{"type", "json_object"}}}})),
            "400 tool_choice");
}

TEST(OpenAiTools, ToolsGoIntoTheSystemPromptAndToolTurnsBecomeText) {
  call c;
  json body = {
      {"tools", {k_weather, k_time}},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function",
             {{"name", "get_weather"}, {"arguments", R"({"city":"Paris","unit":"c"})"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C, sunny"}}}}};
  ASSERT_FALSE(parse(body, true, "m", c).has_value());
  const auto& msgs = c.generates.at(0).chat().messages();
  ASSERT_EQ(msgs.size(), 4);
  EXPECT_EQ(msgs[0].role(), "system");
  EXPECT_EQ(msgs[0].content().rfind("Be brief.\n\n# Tools", 0), 0u) << msgs[0].content();
  EXPECT_NE(msgs[0].content().find(R"("name":"get_weather")"), std::string::npos);
  EXPECT_EQ(msgs[2].role(), "assistant");
  EXPECT_EQ(msgs[2].content(),
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":"
            "\"c\"}}\n</tool_call>");
  EXPECT_EQ(msgs[3].role(), "user");
  EXPECT_EQ(msgs[3].content(), "<tool_response>\n18 C, sunny\n</tool_response>");
  EXPECT_EQ(c.generates[0].constraint_case(), wire::Generate::CONSTRAINT_NOT_SET);
  // tool_choice none: no tools in the prompt, the output read as text.
  ASSERT_FALSE(parse(chat({{"tools", {k_weather}}, {"tool_choice", "none"}}), true, "m", c));
  EXPECT_EQ(c.generates[0].chat().messages(0).content(), "Weather in Paris?");
  EXPECT_FALSE(c.tools.active());
}

TEST(OpenAiTools, AForcedChoiceConstrainsTheOutputToACallThatParsesBack) {
  call c;
  ASSERT_FALSE(parse(
      chat({{"tools", {k_weather, k_time}},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}),
      true, "m", c));
  ASSERT_EQ(c.generates[0].constraint_case(), wire::Generate::kGuidedJson);
  regex_dfa named(schema_regex(json::parse(c.generates[0].guided_json())));
  auto matches = [](regex_dfa& d, const std::string& s) {
    const int st = d.step(d.start(), s);
    return st >= 0 && d.accepting(st);
  };
  const std::string out = R"({"name":"get_weather","arguments":{"city":"Paris","unit":"c"}})";
  EXPECT_TRUE(matches(named, out));
  EXPECT_FALSE(matches(named, R"({"name":"get_time","arguments":{}})"));
  auto reply = parse_reply(out, c.tools);
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(reply.calls[0].arguments)["city"], "Paris");
  EXPECT_FALSE(reply.content.has_value());
  choice ch;
  ch.text = out;
  ch.finish = "stop";
  auto r = response(c, "id", "m", 0, {ch}, [](int32_t) { return std::string(); });
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["type"], "function");
  // required with parallel calls: a list of calls of any tool.
  ASSERT_FALSE(
      parse(chat({{"tools", {k_weather, k_time}}, {"tool_choice", "required"}}), true, "m", c));
  regex_dfa any(schema_regex(json::parse(c.generates[0].guided_json())));
  EXPECT_TRUE(matches(any, "[" + out + R"(,{"name":"get_time","arguments":{}}])"));
  EXPECT_EQ(
      parse_reply("[" + out + R"(,{"name":"get_time","arguments":{}}])", c.tools).calls.size(), 2u);
}

TEST(OpenAiTools, AutoRepliesAreReadForTaggedCalls) {
  call c;
  ASSERT_FALSE(parse(chat({{"tools", {k_weather, k_time}}}), true, "m", c));
  auto r = parse_reply(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>{\"name\":\"get_time\"}</tool_call>",
      c.tools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.content.value_or("-"), "Let me check.");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  // Unknown tools, bad JSON and plain text stay content.
  for (const char* text : {"<tool_call>{\"name\":\"rm_rf\"}</tool_call>",
                           "<tool_call>{not json</tool_call>", "It is sunny.", "<tool_call>"}) {
    auto plain = parse_reply(text, c.tools);
    EXPECT_TRUE(plain.calls.empty()) << text;
    EXPECT_EQ(plain.content.value_or("-"), text);
  }
  c.tools.parallel = false;
  EXPECT_EQ(parse_reply("<tool_call>{\"name\":\"get_time\"}</tool_call><tool_call>{\"name\":"
                        "\"get_time\"}</tool_call>",
                        c.tools)
                .calls.size(),
            1u);
}

}  // namespace
}  // namespace troupe::openai
