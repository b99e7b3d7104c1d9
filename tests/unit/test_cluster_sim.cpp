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

sim_request req(double at, int32_t prompt, int32_t output, bool offline = false) {
  sim_request r;
  r.arrival = at;
  r.prompt = prompt;
  r.output = output;
  r.offline = offline;
  return r;
}

TEST(ClusterSim, OneRequestOnOneInstanceStepByStep) {
  auto r = simulate(flat(1), {req(0.0, 32, 4)});
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
  auto r = simulate(c, {req(0.0, 40, 2), req(0.0, 8, 2)});
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
  auto r = simulate(c, {req(0.0, 32, 3)});
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
  for (int i = 0; i < 50; ++i) reqs.push_back(req(i * 0.001, 20 + i, 5, i % 3 == 0));
  auto r = simulate(c, reqs);
  for (const auto& rec : r.records) {
    EXPECT_TRUE(rec.success);
    EXPECT_EQ(rec.output_tokens, 5);
  }
}

// The router as blind as the real one (issue 36): loads from a snapshot up
// to router_staleness_s old, with its own placements counted at once (as
// actors/router.cpp does), so a burst within one snapshot still spreads.
TEST(ClusterSim, AStaleRouterCountsItsOwnPlacements) {
  auto run = [](double staleness_s) {
    auto c = flat(2);
    c.limits.max_batch_tokens = 128;
    c.router_staleness_s = staleness_s;
    std::vector<sim_request> reqs;
    for (int i = 0; i < 4; ++i) reqs.push_back(req(i * 0.001, 128, 2));
    return simulate(c, reqs);
  };
  auto last_ttft = [](const sim_result& r) {
    double last = 0;
    for (const auto& rec : r.records) {
      EXPECT_TRUE(rec.success);
      last = std::max(last, rec.ttft());
    }
    return last;
  };
  const auto exact = run(0), stale = run(0.1), fresh = run(0.0005);
  // Two prompts an instance either way (the second's prompt takes a step
  // and a row beside the first's decode row).
  EXPECT_NEAR(last_ttft(exact), 0.028, 1e-9);
  EXPECT_DOUBLE_EQ(last_ttft(stale), last_ttft(exact));
  EXPECT_EQ(exact.stats.router_snapshots, 0u);
  EXPECT_EQ(stale.stats.router_snapshots, 1u);  // the burst fits one snapshot
  EXPECT_EQ(fresh.stats.router_snapshots, 4u);  // one per arrival, 1 ms apart
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
  for (int i = 0; i < 200; ++i) reqs.push_back(req(i * 0.05, 400, 4));
  auto r = simulate(c, reqs);
  EXPECT_GE(r.stats.flips, 1u);
  ASSERT_FALSE(r.stats.flip_log.empty());
  EXPECT_NE(r.stats.flip_log[0].find("prefill"), std::string::npos) << r.stats.flip_log[0];
  for (const auto& rec : r.records) EXPECT_TRUE(rec.success);
}

