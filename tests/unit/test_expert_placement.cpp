// The expert placement policy (runtime/device/expert_placement): balance figures,
// plans that replicate hot experts into spare slots and spread the load,
// and the decision to move.
#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/device/expert_placement.hpp"

namespace troupe {
namespace {

TEST(ExpertPlacement, BalanceSplitsReplicatedExpertsEvenly) {
  const expert_layout layout{{0, 1}, {2, 3, 0}};
  const auto b = balance_of(layout, {100, 10, 20, 30});
  ASSERT_EQ(b.device_load.size(), 2u);
  EXPECT_DOUBLE_EQ(b.device_load[0], 50 + 10);
  EXPECT_DOUBLE_EQ(b.device_load[1], 20 + 30 + 50);
  EXPECT_DOUBLE_EQ(b.max_over_mean, 100.0 / 80.0);
  EXPECT_DOUBLE_EQ(balance_of(layout, {0, 0, 0, 0}).max_over_mean, 1.0);
}

TEST(ExpertPlacement, PlanReplicatesHotExpertsAndEvensTheDevices) {
  // Experts 0 and 1 take most tokens (the skewed fixture's shape).
  const std::vector<int64_t> tokens{400, 300, 20, 20, 20, 20, 10, 10};
  const auto initial = initial_expert_layout(8, 2);
  EXPECT_EQ(initial, (expert_layout{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  const double before = balance_of(initial, tokens).max_over_mean;
  EXPECT_GT(before, 1.7);
  const auto plan = plan_expert_layout(tokens, 2, 5);
  // Every expert somewhere, no device over its slots, no expert twice on one device.
  std::vector<int> seen(8, 0);
  for (const auto& held : plan) {
    EXPECT_LE(held.size(), 5u);
    EXPECT_FALSE(held.empty());
    for (size_t i = 0; i < held.size(); ++i) {
      ++seen[held[i]];
      EXPECT_EQ(std::count(held.begin(), held.end(), held[i]), 1);
    }
  }
  for (int e = 0; e < 8; ++e) EXPECT_GE(seen[e], 1) << "expert " << e;
  EXPECT_EQ(seen[0], 2);  // the two hottest fill the spare slots
  EXPECT_EQ(seen[1], 2);
  const double after = balance_of(plan, tokens).max_over_mean;
  EXPECT_LT(after, 1.05);
  EXPECT_TRUE(worth_rebalancing(initial, plan, tokens, 1.2));
  EXPECT_FALSE(worth_rebalancing(plan, plan, tokens, 1.2));
  EXPECT_FALSE(worth_rebalancing(initial, plan, tokens, 2.0));  // under the threshold
  EXPECT_FALSE(worth_rebalancing(initial, plan, {1, 1, 0, 0, 0, 0, 0, 0}, 1.2));  // too few
}

TEST(ExpertPlacement, PlanIsDeterministicAndRefusesTooFewSlots) {
  const std::vector<int64_t> tokens{5, 5, 5, 5};
  EXPECT_EQ(plan_expert_layout(tokens, 2, 3), plan_expert_layout(tokens, 2, 3));
  EXPECT_THROW(plan_expert_layout(tokens, 1, 3), std::invalid_argument);
  // Idle experts: the spare slots stay empty, no device is left without one.
  const auto idle = plan_expert_layout({0, 0, 0, 0}, 2, 3);
  EXPECT_EQ(idle[0].size() + idle[1].size(), 4u);
  EXPECT_FALSE(idle[0].empty());
  EXPECT_FALSE(idle[1].empty());
}

}  // namespace
}  // namespace troupe
