// The cluster simulator (sim/cluster_sim.hpp) on cases worked out by
// hand, and the cost model's fit (sim/cost_model.hpp).
#include <gtest/gtest.h>

#include "sim/cluster_sim.hpp"

namespace troupe {
namespace {

// 10 ms a step whatever it holds; transfers 5 ms.
sim_config flat(int instances) {
  sim_config c;
  c.instances = instances;
  c.cost.c0 = 10;
  c.cost.c_prefill = c.cost.c_decode = c.cost.c_context = 0;
  c.cost.transfer_fixed_ms = 5;
  c.cost.transfer_mb_per_s = 1e9;
  c.cost.kv_bytes_per_token = 1000;
  c.cost.kv_pages = 64;
  c.cost.page_size = 16;
  c.limits = {256, 16, 128, 16};
  return c;
}

TEST(ClusterSim, OneRequestOnOneInstanceStepByStep) {
  auto r = simulate(flat(1), {{0.0, 32, 4, false}});
  ASSERT_EQ(r.records.size(), 1u);
  const auto& rec = r.records[0];
  ASSERT_TRUE(rec.success);
  EXPECT_EQ(rec.output_tokens, 4);
  EXPECT_NEAR(rec.ttft(), 0.010, 1e-9);  // one prefill step
  EXPECT_NEAR(rec.e2e(), 0.040, 1e-9);   // then three decode steps
  EXPECT_EQ(r.stats.steps, 4u);
}

TEST(ClusterSim, ChunkedPrefillAndBatchedDecode) {
  auto c = flat(1);
  c.limits.chunk_size = 16;
  c.limits.max_batch_tokens = 16;
  // 40 prompt tokens in chunks of 16: 3 steps to the first token.
  auto r = simulate(c, {{0.0, 40, 2, false}, {0.0, 8, 2, false}});
  EXPECT_NEAR(r.records[0].ttft(), 0.030, 1e-9);
  // The first takes all 16 rows of steps 1 and 2 and 8 of step 3; the
  // second gets the other 8 rows of step 3.
  EXPECT_NEAR(r.records[1].ttft(), 0.030, 1e-9);
}

TEST(ClusterSim, DisaggregationHandsTheKvToTheDecodeInstance) {
  auto c = flat(2);
  c.pd = true;
  c.roles = {instance_role::prefill, instance_role::decode};
  c.pd_placement = "least-load";
  auto r = simulate(c, {{0.0, 32, 3, false}});
  const auto& rec = r.records[0];
  EXPECT_NEAR(rec.ttft(), 0.010, 1e-9);
  // Transfer 5 ms (+ 32 kB at "infinite" bandwidth), then two decode steps.
  EXPECT_NEAR(rec.e2e(), 0.010 + 0.005 + 0.020, 1e-6);
  EXPECT_EQ(r.stats.transfers, 1u);
  EXPECT_DOUBLE_EQ(r.stats.transfer_bytes, 32 * 1000.0);
}

TEST(ClusterSim, RoundRobinAlternatesAndEveryRequestFinishes) {
  auto c = flat(2);
  c.mixed_policy = placement_policy::round_robin;
  std::vector<sim_request> reqs;
  for (int i = 0; i < 50; ++i) reqs.push_back({i * 0.001, 20 + i, 5, i % 3 == 0});
  auto r = simulate(c, reqs);
  for (const auto& rec : r.records) {
    EXPECT_TRUE(rec.success);
    EXPECT_EQ(rec.output_tokens, 5);
  }
}

TEST(ClusterSim, DynamicRoleSwitchingFlipsUnderPrefillPressure) {
  auto c = flat(4);
  c.cost.c_prefill = 0.5;  // long prompts are slow to prefill
  c.pd = true;
  c.pd_placement = "slo";
  c.role_switching = true;
  c.roles = {instance_role::prefill, instance_role::decode, instance_role::decode,
             instance_role::decode};
  c.targets = {300, 0};
  c.window_s = 0.5;
  c.pd_cfg.violation_windows = 1;
  c.pd_cfg.cooldown_s = 0.5;
  std::vector<sim_request> reqs;
  for (int i = 0; i < 200; ++i) reqs.push_back({i * 0.05, 400, 4, false});
  auto r = simulate(c, reqs);
  EXPECT_GE(r.stats.flips, 1u);
  ASSERT_FALSE(r.stats.flip_log.empty());
  EXPECT_NE(r.stats.flip_log[0].find("prefill"), std::string::npos) << r.stats.flip_log[0];
  for (const auto& rec : r.records) EXPECT_TRUE(rec.success);
}

// Issue 37: a load step on an autoscaled cluster.  One instance holds 16
// sequences; 200 requests of 400 tokens arrive within 10 s, then nothing:
// it starts instances up to the maximum, every request finishes, and it
// retires them back to the minimum once idle, holding fewer
// instance-seconds than a fixed fleet of the maximum would.
TEST(ClusterSim, AutoscalingGrowsUnderALoadStepAndShrinksAfter) {
  auto c = flat(1);
  c.autoscale = true;
  c.scale.min = 1;
  c.scale.max = 6;
  c.scale.grow_cooldown_s = 1;
  c.scale.shrink_cooldown_s = 2;
  c.start_s = 0.5;
  c.cost.kv_pages = 4096;
  std::vector<sim_request> reqs;
  for (int i = 0; i < 200; ++i) reqs.push_back({0.05 * i, 16, 400, false});
  // A late request keeps the simulation going while the pool shrinks.
  reqs.push_back({60.0, 16, 2, false});
  auto r = simulate(c, reqs);
  for (const auto& rec : r.records) EXPECT_TRUE(rec.success);
  EXPECT_EQ(r.stats.peak_instances, 6) << testing::PrintToString(r.stats.scale_log);
  EXPECT_EQ(r.stats.scale_ups, 5u);
  EXPECT_EQ(r.stats.scale_downs, 5u) << testing::PrintToString(r.stats.scale_log);
  EXPECT_LT(r.stats.instance_seconds, 6 * r.stats.simulated_s * 0.5)
      << testing::PrintToString(r.stats.scale_log);
  // The same without autoscaling on one instance takes far longer.
  auto fixed = simulate(flat(1), reqs);
  double end_auto = 0, end_fixed = 0;
  for (size_t i = 0; i + 1 < reqs.size(); ++i) {
    end_auto = std::max(end_auto, r.records[i].end_time);
    end_fixed = std::max(end_fixed, fixed.records[i].end_time);
  }
  EXPECT_LT(end_auto, end_fixed * 0.5);
}

TEST(CostModel, FitRecoversKnownCoefficients) {
  std::vector<step_sample> xs;
  for (int p = 0; p <= 256; p += 32)
    for (int d = 0; d <= 32; d += 4) {
      if (p + d == 0) continue;
      const int64_t ctx = int64_t(p) * p / 2 + int64_t(d) * 300;
      xs.push_back({p + d, d, ctx, 2.0 + 0.05 * p + 0.3 * d + 1e-5 * double(ctx)});
    }
  auto m = cost_model::fit(xs);
  EXPECT_NEAR(m.c0, 2.0, 1e-6);
  EXPECT_NEAR(m.c_prefill, 0.05, 1e-6);
  EXPECT_NEAR(m.c_decode, 0.3, 1e-6);
  EXPECT_NEAR(m.c_context, 1e-5, 1e-9);
  EXPECT_NEAR(m.fit_r2, 1.0, 1e-9);
  m.kv_pages = 10;
  auto back = cost_model::from_json(m.to_json());
  EXPECT_DOUBLE_EQ(back.c_decode, m.c_decode);
  EXPECT_THROW(cost_model::from_json(nlohmann::json::object()), std::runtime_error);
}

}  // namespace
}  // namespace troupe
