// Pipeline parallelism (actors/pipeline.hpp, issue 35): a model split by
// layers into stages on slices of the device, a step's sequences going
// through them in micro-batches.  Same kernels on every row, so the same
// logits bit for bit as one device: llama.cpp's golden tokens on
// stories15M with 2 and 3 stages, one device's logits on a batched step of
// several models (llama, Gemma 3's windowed layers and sandwich norms,
// Qwen 3's QK-norm), one device's perplexity exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "actors/pipeline.hpp"
#include "runtime/engine/perplexity.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/integration/engine_fixture.hpp"

namespace troupe {
namespace {

using testing::engine_fixture;
using testing::read_file;

const std::string golden_dir = std::string(TROUPE_SOURCE_DIR) + "/../shared/golden";

engine_options stages(int n) {
  engine_options o;
  o.pipeline_stages = n;
  o.kv_bytes = 32u << 20;
  return o;
}

TEST(PipelineParallel, StageLayersSplitEvenlyAndWhole) {
  for (int layers : {1, 6, 18, 30})
    for (int n = 1; n <= std::min(layers, 7); ++n) {
      int next = 0;
      for (int i = 0; i < n; ++i) {
        const auto [first, end] = stage_layers(layers, n, i);
        EXPECT_EQ(first, next);
        EXPECT_GE(end - first, layers / n);
        EXPECT_LE(end - first, (layers + n - 1) / n);
        next = end;
      }
      EXPECT_EQ(next, layers);
    }
}

TEST(PipelineParallel, StoriesGreedyTokensMatchLlamaCppOnTwoAndThreeStages) {
  std::ifstream in(golden_dir + "/stories15M_greedy.json");
  ASSERT_TRUE(in.good()) << "missing " << golden_dir;
  const auto golden = nlohmann::json::parse(in);
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " stages");
    engine_fixture e("stories15m", stages(n));
    EXPECT_NE(e.info.device_name.find("pipeline of " + std::to_string(n)), std::string::npos)
        << e.info.device_name;
    EXPECT_EQ(e.info.n_layers, e.model->hparams().n_layer);
    for (const auto& g : golden)
      EXPECT_EQ(e.greedy(g["prompt_token_ids"].get<std::vector<int32_t>>(), 64),
                g["greedy_token_ids"].get<std::vector<int32_t>>())
          << g["prompt"];
  }
}

// A step of several prompts (so several micro-batches), with logits of
// every prompt's last row and of a row inside one, and two embedding rows;
// then a decode step of one row each, reading the first step's KV.
const int prompt_lens[] = {37, 5, 70, 12, 1};

forward_batch several_prompts(const engine_fixture& e) {
  forward_batch b;
  int page = 0;
  for (int s = 0; s < 5; ++s) {
    forward_seq q;
    q.first_row = static_cast<int32_t>(b.tokens.size());
    q.n_rows = prompt_lens[s];
    for (int i = 0; i < prompt_lens[s]; ++i) {
      b.tokens.push_back(1 + (s * 131 + i * 17) % 900);
      b.positions.push_back(i);
    }
    for (int p = 0; p * e.info.page_size <= prompt_lens[s]; ++p) q.pages.push_back(page++);
    b.logit_rows.push_back(q.first_row + q.n_rows - 1);
    b.seqs.push_back(std::move(q));
  }
  b.logit_rows.push_back(b.seqs[2].first_row + 30);
  b.hidden_rows = {b.seqs[0].first_row + 3, b.seqs[3].first_row};
  return b;
}

forward_batch decode_after(const forward_batch& prompts) {
  forward_batch b;
  for (size_t s = 0; s < prompts.seqs.size(); ++s) {
    b.tokens.push_back(static_cast<int32_t>(7 + s));
    b.positions.push_back(prompt_lens[s]);
    b.seqs.push_back({static_cast<int32_t>(s), 1, prompts.seqs[s].pages});
    b.logit_rows.push_back(static_cast<int32_t>(s));
  }
  return b;
}

std::vector<forward_result> two_steps(engine_fixture& e) {
  const auto b = several_prompts(e);
  auto fwd = e.forward();
  return {fwd(b), fwd(decode_after(b))};
}

