// The OpenAI request and response translation (tools/client/openai_api):
// parameters become Generate fields, samples get distinct reproducible
// seeds, bad values name their parameter, and responses carry OpenAI's
// shapes.
#include <gtest/gtest.h>

#include "tools/client/openai_api.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::json;

std::string text_of(int32_t id) {
  std::string s = "<";
  s += std::to_string(id);
  s += '>';
  return s;
}

TEST(OpenAiApi, CompletionParametersBecomeGenerateFields) {
  call c;
  auto e = parse(json{{"model", "m"},
                      {"prompt", "hello"},
                      {"max_tokens", 7},
                      {"temperature", 0.5},
                      {"top_p", 0.9},
                      {"top_k", 40},
                      {"seed", 3},
                      {"stop", {"a", "b"}},
                      {"n", 3},
                      {"logprobs", 2},
                      {"user", "ignored"},
                      {"some_future_field", true}},
                 false, "m", c);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(c.generates.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& g = c.generates[i];
    EXPECT_EQ(g.request_id(), i + 1);
    EXPECT_EQ(g.text(), "hello");
    EXPECT_EQ(g.max_tokens(), 7);
    EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
    EXPECT_EQ(g.sampling().top_k(), 40);
    EXPECT_EQ(g.sampling().seed(), 3 + i) << "samples differ by seed, reproducibly";
    EXPECT_EQ(g.stop_size(), 2);
    EXPECT_EQ(g.logprobs(), 2);
  }
  EXPECT_TRUE(c.logprobs);
}

// The scheduling fields (ZeroMQ's request_class, SLO targets and prompt
// class) come as extra body fields; OpenAI's service_tier "flex" is the
// offline class.
TEST(OpenAiApi, SchedulingFieldsBecomeGenerateFields) {
  call c;
  ASSERT_FALSE(parse(json{{"prompt", "x"},
                          {"request_class", "offline"},
                          {"slo_ttft_ms", 500},
                          {"slo_tpot_ms", 40},
                          {"prompt_class", "summaries"}},
                     false, "m", c));
  const auto& g = c.generates.at(0);
  EXPECT_EQ(g.request_class(), wire::OFFLINE);
  EXPECT_EQ(g.slo_ttft_ms(), 500u);
  EXPECT_EQ(g.slo_tpot_ms(), 40u);
  EXPECT_EQ(g.prompt_class(), "summaries");
  ASSERT_FALSE(parse(json{{"prompt", "x"}, {"service_tier", "flex"}}, false, "m", c));
  EXPECT_EQ(c.generates.at(0).request_class(), wire::OFFLINE);
  ASSERT_FALSE(parse(json{{"prompt", "x"}, {"service_tier", "auto"}}, false, "m", c));
  EXPECT_EQ(c.generates.at(0).request_class(), wire::ONLINE);
  ASSERT_FALSE(parse(json{{"prompt", "x"}}, false, "m", c));
  EXPECT_EQ(c.generates.at(0).request_class(), wire::ONLINE);
  EXPECT_EQ(c.generates.at(0).slo_ttft_ms(), 0u) << "absent: the class's target";

  auto param = [&](const json& body) {
    auto e = parse(body, false, "m", c);
    return e ? std::to_string(e->status) + " " + e->param : std::string("accepted");
  };
  EXPECT_EQ(param({{"prompt", "x"}, {"request_class", "batch"}}), "400 request_class");
  EXPECT_EQ(param({{"prompt", "x"}, {"request_class", 1}}), "400 request_class");
  EXPECT_EQ(param({{"prompt", "x"}, {"service_tier", "cheap"}}), "400 service_tier");
  EXPECT_EQ(param({{"prompt", "x"}, {"service_tier", "flex"}, {"request_class", "online"}}),
            "400 service_tier");
  EXPECT_EQ(param({{"prompt", "x"}, {"service_tier", "flex"}, {"request_class", "offline"}}),
            "accepted");
  EXPECT_EQ(param({{"prompt", "x"}, {"service_tier", "priority"}, {"request_class", "offline"}}),
            "400 service_tier");
  // auto and default state no preference: the class stands.
  ASSERT_FALSE(
      parse(json{{"prompt", "x"}, {"service_tier", "default"}, {"request_class", "offline"}}, false,
            "m", c));
  EXPECT_EQ(c.generates.at(0).request_class(), wire::OFFLINE);
  EXPECT_EQ(param({{"prompt", "x"}, {"slo_ttft_ms", 3600001}}), "400 slo_ttft_ms");
  EXPECT_EQ(param({{"prompt", "x"}, {"slo_ttft_ms", -1}}), "400 slo_ttft_ms");
  EXPECT_EQ(param({{"prompt", "x"}, {"slo_tpot_ms", 1e12}}), "400 slo_tpot_ms");
  EXPECT_EQ(param({{"prompt", "x"}, {"slo_tpot_ms", "fast"}}), "400 slo_tpot_ms");
  EXPECT_EQ(param({{"prompt", "x"}, {"prompt_class", std::string(129, 'a')}}), "400 prompt_class");
  EXPECT_EQ(param({{"prompt", "x"}, {"prompt_class", {"a"}}}), "400 prompt_class");
}

