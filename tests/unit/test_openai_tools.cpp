// Tool calling in the OpenAI API (tools/client/openai_tools, issue 34):
// tools and tool_choice read and checked (garbage is a 400 naming it),
// rendered into the system prompt, tool turns rendered as text, a forced
// choice turned into a constraint whose outputs parse back into calls.
#include <gtest/gtest.h>

#include "runtime/text/chat_template.hpp"
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
  EXPECT_EQ(param(chat({{"functions", {k_weather["function"]}}})), "400 functions");
  EXPECT_EQ(param(chat({{"function_call", "auto"}})), "400 function_call");
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

// The conversation llama.cpp rendered through Meta's Llama 3.2 and
// Mistral's Nemo templates (llama-server --jinja --chat-template-file
// models/templates/..., /apply-template, October 2026): a tool, a call, its
// result, a second question.
json tool_conversation(const std::string& call_id) {
  const json tool = json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city.", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
  return {{"tools", {tool}},
          {"messages",
           {{{"role", "system"}, {"content", "You are terse."}},
            {{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"},
             {"content", nullptr},
             {"tool_calls",
              {{{"id", call_id},
                {"type", "function"},
                {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}}}}},
            {{"role", "tool"}, {"tool_call_id", call_id}, {"content", "sunny"}},
            {{"role", "assistant"}, {"content", "Sunny."}},
            {{"role", "user"}, {"content", "And Rome?"}}}}};
}

std::string rendered(const call& c, const std::string& template_source) {
  std::vector<chat_message> msgs;
  for (const auto& m : c.generates.at(0).chat().messages()) msgs.push_back({m.role(), m.content()});
  return render_chat(template_source, msgs, true);
}

// Llama 3: the tools in the first user message, the call as {"name",
// "parameters"}, the result in an ipython turn, each as Meta's template
// writes it (the template's system header, with its dates, is llama.cpp's
// built-in one here: without them).
TEST(OpenAiTools, Llama3TemplatesGetTheirOwnToolFormat) {
  call c;
  ASSERT_FALSE(parse(tool_conversation("call_1"), true, "m", c, tool_format::llama3));
  const std::string prompt = rendered(c, "<|start_header_id|><|end_header_id|>");
  for (const char* llama_cpp :
       {"<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond "
        "with a JSON for a function call with its proper arguments that best answers the given "
        "prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
        "argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n   "
        " \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"The "
        "weather in a city.\",\n        \"parameters\": {\n            \"type\": \"object\",\n     "
        "       \"properties\": {\n                \"city\": {\n                    \"type\": "
        "\"string\"\n                }\n            },\n            \"required\": [\n             "
        "   \"city\"\n            ]\n        }\n    }\n}\n\nWeather in Paris?<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
        "\"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_"
        "id|>\n\n\"sunny\"<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nAnd "
        "Rome?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"})
    EXPECT_NE(prompt.find(llama_cpp), std::string::npos) << prompt;
  // Its replies: one JSON object, after <|python_tag|> or not.
  auto r = parse_reply(R"({"name": "get_weather", "parameters": {"city": "Rome"}})", c.tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["city"], "Rome");
  EXPECT_EQ(parse_reply(R"(<|python_tag|>{"name": "get_weather", "parameters": {}})", c.tools)
                .calls.size(),
            1u);
  EXPECT_EQ(parse_reply("It is sunny in Rome.", c.tools).content.value_or(""),
            "It is sunny in Rome.");
  // A named choice: the constraint is its call, in its shape.
  ASSERT_FALSE(parse(
      chat({{"tools", {k_weather}},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}),
      true, "m", c, tool_format::llama3));
  regex_dfa d(schema_regex(json::parse(c.generates[0].guided_json())));
  const std::string out = R"({"name":"get_weather","parameters":{"city":"Rome","unit":"c"}})";
  const int st = d.step(d.start(), out);
  EXPECT_TRUE(st >= 0 && d.accepting(st));
  EXPECT_EQ(parse_reply(out, c.tools).calls.size(), 1u);
}

// Mistral: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] with
// 9-character ids, [TOOL_RESULTS], as Mistral's Nemo template writes them.
TEST(OpenAiTools, MistralTemplatesGetTheirOwnToolFormat) {
  call c;
  ASSERT_FALSE(parse(tool_conversation("abc123XYZ"), true, "m", c, tool_format::mistral));
  const std::string tekken = R"({{- "[AVAILABLE_TOOLS][" }}{{- "[INST]" + m }})";
  // The whole prompt, as llama.cpp renders it (its </s> where SmolLM2's
  // end token stood in that run).
  EXPECT_EQ(
      rendered(c, tekken),
      "[INST]Weather in Paris?[/INST][TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}, \"id\": \"abc123XYZ\"}]</s>[TOOL_RESULTS]{\"content\": sunny, "
      "\"call_id\": \"abc123XYZ\"}[/TOOL_RESULTS]Sunny.</s>[AVAILABLE_TOOLS][{\"type\": "
      "\"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather "
      "in a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
      "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST]You are "
      "terse.\n\nAnd Rome?[/INST]");
  // Mistral-7B-v0.3's v3 template: a space after each tag and before an answer.
  ASSERT_FALSE(parse(tool_conversation("abc123XYZ"), true, "m", c, tool_format::mistral_v3));
  const std::string v3 =
      rendered(c, "{%- if tools %}[AVAILABLE_TOOLS] [{%- endif %}{{ '[INST] ' + m }}");
  for (const char* spelled : {"[INST] Weather in Paris?[/INST][TOOL_CALLS] [{", "[TOOL_RESULTS] {",
                              "[/TOOL_RESULTS] Sunny.</s>[AVAILABLE_TOOLS] [{"})
    EXPECT_NE(v3.find(spelled), std::string::npos) << v3;
  // OpenAI's long ids become Mistral's nine characters.
  ASSERT_FALSE(
      parse(tool_conversation("call_0123456789abcdef"), true, "m", c, tool_format::mistral));
  EXPECT_NE(rendered(c, tekken).find(R"("id": "789abcdef"})"), std::string::npos);
  // Its replies: [TOOL_CALLS] (where the control token's text shows) and a list.
  auto r = parse_reply(R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}])",
                       c.tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_FALSE(r.content.has_value());
  EXPECT_EQ(parse_reply(R"([{"name": "get_weather", "arguments": {}}])", c.tools).calls.size(), 1u);
  EXPECT_TRUE(parse_reply("[1, 2]", c.tools).calls.empty());
  // A forced choice is the list alone.
  ASSERT_FALSE(parse(chat({{"tools", {k_weather}}, {"tool_choice", "required"}}), true, "m", c,
                     tool_format::mistral));
  regex_dfa d(schema_regex(json::parse(c.generates[0].guided_json())));
  const std::string out = R"([{"name":"get_weather","arguments":{"city":"Rome","unit":"c"}}])";
  const int st = d.step(d.start(), out);
  EXPECT_TRUE(st >= 0 && d.accepting(st));
  EXPECT_EQ(parse_reply(out, c.tools).calls.size(), 1u);
}

}  // namespace
}  // namespace troupe::openai
