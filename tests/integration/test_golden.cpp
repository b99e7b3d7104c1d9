// The engine against llama.cpp's outputs (../shared/golden): greedy tokens
// on stories15M and perplexity, through the device actor in an actor system.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/engine/perplexity.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/integration/engine_fixture.hpp"

namespace troupe {
namespace {

using testing::engine_fixture;
using testing::read_file;

const std::string golden_dir = std::string(TROUPE_SOURCE_DIR) + "/../shared/golden";

nlohmann::json load_golden() {
  std::ifstream in(golden_dir + "/stories15M_greedy.json");
  EXPECT_TRUE(in.good()) << "missing " << golden_dir;
  return nlohmann::json::parse(in);
}

TEST(GoldenStories, GreedyTokensMatchLlamaCpp) {
  engine_fixture e("stories15m");
  auto tok = tokenizer::create(e.model->vocab());
  auto golden = load_golden();
  ASSERT_GE(golden.size(), 1u);
  for (const auto& g : golden) {
    auto prompt = tok->encode(g["prompt"].get<std::string>(), true, false);
    EXPECT_EQ(prompt, g["prompt_token_ids"].get<std::vector<int32_t>>()) << g["prompt"];
    auto out = e.greedy(g["prompt_token_ids"].get<std::vector<int32_t>>(), 64);
    EXPECT_EQ(out, g["greedy_token_ids"].get<std::vector<int32_t>>()) << g["prompt"];
    EXPECT_EQ(tok->decode(out), g["greedy_text"].get<std::string>());
  }
}

// The same prompts batched together as separate sequences in one forward
// call give the same first token as alone: the flattened batch is sound.
TEST(GoldenStories, BatchedPrefillMatchesGolden) {
  engine_fixture e("stories15m");
  auto golden = load_golden();
  forward_batch b;
  int page = 0;
  for (const auto& g : golden) {
    auto ids = g["prompt_token_ids"].get<std::vector<int32_t>>();
    forward_seq s;
    s.first_row = static_cast<int32_t>(b.tokens.size());
    s.n_rows = static_cast<int32_t>(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      b.tokens.push_back(ids[i]);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    for (size_t p = 0; p * e.info.page_size < ids.size(); ++p) s.pages.push_back(page++);
    b.logit_rows.push_back(s.first_row + s.n_rows - 1);
    b.seqs.push_back(std::move(s));
  }
  auto r = e.forward()(b);
  ASSERT_EQ(r.logits.size(), golden.size() * static_cast<size_t>(r.n_vocab));
  for (size_t i = 0; i < golden.size(); ++i) {
    auto row = r.logits.begin() + i * r.n_vocab;
    int32_t best = static_cast<int32_t>(std::max_element(row, row + r.n_vocab) - row);
    EXPECT_EQ(best, golden[i]["greedy_token_ids"][0].get<int32_t>()) << golden[i]["prompt"];
  }
}

TEST(GoldenStories, PerplexityWithinHalfPercentOfLlamaCpp) {
  engine_fixture e("stories15m");
  auto tok = tokenizer::create(e.model->vocab());
  auto tokens = tok->encode(read_file(golden_dir + "/ppl_stories.txt"), true, false);
  auto res =
      perplexity(e.forward(), e.info.n_pages, e.info.page_size, tokens, 128, tok->bos(), 512);
  EXPECT_EQ(res.chunks, 3);
  EXPECT_NEAR(res.ppl, 3.9768, 3.9768 * 0.005);
}

TEST(GoldenStories, F32KvCachePerplexityAlsoClose) {
  engine_options opts;
  opts.kv_f16 = false;
  engine_fixture e("stories15m", opts);
  auto tok = tokenizer::create(e.model->vocab());
  auto tokens = tok->encode(read_file(golden_dir + "/ppl_stories.txt"), true, false);
  auto res =
      perplexity(e.forward(), e.info.n_pages, e.info.page_size, tokens, 128, tok->bos(), 512);
  EXPECT_NEAR(res.ppl, 3.9768, 3.9768 * 0.005);
}

}  // namespace
}  // namespace troupe
