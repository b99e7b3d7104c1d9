// The OpenAI API's endpoints beside completions (tools/client/
// openai_endpoints, issue 34): bearer keys, CORS origins, and the bodies of
// /tokenize and /detokenize with their errors.
#include <gtest/gtest.h>

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
                          json{{"content", "x"}, {"with_pieces", "yes"}}}) {
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
        json{{"tokens", "1"}}, json::object()}) {
    auto e = parse_detokenize(bad, 32000, ids);
    ASSERT_TRUE(e.has_value()) << bad.dump();
    EXPECT_EQ(e->param, "tokens");
  }
}

}  // namespace
}  // namespace troupe::openai
