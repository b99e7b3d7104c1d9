// The pipeline's one window rule (runtime/device/stage_rebalance, issue
// 35): a group away comes home or stays, else a layer move, else a head
// move; the live pipeline and the simulator both take it.
#include <gtest/gtest.h>

#include "runtime/device/stage_rebalance.hpp"

namespace troupe {
namespace {

stage_rebalance_inputs two_stages(double busy0, double busy1) {
  stage_rebalance_inputs in;
  in.load.stages = {{15, busy0}, {15, busy1}};
  in.load.n_kv = 3;
  in.load.attention_share = 0.4;
  in.load.steps = 100;
  in.load.trip_s = 0.0001;
  return in;
}

TEST(StageRebalance, ALayerMoveComesFirstAndAHeadMoveWhereLayersAreOff) {
  layer_migration_options o;
  o.move_cost_s = 0.01;
  o.head_move_cost_s = 0.01;
  auto in = two_stages(1, 2);
  const auto m = plan_stage_rebalance(in, o);
  ASSERT_TRUE(m.layers);
  EXPECT_EQ(m.layers->from, 1);
  EXPECT_FALSE(m.heads);
  in.layers = false;
  const auto h = plan_stage_rebalance(in, o);
  EXPECT_FALSE(h.layers);
  ASSERT_TRUE(h.heads);
  EXPECT_EQ(h.heads->from, 1);
  EXPECT_EQ(h.heads->to, 0);
  EXPECT_GE(h.heads->heads, 1);
  EXPECT_LE(h.heads->heads, 2);
  in.heads = false;
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());
  // Balanced within the threshold, or the threshold 0: nothing.
  in = two_stages(1, 1.05);
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());
  in = two_stages(1, 2);
  o.threshold = 0;
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());
  // Within the cooldown of the last move, nothing moves.
  o.threshold = 0.1;
  in.windows_since_move = o.cooldown_windows - 1;
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());
  in.windows_since_move = o.cooldown_windows;
  EXPECT_TRUE(plan_stage_rebalance(in, o).layers);
}

TEST(StageRebalance, AGroupAwayComesHomeWhenItsHelperIsBusierOrHomePays) {
  layer_migration_options o;
  auto in = two_stages(1, 3);  // stage 1 far busier: a layer move would pay
  in.away = head_group_away{1, 0, 1};
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());  // nothing moves while a group is away
  in = two_stages(1.5, 1);                          // the helper is now the busier
  in.away = head_group_away{1, 0, 1};
  const auto m = plan_stage_rebalance(in, o);
  EXPECT_TRUE(m.heads_home);
  EXPECT_FALSE(m.layers);
  EXPECT_FALSE(m.heads);
  in = two_stages(1.05, 1);  // within the threshold, and no trips to save: it stays
  in.away = head_group_away{1, 0, 1};
  in.load.trip_s = 0;
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());
  // The donor busier, but mostly with round trips (short contexts: little
  // attention to shed): home pays.
  in = two_stages(1, 1.2);
  in.away = head_group_away{1, 0, 1};
  in.load.attention_share = 0.05;
  in.load.trip_s = 0.0002;
  in.load.steps = 2000;  // 15 layers x 2000 passes x 0.2 ms: 6 s of waits
  in.load.stages[1].busy_s = 7;
  EXPECT_TRUE(plan_stage_rebalance(in, o).heads_home);
  // Long contexts: the trips are small beside the attention it sheds.
  in.load.steps = 20;
  in.load.attention_share = 0.6;
  in.load.stages[1].busy_s = 1.2;
  EXPECT_FALSE(plan_stage_rebalance(in, o).any());
}

}  // namespace
}  // namespace troupe