TEST(OpenAiApi, PromptsOfEveryShape) {
  call c;
  ASSERT_FALSE(parse(json{{"prompt", {1, 2, 3}}}, false, "m", c));
  ASSERT_EQ(c.generates.size(), 1u);
  EXPECT_EQ(c.generates[0].tokens().ids_size(), 3);
  ASSERT_FALSE(parse(json{{"prompt", {"a", "b"}}, {"n", 2}}, false, "m", c));
  ASSERT_EQ(c.generates.size(), 4u);
  EXPECT_EQ(c.generates[2].text(), "b");
  ASSERT_FALSE(parse(json{{"prompt", {{1, 2}, {3}}}}, false, "m", c));
  EXPECT_EQ(c.generates.size(), 2u);
  ASSERT_FALSE(parse(
      json{{"messages",
            {{{"role", "developer"}, {"content", "be brief"}},
             {{"role", "user"},
              {"content",
               {{{"type", "text"}, {"text", "hi "}}, {{"type", "text"}, {"text", "there"}}}}}}}},
      true, "m", c));
  ASSERT_EQ(c.generates[0].chat().messages_size(), 2);
  EXPECT_EQ(c.generates[0].chat().messages(0).role(), "system");
  EXPECT_EQ(c.generates[0].chat().messages(1).content(), "hi there");
}

// Image parts: a data URL's bytes go to Generate.images and a marker to
// the text; base64 wrapped in lines is taken, a type other than an image's
// is refused by name.
TEST(OpenAiApi, ImageDataUrlsAreUnwrappedAndTyped) {
  auto chat = [](const std::string& url) {
    return json{{"messages",
                 {{{"role", "user"},
                   {"content",
                    {{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                     {{"type", "text"}, {"text", "what?"}}}}}}}};
  };
  call c;
  // "PNG bytes" in base64, wrapped as encodebytes writes it.
  ASSERT_FALSE(parse(chat("data:image/png;base64,UE5H\nIGJ5\r\ndGVz"), true, "m", c));
  ASSERT_EQ(c.generates.at(0).images_size(), 1);
  EXPECT_EQ(c.generates[0].images(0), "PNG bytes");
  ASSERT_FALSE(parse(chat("data:;base64,UE5HIGJ5dGVz"), true, "m", c));  // no type: sniffed
  ASSERT_FALSE(parse(chat("data:IMAGE/JPEG;base64,UE5HIGJ5dGVz"), true, "m", c));
  auto e = parse(chat("data:text/plain;base64,UE5HIGJ5dGVz"), true, "m", c);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("'text/plain', not an image's"), std::string::npos) << e->message;
  e = parse(chat("data:image/png;base64,UE5H@IGJ5"), true, "m", c);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("not valid base64"), std::string::npos) << e->message;
  // As OpenAI: images in user messages only.
  for (const char* role : {"system", "developer", "assistant"}) {
    auto body = chat("data:image/png;base64,UE5HIGJ5dGVz");
    body["messages"][0]["role"] = role;
    e = parse(body, true, "m", c);
    ASSERT_TRUE(e) << role;
    EXPECT_NE(e->message.find("'user' messages only"), std::string::npos) << e->message;
  }
}

