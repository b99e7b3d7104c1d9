// KV-head migration's trigger (runtime/device/head_migration.hpp): a group
// moves off an overloaded stage only where attention is a large share of
// its time (long contexts) and the round trips it adds cost less than the
// attention it sheds; the group size is the best one; balanced stages and
// short contexts stay.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "runtime/device/head_migration.hpp"

namespace troupe {
namespace {

// SmolLM2 135M's geometry.
double smollm2_share(double context) {
  return attention_share(576, 9, 3, 64, 1536, context);
}

TEST(HeadMovePlan, AttentionsShareGrowsWithTheContext) {
  EXPECT_EQ(smollm2_share(0), 0.0);
  EXPECT_LT(smollm2_share(200), 0.15);
  EXPECT_GT(smollm2_share(8192), 0.6);
  for (double c = 16; c < 32768; c *= 2) EXPECT_LT(smollm2_share(c), smollm2_share(2 * c));
}

TEST(HeadMovePlan, ALongContextOverloadedStageShedsHeadsToTheLightest) {
  layer_migration_options o;
  head_move_inputs in;
  // Three stages of 10 layers; the middle one twice as busy (a slower
  // device), over 100 steps of long contexts.
  in.stages = {{10, 1.0}, {10, 2.0}, {10, 0.8}};
  in.n_kv = 4;
  in.steps = 100;
  in.attention_share = smollm2_share(16384);
  in.trip_s = 0.0002;
  const auto m = plan_head_move(in, o);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->from, 1);
  EXPECT_EQ(m->to, 2);
  EXPECT_GE(m->heads, 1);
  EXPECT_LT(m->heads, 4);
  EXPECT_GT(m->gain, 0.1);
  // Short contexts: attention is a small share, the round trips cost more.
  in.attention_share = smollm2_share(128);
  in.trip_s = 0.0006;
  EXPECT_FALSE(plan_head_move(in, o));
}

TEST(HeadMovePlan, BalancedStagesOneHeadOrNoStepsStay) {
  layer_migration_options o;
  head_move_inputs in;
  in.stages = {{10, 1.0}, {10, 1.05}};
  in.n_kv = 4;
  in.steps = 100;
  in.attention_share = 0.8;
  in.trip_s = 0;
  EXPECT_FALSE(plan_head_move(in, o)) << "within the threshold";
  in.stages = {{10, 1.0}, {10, 3.0}};
  EXPECT_TRUE(plan_head_move(in, o));
  in.n_kv = 1;
  EXPECT_FALSE(plan_head_move(in, o)) << "one KV head: the donor must keep it";
  in.n_kv = 4;
  in.steps = 0;
  EXPECT_FALSE(plan_head_move(in, o));
  in.steps = 100;
  o.horizon_s = 1e-6;
  EXPECT_FALSE(plan_head_move(in, o)) << "a move that does not pay for its pause";
}

// On random stages the plan's group is the best group size for the
// donor and helper it names (brute force over every size).
TEST(HeadMovePlan, TheGroupSizeIsTheBest) {
  std::mt19937 rng(35);
  std::uniform_real_distribution<double> busy(0.1, 3.0), share(0.0, 1.0);
  layer_migration_options o;
  int planned = 0;
  for (int trial = 0; trial < 500; ++trial) {
    head_move_inputs in;
    const int n = 2 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i)
      in.stages.push_back({1 + static_cast<int32_t>(rng() % 12), busy(rng)});
    in.n_kv = 2 + static_cast<int32_t>(rng() % 7);
    in.steps = 1 + rng() % 200;
    in.attention_share = share(rng);
    in.trip_s = share(rng) * 0.001;
    const auto m = plan_head_move(in, o);
    if (!m) continue;
    ++planned;
    const auto& d = in.stages[m->from];
    const auto& h = in.stages[m->to];
    double slowest = 0, others = 0;
    for (int i = 0; i < n; ++i) {
      slowest = std::max(slowest, in.stages[i].busy_s);
      if (i != m->from && i != m->to) others = std::max(others, in.stages[i].busy_s);
    }
    EXPECT_EQ(d.busy_s, slowest);
    const double speed = (h.busy_s / h.layers) / (d.busy_s / d.layers);
    for (int g = 1; g < in.n_kv; ++g) {
      const double moved = in.attention_share * d.busy_s * g / in.n_kv;
      const double after = std::max(
          {others, d.busy_s - moved + in.trip_s * d.layers * in.steps, h.busy_s + moved * speed});
      EXPECT_LE((slowest - after) / slowest, m->gain + 1e-9) << "trial " << trial << ", g " << g;
    }
  }
  EXPECT_GT(planned, 20);
}

}  // namespace
}  // namespace troupe