// D->P preemption by migration (issue 36): long decodes on two D
// instances, then a prompt burst the P instance cannot meet the TTFT
// target for.  The report's straight flip turns a D instance to prefill;
// with migration its decoding sequences move to the other D at once
// (their KV through the transfer queue) and it prefills at full speed;
// without, it prefills beside them until they finish.  Every request
// gets all its tokens either way.
TEST(ClusterSim, AFlipOffDecodeMigratesItsDecodingSequences) {
  auto run = [](bool migrate) {
    auto c = flat(3);
    c.cost.c_prefill = 0.5;  // a 400-token prompt: 210 ms
    c.cost.c_decode = 2;     // decode rows slow the steps they share
    c.cost.kv_pages = 1024;
    c.pd = true;
    c.pd_placement = "slo";
    c.role_switching = true;
    c.roles = {instance_role::prefill, instance_role::decode, instance_role::decode};
    c.targets = {300, 0};
    c.window_s = 0.5;
    c.pd_cfg.violation_windows = 1;
    c.pd_cfg.cooldown_s = 100;  // one flip each, no flapping back
    c.pd_cfg.via_mixed = false;
    c.pd_cfg.max_flips = 1;
    c.pd_cfg.preempt_migrate = migrate;
    std::vector<sim_request> reqs;
    for (int i = 0; i < 12; ++i) reqs.push_back(req(i * 0.01, 32, 600));
    for (int i = 0; i < 60; ++i) reqs.push_back(req(1.0 + i * 0.05, 400, 4));
    return simulate(c, reqs);
  };
  const auto with = run(true), without = run(false);
  for (const auto* r : {&with, &without}) {
    ASSERT_GE(r->stats.flips, 1u);
    EXPECT_NE(r->stats.flip_log[0].find("-> prefill (pool D->P)"), std::string::npos)
        << r->stats.flip_log[0];
    for (const auto& rec : r->records) {
      EXPECT_TRUE(rec.success);
      EXPECT_EQ(rec.output_tokens, rec.output_tokens > 4 ? 600 : 4);
    }
  }
  EXPECT_EQ(without.stats.evacuated, 0u);
  // The flipped instance held about half of the 12 long decodes.
  EXPECT_GE(with.stats.evacuated, 4u);
  EXPECT_LE(with.stats.evacuated, 8u);
  EXPECT_NE(with.stats.flip_log[0].find("decoding sequences migrate"), std::string::npos)
      << with.stats.flip_log[0];
  EXPECT_EQ(with.stats.transfers, without.stats.transfers + with.stats.evacuated);
  // The burst's first tokens come sooner with the flipped instance free.
  auto mean_burst_ttft = [](const sim_result& r) {
    double sum = 0;
    int n = 0;
    for (const auto& rec : r.records)
      if (rec.output_tokens == 4) {
        sum += rec.ttft();
        ++n;
      }
    return sum / std::max(1, n);
  };
  EXPECT_LT(mean_burst_ttft(with), mean_burst_ttft(without));
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
  for (int i = 0; i < 200; ++i) reqs.push_back(req(0.05 * i, 16, 400));
  // A late request keeps the simulation going while the pool shrinks.
  reqs.push_back(req(60.0, 16, 2));
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

// Prefix caching and the KV store (issue 39): token ids for a prompt of n
// tokens, distinct per `seed`.
std::vector<int32_t> prompt_ids(int n, int seed) {
  std::vector<int32_t> t;
  for (int k = 0; k < n; ++k) t.push_back(1000 * seed + k);
  return t;
}

sim_request with_ids(double at, const std::vector<int32_t>& ids, int output) {
  auto r = req(at, int32_t(ids.size()), output);
  r.tokens = ids;
  return r;
}

TEST(ClusterSim, PrefixCachingSkipsASharedPromptsCachedPages) {
  auto c = flat(1);
  c.cost.c_prefill = 1;  // 1 ms a prompt row
  const auto a = prompt_ids(64, 1);
  const std::vector<sim_request> reqs = {with_ids(0, a, 2), with_ids(1, a, 2)};
  auto r = simulate(c, reqs);
  // The second maps 3 of its 4 pages (never the page of its last token).
  EXPECT_EQ(r.records[0].cached_tokens, 0);
  EXPECT_EQ(r.records[1].cached_tokens, 48);
  EXPECT_NEAR(r.records[0].ttft(), 0.010 + 0.064, 1e-9);
  EXPECT_NEAR(r.records[1].ttft(), 0.010 + 0.016, 1e-9);
  EXPECT_EQ(r.stats.prompt_tokens, 128u);
  EXPECT_EQ(r.stats.device_hit_tokens, 48u);
  EXPECT_EQ(r.stats.kv_check, "");
  c.prefix_caching = false;
  auto off = simulate(c, reqs);
  EXPECT_EQ(off.records[1].cached_tokens, -1);
  EXPECT_NEAR(off.records[1].ttft(), 0.010 + 0.064, 1e-9);
}

// The router's prefix policy on the simulated arenas: a prompt goes where
// its pages are.
TEST(ClusterSim, ThePrefixPolicyPlacesAPromptWhereItsPagesAre) {
  auto c = flat(2);
  c.cost.c_prefill = 1;
  const auto a = prompt_ids(64, 1), b = prompt_ids(64, 2);
  // A and B at once: B finds the first instance busy and goes to the
  // second.  Then B and A again, one at a time.
  const std::vector<sim_request> reqs = {with_ids(0, a, 2), with_ids(0, b, 2), with_ids(2, b, 2),
                                         with_ids(3, a, 2)};
  c.mixed_policy = placement_policy::prefix;
  auto r = simulate(c, reqs);
  EXPECT_EQ(r.records[2].cached_tokens, 48);
  EXPECT_EQ(r.records[3].cached_tokens, 48);
  // Least load sends both to the first (idle, lowest id): B misses.
  c.mixed_policy = placement_policy::least_load;
  auto ll = simulate(c, reqs);
  EXPECT_EQ(ll.records[2].cached_tokens, 0);
  EXPECT_EQ(ll.records[3].cached_tokens, 48);
}

// An arena of 8 pages: A (4 full pages) finishes, B (8 pages) evicts all
// of A's, then A's prompt comes again.
std::vector<sim_request> evicting_workload(const std::vector<int32_t>& a) {
  return {with_ids(0, a, 2), with_ids(1, prompt_ids(120, 2), 2), with_ids(2, a, 2)};
}

TEST(ClusterSim, EvictedPrefixPagesComeBackFromTheHostAndDiskTiers) {
  auto c = flat(1);
  c.cost.kv_pages = 8;
  c.cost.c_prefill = 1;
  const auto a = prompt_ids(64, 1);
  auto none = simulate(c, evicting_workload(a));
  EXPECT_EQ(none.records[2].cached_tokens, 0);  // B took every page
  c.kv_host_bytes = 64ull << 20;
  auto host = simulate(c, evicting_workload(a));
  EXPECT_EQ(host.records[2].cached_tokens, 48);
  EXPECT_EQ(host.stats.host_hit_tokens, 48u);
  EXPECT_GE(host.stats.spilled_pages, 4u);
  EXPECT_EQ(host.stats.kv_check, "");
  // Loading 3 pages (0.2 ms + 48 kB at the host rate) beats computing 48 rows.
  EXPECT_LT(host.records[2].ttft(), none.records[2].ttft() - 0.040);
  // A host tier of one page: the rest went on to the disk tier.
  c.kv_host_bytes = uint64_t(c.cost.kv_bytes_per_page() + 16 * 4);
  c.kv_disk_bytes = 64ull << 20;
  auto disk = simulate(c, evicting_workload(a));
  EXPECT_EQ(disk.records[2].cached_tokens, 48);
  EXPECT_GT(disk.stats.disk_hit_tokens, 0u);
  EXPECT_EQ(disk.stats.kv_check, "");
}

TEST(ClusterSim, APromptPullsItsPagesFromAnotherInstancesStore) {
  auto c = flat(2);
  c.cost.kv_pages = 8;
  c.cost.c_prefill = 1;
  c.mixed_policy = placement_policy::round_robin;
  c.kv_host_bytes = 64ull << 20;
  const auto a = prompt_ids(64, 1);
  // Round robin: A and B on the first instance (B evicts A's pages into its
  // store), a small one on the second, then A's prompt on the second.
  const std::vector<sim_request> reqs = {with_ids(0, a, 2), with_ids(0.5, prompt_ids(8, 3), 2),
                                         with_ids(1, prompt_ids(120, 2), 2), with_ids(2, a, 2)};
  auto alone = simulate(c, reqs);
  EXPECT_EQ(alone.records[3].cached_tokens, 0);
  c.kv_pull = true;
  auto pulled = simulate(c, reqs);
  EXPECT_EQ(pulled.records[3].cached_tokens, 48);
  EXPECT_EQ(pulled.stats.pulled_tokens, 48u);
  EXPECT_LT(pulled.records[3].ttft(), alone.records[3].ttft() - 0.040);
  EXPECT_EQ(pulled.stats.kv_check, "");
}

// Many sequences at once sharing prefixes in a small arena, with a small
// store: preemption (the plan counts shared pages by table), spills and
// loads churn; every request finishes and the page accounting holds.
TEST(ClusterSim, SharedPrefixesUnderPressureKeepThePageAccountingClean) {
  auto c = flat(2);
  c.cost.kv_pages = 40;
  c.cost.c_prefill = 0.2;
  c.limits.max_seqs = 12;
  c.mixed_policy = placement_policy::prefix;
  c.kv_host_bytes = 24 * uint64_t(c.cost.kv_bytes_per_page() + 16 * 4);
  c.kv_disk_bytes = 2 * c.kv_host_bytes;
  c.kv_pull = true;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 120; ++i) {
    auto p = prompt_ids(96, 100 + i % 4);  // four shared prefixes
    for (int k = 0; k < 16 + i % 7; ++k) p.push_back(50000 + 37 * i + k);
    prompts.push_back(std::move(p));
  }
  std::vector<sim_request> reqs;
  for (int i = 0; i < 120; ++i) reqs.push_back(with_ids(0.004 * i, prompts[size_t(i)], 8 + i % 5));
  auto r = simulate(c, reqs);
  for (const auto& rec : r.records) EXPECT_TRUE(rec.success);
  EXPECT_EQ(r.stats.kv_check, "");
  EXPECT_GT(r.stats.preemptions, 0u);
  EXPECT_GT(r.stats.device_hit_tokens, 0u);
  EXPECT_GT(r.stats.spilled_pages, 0u);
  // Where the cached tokens came from adds up to what was cached.
  uint64_t cached = 0;
  for (const auto& rec : r.records) cached += uint64_t(std::max(0, rec.cached_tokens));
  EXPECT_EQ(r.stats.device_hit_tokens + r.stats.host_hit_tokens + r.stats.disk_hit_tokens +
                r.stats.pulled_tokens,
            cached);
  // Disaggregated: parked prefills hold shared pages the plan does not
  // see; the step makes room as the engine does.
  c.pd = true;
  c.pd_placement = "least-load";
  c.roles = {instance_role::prefill, instance_role::decode};
  auto pd = simulate(c, reqs);
  EXPECT_EQ(pd.stats.kv_check, "");
  EXPECT_GT(pd.stats.transfers, 0u);
  size_t ok = 0;
  for (const auto& rec : pd.records) ok += rec.success;
  EXPECT_GT(ok, reqs.size() * 9 / 10);
}