// The two steps on one device (the same KV arena size as stages()).
std::vector<forward_result> two_steps_on_one_device(const std::string& model) {
  engine_options one;
  one.kv_bytes = 32u << 20;
  engine_fixture e(model, one);
  return two_steps(e);
}

class PipelineModels : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineModels, BatchedStepLogitsEqualOneDeviceBitForBit) {
  const auto want = two_steps_on_one_device(GetParam());
  ASSERT_FALSE(want[0].logits.empty());
  engine_fixture e(GetParam(), stages(2));
  const auto got = two_steps(e);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(got[i].logits, want[i].logits);
    EXPECT_EQ(got[i].hidden, want[i].hidden);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineModels,
                         ::testing::Values("stories15m", "gemma3-270m", "qwen3-dense"));

TEST(PipelineParallel, PerplexityEqualsOneDevice) {
  engine_fixture one("stories15m");
  engine_fixture two("stories15m", stages(2));
  auto tok = tokenizer::create(one.model->vocab());
  const auto tokens = tok->encode(read_file(golden_dir + "/ppl_stories.txt"), true, false);
  const auto a =
      perplexity(one.forward(), one.info.n_pages, one.info.page_size, tokens, 128, tok->bos(), 512);
  const auto b =
      perplexity(two.forward(), two.info.n_pages, two.info.page_size, tokens, 128, tok->bos(), 512);
  EXPECT_EQ(a.chunks, b.chunks);
  EXPECT_EQ(a.ppl, b.ppl);
  EXPECT_NEAR(b.ppl, 3.9768, 3.9768 * 0.005);
}

// Layer migration (BanaServe's, runtime/device/layer_migration.hpp): the
// last stage also runs the classifier (stories15M's is about nine layers'
// worth), so after a window of steps the pipeline moves layers to the
// first stage, weights and KV, between two steps of greedy decodes (the new
// stages load beside the old ones, so the move lands some steps later:
// rounds of the golden prompts go on, bounded, until it has); the tokens
// are llama.cpp's in every round.  With rebalancing off, nothing moves.
TEST(PipelineParallel, LayersMoveOffTheBusyLastStageMidStreamAndTokensStay) {
  std::ifstream in(golden_dir + "/stories15M_greedy.json");
  const auto golden = nlohmann::json::parse(in);
  for (double threshold : {0.1, 0.0}) {
    SCOPED_TRACE("threshold " + std::to_string(threshold));
    auto o = stages(2);
    o.pipeline_window = 4;
    o.pipeline_rebalance = threshold;
    engine_fixture e("stories15m", o);
    EXPECT_EQ(e.info.stage_first_layers, (std::vector<int32_t>{0, 3}));
    caf::scoped_actor self{*e.sys};
    auto info = [&] {
      device_info now;
      self->request(e.dev, caf::infinite, info_atom::value)
          .receive([&](device_info& i) { now = std::move(i); }, [](caf::error&) { FAIL(); });
      return now;
    };
    // Rounds after the move has landed: one at least, where it moves.
    int after = 0;
    for (int round = 0; round < 20 && after < 1; ++round) {
      for (const auto& g : golden)
        EXPECT_EQ(e.greedy(g["prompt_token_ids"].get<std::vector<int32_t>>(), 64),
                  g["greedy_token_ids"].get<std::vector<int32_t>>())
            << g["prompt"] << ", round " << round;
      if (info().layer_moves > 0 || threshold == 0) ++after;
    }
    const auto now = info();
    ASSERT_EQ(now.stage_first_layers.size(), 2u);
    if (threshold > 0) {
      EXPECT_GT(now.layer_moves, 0u);
      EXPECT_GT(now.stage_first_layers[1], 3) << "layers moved to the first stage";
    } else {
      EXPECT_EQ(now.layer_moves, 0u);
      EXPECT_EQ(now.stage_first_layers[1], 3);
    }
  }
}

