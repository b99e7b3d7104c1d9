// The OpenAI API's endpoints beside completions (tools/client/
// openai_endpoints, issue 34): bearer keys, CORS origins, and the bodies of
// /tokenize and /detokenize with their errors.
#include <gtest/gtest.h>

#include "tools/client/openai_embeddings.hpp"
#include "tools/client/openai_endpoints.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::ordered_json;

TEST(OpenAiEndpoints, BearerKeysAndOrigins) {
  EXPECT_EQ(bearer_key("Bearer abc").value_or("-"), "abc");
  EXPECT_EQ(bearer_key("Bearer ").value_or("-"), "");
  EXPECT_FALSE(bearer_key("bearer abc").has_value());
  EXPECT_FALSE(bearer_key("Basic abc").has_value());
  EXPECT_FALSE(bearer_key("").has_value());
  EXPECT_EQ(unauthorized().status, 401);
  EXPECT_EQ(unauthorized().code, "invalid_api_key");
  EXPECT_TRUE(origin_allowed({"http://a", "http://b"}, "http://b"));
  EXPECT_FALSE(origin_allowed({"http://a"}, "http://a.evil"));
  EXPECT_FALSE(origin_allowed({}, "http://a"));
  EXPECT_TRUE(origin_allowed({"*"}, "http://anything"));
}

TEST(OpenAiEndpoints, TokenizeAndDetokenizeBodies) {
  tokenize_request t;
  EXPECT_FALSE(parse_tokenize(json{{"content", "hi"}, {"add_special", true}}, t));
  EXPECT_EQ(t.content, "hi");
  EXPECT_TRUE(t.add_special);
  EXPECT_FALSE(t.with_pieces);
  for (const json& bad : {json::object(), json{{"content", 5}}, json{{"content", nullptr}},
                          json{{"content", "x"}, {"with_pieces", "yes"}},
                          json{{"content", std::string(k_max_tokenize_bytes + 1, 'a')}}}) {
    tokenize_request u;
    auto e = parse_tokenize(bad, u);
    ASSERT_TRUE(e.has_value()) << bad.dump();
    EXPECT_EQ(e->status, 400);
  }
  std::vector<int32_t> ids;
  EXPECT_FALSE(parse_detokenize(json{{"tokens", {1, 2, 31999}}}, 32000, ids));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 31999}));
  for (const json& bad :
       {json{{"tokens", {32000}}}, json{{"tokens", {-1}}}, json{{"tokens", {int64_t(1) << 32}}},
        json{{"tokens", {uint64_t(18446744073709551615ull)}}}, json{{"tokens", {1.5}}},
        json{{"tokens", "1"}}, json::object(),
        json{{"tokens", std::vector<int>(k_max_detokenize_tokens + 1, 1)}}}) {
    auto e = parse_detokenize(bad, 32000, ids);
    ASSERT_TRUE(e.has_value()) << bad.dump();
    EXPECT_EQ(e->param, "tokens");
  }
}

// POST /v1/embeddings' shapes (tools/client/openai_embeddings): one
// Generate per input, a list of one shape, the base64 answer as OpenAI's.
TEST(OpenAiEmbeddings, InputsBecomeGeneratesAndBase64IsLittleEndianFloats) {
  using oj = nlohmann::ordered_json;
  embeddings_call c;
  ASSERT_FALSE(parse_embeddings(oj::parse(R"({"input": ["a", "bb"], "encoding_format": "base64"})"),
                                "m", c));
  ASSERT_EQ(c.generates.size(), 2u);
  EXPECT_TRUE(c.generates[1].embedding());
  EXPECT_EQ(c.generates[1].text(), "bb");
  EXPECT_TRUE(c.base64);
  ASSERT_FALSE(parse_embeddings(oj::parse(R"({"input": [[1, 2], [3]]})"), "m", c));
  EXPECT_EQ(c.generates[1].tokens().ids_size(), 1);
  ASSERT_FALSE(parse_embeddings(oj::parse(R"({"input": [7, 8, 9]})"), "m", c));
  EXPECT_EQ(c.generates.size(), 1u);
  for (const char* bad :
       {R"({"input": [[1, 2], "a"]})", R"({"input": ["a", [1]]})", R"({"input": ""})",
        R"({"input": [[]]})", R"({"input": "a", "dimensions": 8})"}) {
    const auto e = parse_embeddings(oj::parse(bad), "m", c);
    ASSERT_TRUE(e.has_value()) << bad;
    EXPECT_EQ(e->status, 400) << bad;
  }
  c.base64 = true;
  const auto r = embeddings_response(c, "m", {{1.0f, -2.5f}}, 3);
  // 1.0f = 00 00 80 3f, -2.5f = 00 00 20 c0 (little-endian float32).
  EXPECT_EQ(r["data"][0]["embedding"], "AACAPwAAIMA=");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 3);
  c.base64 = false;
  EXPECT_EQ(embeddings_response(c, "m", {{1.0f, -2.5f}}, 3)["data"][0]["embedding"][1], -2.5);
}

}  // namespace
}  // namespace troupe::openai