TEST(ClusterSim, RefusesTwoTurnsAfterTheSameRequest) {
  std::vector<sim_request> reqs = {req(0, 16, 2), req(0, 16, 2), req(0, 16, 2)};
  reqs[1].after = 0;
  reqs[2].after = 0;
  EXPECT_THROW(simulate(flat(1), reqs), std::invalid_argument);
  reqs[2].after = 1;
  EXPECT_EQ(simulate(flat(1), reqs).records.size(), 3u);
}

TEST(ClusterSim, ALaterTurnFollowsItsPreviousOneAndFindsItsHistoryCached) {
  auto c = flat(1);
  c.cost.c_prefill = 1;
  auto first = prompt_ids(40, 1);
  auto second = first;
  for (int k = 0; k < 30; ++k) second.push_back(5000 + k);
  std::vector<sim_request> reqs = {with_ids(0, first, 3), with_ids(0, second, 3)};
  reqs[1].after = 0;
  reqs[1].think_s = 2;
  reqs[1].turn = 1;
  auto r = simulate(c, reqs);
  ASSERT_TRUE(r.records[1].success);
  // It left 2 s after the first turn ended, and found the first turn's two
  // full pages cached.
  EXPECT_NEAR(r.records[1].send_time, r.records[0].end_time + 2, 1e-9);
  EXPECT_EQ(r.records[1].turn, 1);
  EXPECT_EQ(r.records[1].cached_tokens, 32);
  c.prefix_caching = false;
  auto off = simulate(c, reqs);
  EXPECT_GT(off.records[1].ttft(), r.records[1].ttft() + 0.030);
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

// A lone decode row has its own cost (the engine's one-token kernels), and
// results read right behind the one before (a few hundredths of a ms under
// step overlap) are left out rather than fitted: weighted by their
// relative error they used to drag c0 to zero.
TEST(CostModel, FitPricesALoneDecodeRowAndLeavesOutResultsReadBehindAnother) {
  auto linear = [](int p, int d, int64_t ctx) {
    return 2.0 + 0.2 * p + 1.0 * d + 1e-4 * double(ctx);
  };
  std::vector<step_sample> xs;
  for (int p = 0; p <= 256; p += 32)
    for (int d = 0; d <= 32; d += 4) {
      if (p + d == 0) continue;
      const int64_t ctx = int64_t(p) * p / 2 + int64_t(d) * 300;
      xs.push_back({p + d, d, ctx, linear(p, d, ctx)});
    }
  for (int64_t ctx = 50; ctx <= 250; ctx += 50)
    for (int rep = 0; rep < 20; ++rep) xs.push_back({1, 1, ctx, 3.5 + 1e-4 * double(ctx)});
  for (int rep = 0; rep < 30; ++rep) xs.push_back({2 + rep % 3, 2 + rep % 3, 600, 0.05});
  auto m = cost_model::fit(xs);
  EXPECT_EQ(m.dropped, 30u);
  EXPECT_NEAR(m.c0, 2.0, 1e-6);
  EXPECT_NEAR(m.c_prefill, 0.2, 1e-6);
  EXPECT_NEAR(m.c_decode, 1.0, 1e-6);
  EXPECT_NEAR(m.c_one, 3.5, 1e-6);
  EXPECT_NEAR(m.step_ms(1, 1, 100), 3.51, 1e-6);
  EXPECT_NEAR(m.step_ms(2, 2, 100), 4.01, 1e-6);
  EXPECT_NEAR(m.step_ms(1, 0, 1), linear(1, 0, 1), 1e-6);  // one prefill row: the linear model
  m.kv_pages = 10;
  EXPECT_DOUBLE_EQ(cost_model::from_json(m.to_json()).c_one, m.c_one);
  // A file from before the term prices a lone row by the linear model.
  auto j = m.to_json();
  j["step_ms"].erase("c_one");
  EXPECT_NEAR(cost_model::from_json(j).step_ms(1, 1, 100), 2.0 + 1.0 + 0.01, 1e-6);
  j["step_ms"]["c_one"] = -1;
  EXPECT_THROW(cost_model::from_json(j), std::runtime_error);
  j["step_ms"]["c_one"] = "fast";
  EXPECT_THROW(cost_model::from_json(j), std::runtime_error);
}

// With no decode step of more than one row, nothing but the lone rows can
// teach c_decode: they are priced by the linear model then, not apart
// (else every decode batch would cost c0 alone).
TEST(CostModel, WithoutDecodeBatchesALoneRowTeachesTheLinearModel) {
  std::vector<step_sample> xs;
  for (int p = 16; p <= 256; p += 16) xs.push_back({p, 0, int64_t(p) * p / 2, 2.0 + 0.2 * p});
  for (int rep = 0; rep < 20; ++rep) xs.push_back({1, 1, 0, 3.0});
  auto m = cost_model::fit(xs);
  EXPECT_EQ(m.c_one, 0.0);
  EXPECT_NEAR(m.c0, 2.0, 1e-6);
  EXPECT_NEAR(m.c_decode, 1.0, 1e-6);
  EXPECT_NEAR(m.step_ms(4, 4, 0), 6.0, 1e-6);
  EXPECT_EQ(m.dropped, 0u);
}

}  // namespace
}  // namespace troupe