// UELLM's HELR placement over the stages' devices, measured on them (two
// slices of one CPU: about equal speeds, and a message's round trip as the
// link): lr and helr take one device, as a second would only add a link;
// he with each device giving the model at most 100 MiB, which holds 4 of
// stories15M's 6 layers with their KV, takes two.  Every placement keeps
// llama.cpp's tokens; one where no set of devices holds the model is
// refused, saying what it needs.
TEST(PipelineParallel, HelrPlacementPicksTheDevicesByMeasurementAndTokensStay) {
  std::ifstream in(golden_dir + "/stories15M_greedy.json");
  const auto golden = nlohmann::json::parse(in);
  struct placement {
    const char* mode;
    int device_mb;
    size_t stages;
  };
  for (const auto& p : {placement{"lr", 0, 1}, placement{"helr", 0, 1}, placement{"he", 100, 2}}) {
    SCOPED_TRACE(std::string(p.mode) + ", " + std::to_string(p.device_mb) + " MiB");
    auto o = stages(2);
    o.pipeline_placement = p.mode;
    o.pipeline_device_mb = p.device_mb;
    o.pipeline_rebalance = 0;
    engine_fixture e("stories15m", o);
    ASSERT_EQ(e.info.stage_first_layers.size(), p.stages) << e.info.device_name;
    for (const auto& g : golden)
      EXPECT_EQ(
          e.greedy(g["prompt_token_ids"].get<std::vector<int32_t>>(), 32),
          std::vector<int32_t>(g["greedy_token_ids"].begin(), g["greedy_token_ids"].begin() + 32))
          << g["prompt"];
  }
  auto o = stages(2);
  o.pipeline_placement = "he";
  o.pipeline_device_mb = 10;
  try {
    engine_fixture e("stories15m", o);
    ADD_FAILURE() << "a model that no device set holds was placed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no set of devices"), std::string::npos) << e.what();
  }
}

TEST(PipelineParallel, UnfitPipelinesAreRefusedByName) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto open = [](const std::string& name) {
    auto r = resolve_model(name);
    return model_file::open(r.model_path, r.tokenizer_path);
  };
  auto stories = open("stories15m");
  try {
    spawn_pipeline(sys, stories, stages(7));
    ADD_FAILURE() << "7 stages of 6 layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("6 layers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spawn_pipeline(sys, open("moe-4x2-f32"), stages(2)), model_error);
  // A stage's own checks: its input is hidden states of every row.
  engine_options late = stages(1);
  late.layer_first = 3;
  llama_forward stage(stories, late);
  EXPECT_FALSE(stage.first_stage());
  EXPECT_TRUE(stage.last_stage());
  forward_batch b;
  b.tokens = {1, 2};
  b.positions = {0, 1};
  b.seqs.push_back({0, 2, {0}});
  b.logit_rows = {1};
  EXPECT_THROW(stage.run(b), std::invalid_argument);
  b.stage_input.assign(2 * stories->hparams().n_embd, 0.5f);
  EXPECT_EQ(stage.run(b).logits.size(), static_cast<size_t>(stories->hparams().n_vocab));
  late.layer_first = 0;
  late.layer_end = 3;
  llama_forward early(stories, late);
  b.stage_input.clear();
  EXPECT_THROW(early.run(b), std::invalid_argument);  // logits asked of a stage before the last
  b.logit_rows.clear();
  EXPECT_EQ(early.run(b).stage_output.size(), 2u * stories->hparams().n_embd);
  late.layer_end = 9;
  EXPECT_THROW(llama_forward(stories, late), std::invalid_argument);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// KV-head migration (BanaServe's attention-level migration,
// runtime/device/head_group.hpp): a group of a stage's KV heads attends
// on another stage, which holds the group's pages.  Same kernels on the
// same values: one device's logits bit for bit, with the group moved
// before a step (the helper's copy of the pages the step before wrote),
// while steps run away from home, and after it came home (the donor's
// cache kept every head).
std::string move_heads(engine_fixture& e, int32_t from, int32_t to, int32_t heads) {
  caf::scoped_actor self{*e.sys};
  std::string out;
  self->request(e.dev, caf::infinite, move_heads_atom::value, from, to, heads)
      .receive([&](std::string& s) { out = s; },
               [&](caf::error& err) { out = "error: " + self->system().render(err); });
  return out;
}

class HeadMigration : public ::testing::TestWithParam<std::string> {};