TEST(OpenAiApi, BadValuesNameTheirParameter) {
  call c;
  auto param = [&](const json& body, bool chat = false) {
    auto e = parse(body, chat, "m", c);
    return e ? std::to_string(e->status) + " " + e->param : std::string("accepted");
  };
  EXPECT_EQ(param({{"model", "other"}, {"prompt", "x"}}), "404 model");
  EXPECT_EQ(param({{"prompt", "x"}, {"temperature", 3}}), "400 temperature");
  EXPECT_EQ(param({{"prompt", "x"}, {"temperature", "hot"}}), "400 temperature");
  EXPECT_EQ(param({{"prompt", "x"}, {"max_tokens", 0}}), "400 max_tokens");
  EXPECT_EQ(param({{"prompt", "x"}, {"n", 17}}), "400 n");
  EXPECT_EQ(param({{"prompt", "x"}, {"stop", {1}}}), "400 stop");
  EXPECT_EQ(param({{"prompt", json::object()}}), "400 prompt");
  EXPECT_EQ(param(json{{"max_tokens", 3}}), "400 prompt");
  EXPECT_EQ(param({{"messages", json::array()}}, true), "400 messages");
  EXPECT_EQ(param({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, true), "400 messages");
  EXPECT_EQ(
      param({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}, true),
      "400 top_logprobs");
  EXPECT_EQ(param({{"prompt", "x"}, {"seed", -1}}), "400 seed");
  EXPECT_EQ(param({{"prompt", "x"}, {"guided_regex", ""}}), "400 guided_regex");
  // Refused, never silently ignored.
  EXPECT_EQ(param({{"prompt", "x"}, {"best_of", 3}}), "400 best_of");
  EXPECT_EQ(param({{"prompt", "x"}, {"best_of", "3"}}), "400 best_of");
  EXPECT_EQ(param({{"prompt", "x"}, {"best_of", 2}, {"n", 2}}), "accepted");
  // logit_bias: token ids as strings to biases in [-100, 100] (the ids'
  // range is the vocabulary's, checked with the request).
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {{"50256", -100}, {"7", 2.5}}}}), "accepted");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", json::object()}}), "accepted");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {{"x", 1}}}}), "400 logit_bias");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {{"-3", 1}}}}), "400 logit_bias");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {{"5", 101}}}}), "400 logit_bias");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {{"5", "1"}}}}), "400 logit_bias");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {5, 1}}}), "400 logit_bias");
  EXPECT_EQ(param({{"prompt", "x"}, {"logit_bias", {{"5", 1}, {"05", 2}}}}), "400 logit_bias");
  // Two constraints at once (one would silently win), a stream_options of
  // another type.
  EXPECT_EQ(param({{"prompt", "x"}, {"guided_regex", "a"}, {"guided_choice", {"b"}}}),
            "400 response_format");
  EXPECT_EQ(
      param(
          {{"prompt", "x"}, {"guided_regex", "a"}, {"response_format", {{"type", "json_object"}}}}),
      "400 response_format");
  EXPECT_EQ(
      param({{"prompt", "x"}, {"guided_regex", "a"}, {"response_format", {{"type", "text"}}}}),
      "accepted");
  EXPECT_EQ(param({{"prompt", "x"}, {"stream_options", 7}}), "400 stream_options");
}

