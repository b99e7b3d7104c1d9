// The request actor's Generate checks (actors/generate_check), apart from
// CAF: what is accepted becomes the sequence, what is not names its field,
// and the fields reached before a refusal keep their values (the trace
// shows them).
#include <gtest/gtest.h>

#include <cstdio>

#include "actors/generate_check.hpp"

namespace troupe {
namespace {

// A SentencePiece vocabulary: <unk> <s> </s>, the byte pieces, a few words.
std::unique_ptr<tokenizer> small_tokenizer() {
  vocab_data v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.kinds = {token_kind::unknown, token_kind::control, token_kind::control};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.tokens.push_back(name);
    v.kinds.push_back(token_kind::byte);
  }
  for (const char* p : {"\xE2\x96\x81Once", "\xE2\x96\x81upon"}) {
    v.tokens.push_back(p);
    v.kinds.push_back(token_kind::normal);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_space_prefix = true;
  return tokenizer::create(v);
}

struct checked {
  std::optional<generate_rejection> bad;
  generate_plan plan;
};

const tokenizer& tok() {
  static const auto t = small_tokenizer();
  return *t;
}

checked run(const wire::Generate& g, int32_t max_len = 64) {
  generate_limits limits;
  limits.tok = &tok();
  limits.chat_template = "<|im_start|>{{ m }}<|im_end|>";
  limits.add_bos = true;
  limits.max_len = max_len;
  limits.default_max_tokens = 16;
  limits.offline_ttft_ms = 900;
  checked c;
  c.bad = check_generate(g, limits, c.plan);
  return c;
}

TEST(GenerateCheck, TextPromptBecomesTheSequence) {
  wire::Generate g;
  g.set_text("Once upon");
  // A named string: GCC 12 warns (-Wrestrict, a false positive) when
  // add_stop's inlined copy gets a literal here.
  const std::string newline = "\n";
  g.add_stop(newline);
  g.add_stop_token_ids(2);
  g.set_request_class(wire::OFFLINE);
  g.set_stream(false);
  g.set_guided_regex("(yes|no)");
  auto c = run(g);
  ASSERT_FALSE(c.bad) << c.bad->message;
  EXPECT_EQ(c.plan.prompt, tok().encode("Once upon", true, false));
  EXPECT_EQ(c.plan.prompt.front(), 1);
  EXPECT_EQ(c.plan.max_tokens, 16);
  EXPECT_EQ(c.plan.cls, seq_class::offline);
  EXPECT_EQ(c.plan.slo_ttft_ms, 900);
  EXPECT_EQ(c.plan.ttft_target_ms, 900);
  EXPECT_FALSE(c.plan.stream);
  EXPECT_EQ(c.plan.constraint, "(yes|no)");
  EXPECT_EQ(c.plan.stops, std::vector<std::string>{"\n"});
  EXPECT_EQ(c.plan.stop_tokens, std::vector<int32_t>{2});
}

TEST(GenerateCheck, BadRequestsNameWhatIsWrong) {
  auto message = [](const wire::Generate& g) {
    auto c = run(g);
    return c.bad ? c.bad->message : std::string("accepted");
  };
  wire::Generate g;
  EXPECT_EQ(message(g), "empty prompt: give text, tokens or chat");
  g.mutable_tokens()->add_ids(5000);
  EXPECT_NE(message(g).find("outside the vocabulary"), std::string::npos);
  g.mutable_tokens()->set_ids(0, 5);
  g.set_max_tokens(64);
  EXPECT_EQ(run(g).bad->code, wire::CONTEXT_OVERFLOW);
  g.set_max_tokens(8);
  g.set_guided_regex("");
  EXPECT_NE(message(g).find("guided_regex is empty"), std::string::npos);
  g.set_guided_json("{\"type\":\"string\",\"minLength\":\"x\"}");
  EXPECT_NE(message(g).find("output constraint: schema: bad minLength"), std::string::npos);
  g.clear_guided_json();
  g.set_draft_tokens(17);
  auto c = run(g);
  ASSERT_TRUE(c.bad);
  EXPECT_NE(c.bad->message.find("draft_tokens must be 0..16"), std::string::npos);
  // Refused after the prompt was taken: the trace still counts its tokens.
  EXPECT_EQ(c.plan.prompt, std::vector<int32_t>{5});
  g.set_draft_tokens(4);
  c = run(g);
  ASSERT_FALSE(c.bad) << c.bad->message;
  EXPECT_EQ(c.plan.draft_tokens, 4);
  // The length predictor's class: at most 128 bytes; the TPOT target kept.
  g.set_prompt_class(std::string(129, 'x'));
  EXPECT_EQ(message(g), "prompt_class: at most 128 bytes, got 129");
  g.set_prompt_class(std::string(128, 'x'));
  g.set_slo_tpot_ms(25);
  c = run(g);
  ASSERT_FALSE(c.bad) << c.bad->message;
  EXPECT_EQ(c.plan.prompt_class, std::string(128, 'x'));
  EXPECT_EQ(c.plan.slo_tpot_ms, 25);
  // An enum value the protocol does not define (proto3 keeps it).
  g.set_request_class(static_cast<wire::RequestClass>(7));
  EXPECT_EQ(message(g), "request_class 7 is not ONLINE (0) or OFFLINE (1)");
}

// An embedding (Generate.embedding): nothing is generated, so what shapes
// a generation is refused naming the field; the prompt may fill the context.
TEST(GenerateCheck, EmbeddingsRefuseGenerationFieldsByName) {
  wire::Generate g;
  g.set_embedding(true);
  for (int i = 0; i < 64; ++i) g.mutable_tokens()->add_ids(5);
  auto c = run(g);
  ASSERT_FALSE(c.bad) << c.bad->message;
  EXPECT_TRUE(c.plan.embed);
  EXPECT_EQ(c.plan.max_tokens, 1);
  g.mutable_tokens()->add_ids(5);  // one past the context
  EXPECT_EQ(run(g).bad->code, wire::CONTEXT_OVERFLOW);
  g.mutable_tokens()->mutable_ids()->RemoveLast();
  g.mutable_sampling()->set_temperature(0.5f);
  EXPECT_EQ(run(g).bad->message,
            "embedding: sampling.temperature does not apply (nothing is generated)");
  g.clear_sampling();
  g.mutable_sampling()->mutable_logit_bias()->insert({3, 1.0f});
  EXPECT_EQ(run(g).bad->message,
            "embedding: sampling.logit_bias does not apply (nothing is generated)");
  g.clear_sampling();
  g.mutable_tokens()->mutable_ids()->Truncate(8);
  g.set_max_tokens(4);
  EXPECT_EQ(run(g).bad->message, "embedding: max_tokens does not apply (nothing is generated)");
}

}  // namespace
}  // namespace troupe