TEST_P(HeadMigration, LogitsEqualOneDeviceWithAGroupOfKvHeadsOnAnotherStage) {
  const auto want = two_steps_on_one_device(GetParam());
  auto o = stages(2);
  o.pipeline_rebalance = 0;
  const auto check = [&](const std::vector<forward_result>& got) {
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE("step " + std::to_string(i));
      EXPECT_EQ(got[i].logits, want[i].logits);
      EXPECT_EQ(got[i].hidden, want[i].hidden);
    }
  };
  {
    SCOPED_TRACE("the prompts at home, the decode step away from stage 1 on stage 0");
    engine_fixture e(GetParam(), o);
    const int n_kv = e.info.n_kv_heads;
    ASSERT_GE(n_kv, 2);
    const auto b = several_prompts(e);
    auto fwd = e.forward();
    std::vector<forward_result> got{fwd(b)};
    const auto moved = move_heads(e, 1, 0, n_kv - 1);
    EXPECT_NE(moved.find("moved the attention of KV heads [1, " + std::to_string(n_kv) + ")"),
              std::string::npos)
        << moved;
    got.push_back(fwd(decode_after(b)));
    check(got);
  }
  {
    SCOPED_TRACE("the prompts away from stage 0 on stage 1, the decode step at home");
    engine_fixture e(GetParam(), o);
    EXPECT_EQ(move_heads(e, 0, 1, 1).rfind("moved", 0), 0u);
    const auto b = several_prompts(e);
    auto fwd = e.forward();
    std::vector<forward_result> got{fwd(b)};
    EXPECT_NE(move_heads(e, 0, 1, 0).find("1 KV head(s) of stage 0 attend at home again"),
              std::string::npos);
    got.push_back(fwd(decode_after(b)));
    check(got);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HeadMigration,
                         ::testing::Values("stories15m", "smollm2-135m-instruct", "qwen3-dense"));

// Bad moves are refused by name, and a layer move while a group is away
// too (bring it home first); the greedy tokens of a stream whose heads move mid-way stay
// llama.cpp's.
TEST(HeadMigration, MovesMidStreamKeepLlamaCppsTokensAndBadMovesAreRefused) {
  std::ifstream in(golden_dir + "/stories15M_greedy.json");
  const auto golden = nlohmann::json::parse(in);
  auto o = stages(2);
  o.pipeline_rebalance = 0;
  engine_fixture e("stories15m", o);
  EXPECT_NE(move_heads(e, 0, 0, 1).find("not two of the 2 stages"), std::string::npos);
  EXPECT_NE(move_heads(e, 0, 2, 1).find("not two of the 2 stages"), std::string::npos);
  EXPECT_NE(move_heads(e, 0, 1, 6).find("keeps one at least"), std::string::npos);
  EXPECT_NE(move_heads(e, 0, 1, 0).find("no KV heads of stage 0"), std::string::npos);
  for (const auto& g : golden) {
    const auto prompt = g["prompt_token_ids"].get<std::vector<int32_t>>();
    const auto want = g["greedy_token_ids"].get<std::vector<int32_t>>();
    linear_pages pages(e.info.n_pages, e.info.page_size);
    sequence_slot seq;
    auto fwd = e.forward();
    auto logits = feed_tokens(fwd, pages, seq, prompt, 512, false);
    std::vector<int32_t> got;
    for (int i = 0; i < 48; ++i) {
      if (i == 16) {
        EXPECT_EQ(move_heads(e, 1, 0, 4).rfind("moved", 0), 0u);
        EXPECT_NE(move_heads(e, 0, 1, 1).find("one group at a time"), std::string::npos);
        caf::scoped_actor self{*e.sys};
        self->request(e.dev, caf::infinite, move_layers_atom::value, 1, 0, 1)
            .receive([](std::string& s) { ADD_FAILURE() << "a layer move ran: " << s; },
                     [&](caf::error& err) {
                       EXPECT_NE(self->system().render(err).find("bring them home first"),
                                 std::string::npos);
                     });
      }
      if (i == 32) {
        EXPECT_NE(move_heads(e, 1, 0, 0).find("at home again"), std::string::npos);
      }
      const auto best =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      got.push_back(best);
      logits = feed_tokens(fwd, pages, seq, {best}, 1, false);
    }
    EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + 48)) << g["prompt"];
  }
}

}  // namespace
}  // namespace troupe