// Token ids are read wide and range-checked: 2^32 + 5 once wrapped to 5,
// a valid id, and -2^31 - 1 to 2^31 - 1.
TEST(OpenAiApi, TokenIdsOutsideInt32AreRefusedNotWrapped) {
  call c;
  auto param = [&](const json& prompt) {
    auto e = parse(json{{"prompt", prompt}}, false, "m", c);
    return e ? std::to_string(e->status) + " " + e->param : std::string("accepted");
  };
  EXPECT_EQ(param(json::array({1, 2, 3})), "accepted");
  EXPECT_EQ(c.generates.at(0).tokens().ids_size(), 3);
  EXPECT_EQ(param(json::array({1, (int64_t(1) << 32) + 5})), "400 prompt");
  EXPECT_EQ(param(json::array({1, uint64_t(18446744073709551615ull)})), "400 prompt");
  EXPECT_EQ(param(json::array({1, -(int64_t(1) << 31) - 1})), "400 prompt");
  EXPECT_EQ(param(json::array({1, -1})), "400 prompt");
  EXPECT_EQ(param(json::array({json::array({4, int64_t(1) << 40})})), "400 prompt");
  EXPECT_EQ(param(json::array({int64_t(INT32_MAX)})), "accepted");
}

TEST(OpenAiApi, WireErrorsMapToHttpStatuses) {
  wire::Error e;
  e.set_code(wire::OVERLOADED);
  EXPECT_EQ(from_wire(e).status, 429);
  e.set_code(wire::SHUTTING_DOWN);
  EXPECT_EQ(from_wire(e).status, 503);
  e.set_code(wire::INVALID_ARGUMENT);
  EXPECT_EQ(from_wire(e).status, 400);
  e.set_code(wire::INTERNAL);
  EXPECT_EQ(from_wire(e).status, 500);
  EXPECT_EQ(finish_reason(wire::EOS), "stop");
  EXPECT_EQ(finish_reason(wire::LENGTH), "length");
  EXPECT_FALSE(finish_reason(wire::CANCELLED));
}

TEST(OpenAiApi, ResponsesHaveOpenAisShapes) {
  call c;
  ASSERT_FALSE(parse(json{{"prompt", "hi"}, {"logprobs", 1}, {"echo", true}}, false, "m", c));
  choice ch;
  ch.text = "AB";
  ch.finish = "length";
  ch.prompt_tokens = 2;
  ch.completion_tokens = 2;
  for (int32_t t : {5, 6}) {
    wire::TokenLogprob lp;
    lp.set_token(t);
    lp.set_logprob(-0.5f);
    auto* top = lp.add_top();
    top->set_token(t);
    top->set_logprob(-0.5f);
    ch.logprobs.push_back(lp);
  }
  auto r = response(c, "cmpl-1", "m", 42, {ch}, text_of);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "hiAB") << "echo puts the prompt first";
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"], json({"<5>", "<6>"}));
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], json({2, 5}));
  EXPECT_EQ(r["usage"]["total_tokens"], 4);

  call chat;
  ASSERT_FALSE(parse(json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                          {"logprobs", true},
                          {"top_logprobs", 1},
                          {"stream", true}},
                     true, "m", chat));
  auto first = stream_chunk(chat, "c", "m", 1, 0, "", {}, std::nullopt, true, text_of);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}}));
  auto delta =
      stream_chunk(chat, "c", "m", 1, 0, "A", {ch.logprobs[0]}, std::nullopt, false, text_of);
  EXPECT_EQ(delta["choices"][0]["delta"]["content"], "A");
  EXPECT_EQ(delta["choices"][0]["logprobs"]["content"][0]["token"], "<5>");
  auto last = stream_chunk(chat, "c", "m", 1, 0, "", {}, std::string("stop"), false, text_of);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(usage_chunk(chat, "c", "m", 1, 3, 4)["usage"]["total_tokens"], 7);
  EXPECT_EQ(error_body({429, "busy", "rate_limit_error", "", "OVERLOADED"})["error"]["type"],
            "rate_limit_error");
}

}  // namespace
}  // namespace troupe::openai
