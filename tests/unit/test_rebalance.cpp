// Queued requests moved to instances with room (runtime/service/rebalance).
#include <gtest/gtest.h>

#include "runtime/service/rebalance.hpp"

namespace troupe {
namespace {

TEST(Rebalance, FullInstancesGiveTheirQueueToInstancesWithRoom) {
  // 1 and 2 are full with queues; 3 is new and empty; 4 has a queue but
  // room (its queue starts there); 5 drains.
  std::vector<rebalance_load> loads = {
      {1, true, 6, 8}, {2, true, 9, 8}, {3, true, 0, 0}, {4, true, 2, 5}, {5, false, 0, 0}};
  auto moves = plan_rebalance(loads, 8);
  ASSERT_EQ(moves.size(), 1u);  // 8 free slots on 3: the longest queue (2) gives 8
  EXPECT_EQ(moves[0].from, 2u);
  EXPECT_EQ(moves[0].count, 8);
  loads[2].running = 4;  // 4 free on 3, and 3 on a new instance 6
  loads.push_back({6, true, 0, 5});
  moves = plan_rebalance(loads, 8);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].from, 2u);
  EXPECT_EQ(moves[0].count, 7);
  loads[1].waiting = 3;  // 1's queue is the longest now: 6 from it, then 1 from 2
  moves = plan_rebalance(loads, 8);
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].from, 1u);
  EXPECT_EQ(moves[0].count, 6);
  EXPECT_EQ(moves[1].from, 2u);
  EXPECT_EQ(moves[1].count, 1);
}

TEST(Rebalance, NothingMovesWithoutRoom) {
  EXPECT_TRUE(plan_rebalance({{1, true, 4, 8}, {2, true, 1, 8}}, 8).empty());
  EXPECT_TRUE(plan_rebalance({{1, true, 4, 8}, {2, true, 0, 8}}, 8).empty());
  EXPECT_TRUE(plan_rebalance({{1, true, 4, 8}, {2, false, 0, 0}}, 8).empty());
  EXPECT_TRUE(plan_rebalance({{1, true, 4, 8}, {2, true, 0, 0}}, 0).empty());
  EXPECT_TRUE(plan_rebalance({}, 8).empty());
}

}  // namespace
}  // namespace troupe
