// The autoscaling policy (runtime/service/autoscale, issue 37 item 5) on
// synthetic loads: grows in one step to what the demand needs, counts
// starting instances as capacity, retires one at a time with hysteresis,
// keeps its bounds.
#include <gtest/gtest.h>

#include "runtime/service/autoscale.hpp"

namespace troupe {
namespace {

std::vector<scaled_instance> fleet(std::vector<int32_t> held, int32_t max_seqs = 8) {
  std::vector<scaled_instance> out;
  for (size_t i = 0; i < held.size(); ++i) {
    scaled_instance s;
    s.id = i + 1;
    s.running = std::min(held[i], max_seqs);
    s.waiting = held[i] - s.running;
    s.max_seqs = max_seqs;
    out.push_back(s);
  }
  return out;
}

autoscale_config bounds(int32_t lo, int32_t hi) {
  autoscale_config c;
  c.min = lo;
  c.max = hi;
  return c;
}

TEST(Autoscale, GrowsToWhatTheDemandNeedsWithinTheMaximum) {
  autoscale_memory mem;
  // 2 instances of 8 holding 40 sequences: 40 / (0.8 * 8) = 6.25 -> 7.
  auto d = decide_autoscale(bounds(1, 16), fleet({20, 20}), 0, 100, mem);
  EXPECT_EQ(d.grow, 5);
  EXPECT_EQ(d.retire, 0u);
  EXPECT_NE(d.why.find("2 -> 7"), std::string::npos) << d.why;
  // Capped by max.
  mem = {};
  d = decide_autoscale(bounds(1, 4), fleet({20, 20}), 0, 100, mem);
  EXPECT_EQ(d.grow, 2);
  // Within the cooldown: nothing more.
  d = decide_autoscale(bounds(1, 16), fleet({20, 20}), 0, 102, mem);
  EXPECT_EQ(d.grow, 0);
  // Starting instances count as capacity: no second surge start.
  auto f = fleet({20, 20, 0, 0, 0, 0, 0});
  for (size_t i = 2; i < f.size(); ++i) f[i].starting = true;
  d = decide_autoscale(bounds(1, 16), f, 0, 200, mem);
  EXPECT_EQ(d.grow, 0) << d.why;
}

TEST(Autoscale, ATtftOverTargetGrowsByOne) {
  autoscale_memory mem;
  auto f = fleet({2, 2});
  f[0].ttft_ms = 900;
  auto d = decide_autoscale(bounds(1, 8), f, 500, 10, mem);
  EXPECT_EQ(d.grow, 1);
  EXPECT_NE(d.why.find("TTFT over target"), std::string::npos);
  // Without a target, the same load changes nothing (at the minimum).
  mem = {};
  d = decide_autoscale(bounds(2, 8), f, 0, 10, mem);
  EXPECT_EQ(d.grow, 0);
  EXPECT_EQ(d.retire, 0u);
}

TEST(Autoscale, RetiresOneIdleInstanceAtATimeWithHysteresis) {
  autoscale_config c = bounds(2, 8);
  autoscale_memory mem;
  mem.last_grow_s = 0;
  // Light load, but within the cooldown after a start: nothing.
  auto d = decide_autoscale(c, fleet({1, 0, 3, 0}), 0, 10, mem);
  EXPECT_EQ(d.retire, 0u);
  // After it: the least-loaded goes (instance 2, holding nothing).
  d = decide_autoscale(c, fleet({1, 0, 3, 0}), 0, 40, mem);
  EXPECT_EQ(d.retire, 2u);
  // One per cooldown.
  d = decide_autoscale(c, fleet({1, 3, 0}), 0, 50, mem);
  EXPECT_EQ(d.retire, 0u);
  // Never below the minimum.
  d = decide_autoscale(c, fleet({0, 0}), 0, 500, mem);
  EXPECT_EQ(d.retire, 0u);
  // Not when the rest would be over grow_load: 14 of 24 is light (below a
  // shrink_load of 0.6), but 14 of the 16 left would be 0.875.
  mem = {};
  c.shrink_load = 0.6;
  d = decide_autoscale(c, fleet({7, 7, 0}), 0, 500, mem);
  EXPECT_EQ(d.retire, 0u) << d.why;
  d = decide_autoscale(c, fleet({6, 6, 0}), 0, 500, mem);  // 12 of 16: 0.75
  EXPECT_EQ(d.retire, 3u) << d.why;
}

TEST(Autoscale, BelowTheMinimumGrowsBackAtOnce) {
  autoscale_memory mem;
  mem.last_grow_s = 99;  // even within the cooldown
  auto d = decide_autoscale(bounds(3, 8), fleet({0}), 0, 100, mem);
  EXPECT_EQ(d.grow, 2);
}

TEST(Autoscale, BoundsParse) {
  autoscale_config c;
  parse_autoscale_bounds("2:16", c);
  EXPECT_EQ(c.min, 2);
  EXPECT_EQ(c.max, 16);
  for (const char* bad : {"", "2", "2:", ":3", "0:4", "5:4", "a:b", "-1:3", "2:99999", "2:3:4"})
    EXPECT_THROW(parse_autoscale_bounds(bad, c), std::invalid_argument) << bad;
}

}  // namespace
}  // namespace troupe
