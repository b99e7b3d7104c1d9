// Real models besides the two troupe was built around, against llama.cpp:
// Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q5_0 and Q8_0 weights; QK-norm, sandwich
// norms, GELU, sliding-window layers), llama.cpp's greedy tokens and
// perplexities recorded by tools/record_model_golden.py in
// tests/data/model_golden.json.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/engine/perplexity.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/integration/engine_fixture.hpp"
#include "tests/integration/process.hpp"
#include "tests/integration/requests.hpp"
#include "tests/integration/server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe {
namespace {

using testing::engine_fixture;
using testing::read_file;

nlohmann::json model_golden(const std::string& name) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/tests/data/model_golden.json");
  EXPECT_TRUE(in.good()) << "missing tests/data/model_golden.json";
  return nlohmann::json::parse(in)["models"][name];
}

// Gemma 3 is sensitive to the last bits of its sums: llama.cpp's own two
// attention paths (-fa off and on) move the top-2 gap of the first token
// after "In the beginning" from 0.124 to 0.338.  So the tokens must match up to the first step
// where llama.cpp's two best candidates are closer than k_near_tie, or where llama.cpp did not
// reproduce its own token when fed the prefix as a prompt (a null gap: its batched prefill and its
// decode disagree there); and, overall, at least 30% of the tokens (measured: 57%, four prompts
// whole; every divergence at a gap of 0.1383 or less).  The bound is 0.5, more than twice
// llama.cpp's own 0.21 shift, because another CPU's kernel code adds its own rounding; a wrong RoPE
// base for the windowed layers still fails it (divergences at gaps of 0.597, 1.03 and 3.9, 15% of
// the tokens).
constexpr double k_near_tie = 0.5;

TEST(Gemma3, GreedyTokensMatchLlamaCppUpToANearTie) {
  const auto g = model_golden("gemma3-270m");
  engine_fixture e("gemma3-270m");
  auto tok = tokenizer::create(e.model->vocab());
  size_t matched = 0, total = 0;
  int whole = 0;
  for (const auto& p : g["greedy"]) {
    const auto r = testing::run_golden_prompt(e, *tok, p);
    const auto &want = r.want, &got = r.got;
    const size_t same = r.same;
    const auto& margins = p["top2_margin"];
    matched += same;
    total += want.size();
    whole += r.whole();
    if (r.whole()) continue;
    const double margin = margins[same].is_null() ? 0.0 : margins[same].get<double>();
    EXPECT_LT(margin, k_near_tie) << p["prompt"] << ": token " << same << " is " << got[same]
                                  << ", llama.cpp's is " << want[same] << " (its top-2 gap "
                                  << margins[same] << ", no near-tie)";
    std::printf("[gemma3] \"%s\": %zu of %zu tokens, then a llama.cpp near-tie (gap %s)\n",
                p["prompt"].get<std::string>().c_str(), same, want.size(),
                margins[same].dump().c_str());
  }
  std::printf("[gemma3] %zu of %zu tokens before the first near-tie, %d of %zu prompts whole\n",
              matched, total, whole, g["greedy"].size());
  EXPECT_GE(matched * 10, total * 3);
}

// Perplexity within 0.5% of llama-perplexity's at context 128, and at
// context 1024, where the windowed layers see only the last 512 tokens.
// (llama.cpp's own figure moves by more than that with its build and
// attention path: docs/correctness.md.)
TEST(Gemma3, PerplexityWithinHalfPercentOfLlamaCpp) {
  const auto g = model_golden("gemma3-270m");
  engine_options opts;
  opts.kv_bytes = 64u << 20;
  engine_fixture e("gemma3-270m", opts);
  auto tok = tokenizer::create(e.model->vocab());
  const std::string dir = std::string(TROUPE_SOURCE_DIR);
  for (const auto& [ctx, text] : {std::pair{128, dir + "/../shared/golden/ppl_stories.txt"},
                                  std::pair{1024, dir + "/tests/data/ppl_long.txt"}}) {
    const auto tokens = tok->encode(read_file(text), true, false);
    const auto res =
        perplexity(e.forward(), e.info.n_pages, e.info.page_size, tokens, ctx, tok->bos(), 512);
    const double want = g["ppl"][std::to_string(ctx)].get<double>();
    EXPECT_NEAR(res.ppl, want, want * 0.005) << "context " << ctx;
    std::printf("[gemma3] perplexity at context %d: %.4f, llama.cpp %.4f (%+.2f%%)\n", ctx, res.ppl,
                want, 100.0 * (res.ppl / want - 1.0));
  }
}

// A gemma3 file that asks for a final logit cap (Gemma 3's own set none;
// this is the 270M file with `final_logit_softcapping = 30` added by
// tools/make_softcap_fixture.py): llama-perplexity's figure on that copy.
// The cap moves the figure by two thirds (llama.cpp: 9.37 -> 15.57 on the
// recording host), so a forward without it, or with it in the wrong place,
// is far outside.  1.5%, not 0.5%: the figure was recorded on an AVX2 host,
// where llama.cpp's own figure for the uncapped file (9.3664) stands 1.2%
// off the one recorded for the test above on an AVX-512 host (9.2561),
// which troupe matches within 0.2% on both.
TEST(Gemma3, FinalLogitSoftcappingAsLlamaCppAppliesIt) {
  const auto g = model_golden("gemma3-softcap30");
  const double uncapped = model_golden("gemma3-270m")["ppl"]["128"].get<double>();
  engine_fixture e("gemma3-softcap30");
  auto tok = tokenizer::create(e.model->vocab());
  ASSERT_EQ(e.model->hparams().final_logit_softcap, 30.0f);
  const auto tokens = tok->encode(
      read_file(std::string(TROUPE_SOURCE_DIR) + "/../shared/golden/ppl_stories.txt"), true, false);
  const auto res =
      perplexity(e.forward(), e.info.n_pages, e.info.page_size, tokens, 128, tok->bos(), 512);
  const double want = g["ppl"]["128"].get<double>();
  EXPECT_NEAR(res.ppl, want, want * 0.015);
  EXPECT_GT(res.ppl, uncapped * 1.3) << "the cap is not applied";
  std::printf("[gemma3] softcapped perplexity at context 128: %.4f, llama.cpp %.4f (%+.2f%%)\n",
              res.ppl, want, 100.0 * (res.ppl / want - 1.0));
  // And the logits a step returns are capped.
  linear_pages pages(e.info.n_pages, e.info.page_size);
  sequence_slot seq;
  auto fwd = e.forward();
  const auto logits =
      feed_tokens(fwd, pages, seq, {tokens.begin(), tokens.begin() + 16}, 512, false);
  ASSERT_FALSE(logits.empty());
  for (float l : logits) ASSERT_LE(std::fabs(l), 30.0f);
  EXPECT_GT(*std::max_element(logits.begin(), logits.end()), 10.0f);
}

// troupe serve with Gemma 3 on two instances: eight concurrent streams
// (four prompts twice, so prefix caching shares their pages) equal
// `troupe generate` run alone, one of them moved to the other instance
// and back while it streams, and the pages all come back.
TEST(Gemma3, ServedConcurrentlyAndMigratedItMatchesOffline) {
  using namespace std::chrono_literals;
  const std::vector<std::string> prompts = {"Once upon a time", "The capital of France is",
                                            "Water boils at", "The history of the Roman Empire"};
  const int n = 40;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(testing::offline_tokens("gemma3-270m", p, n));
  testing::server_process server("--local-instances 2", "troupe serve: listening on ",
                                 "gemma3-270m");
  client::connection c(server.endpoint());
  std::map<uint64_t, client::result> results;
  for (uint64_t id = 1; id <= 8; ++id) {
    wire::Generate g;
    g.set_request_id(id);
    g.set_text(prompts[(id - 1) % prompts.size()]);
    g.set_max_tokens(id == 1 ? 160 : n);
    g.set_ignore_eos(true);
    results[id];
    c.generate(g);
  }
  auto find = [&](uint64_t id) {
    auto it = results.find(id);
    return it == results.end() ? nullptr : &it->second;
  };
  auto& moving = results[1];
  ASSERT_TRUE(testing::receive_until(
      c, find, [&] { return !moving.token_ids.empty() || moving.done(); }, 60s));
  const int moved = testing::migrate_back_and_forth(server, c, moving, find, 1, 4, 2);
  ASSERT_TRUE(testing::receive_until(
      c, find,
      [&] {
        for (const auto& [id, r] : results)
          if (!r.done()) return false;
        return true;
      },
      120s));
  for (const auto& [id, r] : results) {
    ASSERT_FALSE(r.error) << "request " << id << ": " << r.error->message();
    const auto& w = want[(id - 1) % prompts.size()];
    const std::vector<int32_t> head(r.token_ids.begin(),
                                    r.token_ids.begin() + std::min<size_t>(n, r.token_ids.size()));
    EXPECT_EQ(head, w) << "request " << id;
  }
  EXPECT_GE(moved, 1);
  EXPECT_GE(server.admin("trace 1")["migrations"].get<int>(), 1);
  for (const auto& i : server.wait_engine_idle(15s)) EXPECT_EQ(i["used_pages"], 0) << i.dump();
}

}  // namespace
}  // namespace troupe
