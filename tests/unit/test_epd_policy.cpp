// Hybrid EPD's plain functions (runtime/service/epd_policy) on synthetic
// inputs, and the EPD simulator that calls them (sim/epd_sim).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "runtime/service/epd_policy.hpp"
#include "sim/epd_sim.hpp"

using namespace troupe;

TEST(EpdPolicy, StrategiesParseAndNameTheirPools) {
  for (auto s : k_epd_strategies) EXPECT_EQ(parse_epd_strategy(to_string(s)), s);
  EXPECT_EQ(parse_epd_strategy("e-p-d"), epd_strategy::e_p_d);
  EXPECT_FALSE(parse_epd_strategy("P-E-D").has_value());
  EXPECT_FALSE(parse_epd_strategy("").has_value());
  // Every stage runs somewhere, exactly once.
  for (auto s : k_epd_strategies) {
    int e = 0, p = 0, d = 0;
    for (const auto& pool : epd_pools(s)) e += pool.encode, p += pool.prefill, d += pool.decode;
    EXPECT_EQ(e, 1) << to_string(s);
    EXPECT_EQ(p, 1) << to_string(s);
    EXPECT_EQ(d, 1) << to_string(s);
  }
  EXPECT_EQ(epd_pools(epd_strategy::e_p_d).size(), 3u);
  EXPECT_TRUE(epd_pools(epd_strategy::ed_p)[1].encode);
  EXPECT_TRUE(epd_pools(epd_strategy::ed_p)[1].decode);
}

// The real router's encode placement (troupe serve --epd): the pools that
// encode under each strategy, then the fewest images waiting, the least
// language work, ties in turn; outside the pool only when none of it serves.
TEST(EpdPolicy, EncodePlacementTakesTheStrategysPoolFewestImagesFirst) {
  EXPECT_TRUE(runs_encode(epd_strategy::ep_d, pd_pool::prefill));
  EXPECT_TRUE(runs_encode(epd_strategy::ep_d, pd_pool::decode_to_prefill));
  EXPECT_FALSE(runs_encode(epd_strategy::ep_d, pd_pool::decode));
  EXPECT_TRUE(runs_encode(epd_strategy::ed_p, pd_pool::decode));
  EXPECT_FALSE(runs_encode(epd_strategy::ed_p, pd_pool::prefill));
  EXPECT_TRUE(runs_encode(epd_strategy::e_p_d, pd_pool::encode));
  EXPECT_FALSE(runs_encode(epd_strategy::e_p_d, pd_pool::mixed));
  EXPECT_TRUE(runs_encode(epd_strategy::colocated, pd_pool::decode));
  EXPECT_TRUE(prefill_where_encoded(epd_strategy::ep_d));
  EXPECT_FALSE(prefill_where_encoded(epd_strategy::ed_p));
  EXPECT_FALSE(prefill_where_encoded(epd_strategy::e_p_d));

  std::vector<encode_load> loads = {{1, true, true, pd_pool::encode, 2, 0},
                                    {2, true, true, pd_pool::prefill, 0, 5},
                                    {3, true, true, pd_pool::decode, 0, 1},
                                    {4, true, true, pd_pool::encode, 1, 0},
                                    {5, true, true, pd_pool::decode, 0, 1}};
  size_t cursor = 0;
  // E-P-D: the E instance with fewer images waiting.
  auto c = place_encode(epd_strategy::e_p_d, loads, cursor);
  EXPECT_EQ(c.instance, 4u);
  EXPECT_NE(c.why.find("E pool"), std::string::npos) << c.why;
  // EP-D: the one prefill instance.
  EXPECT_EQ(place_encode(epd_strategy::ep_d, loads, cursor).instance, 2u);
  // ED-P: 3 and 5 tie (no images, the same work): in turn.
  cursor = 0;
  const auto first = place_encode(epd_strategy::ed_p, loads, cursor).instance;
  const auto second = place_encode(epd_strategy::ed_p, loads, cursor).instance;
  EXPECT_EQ(std::min(first, second), 3u);
  EXPECT_EQ(std::max(first, second), 5u);
  // EPD: every instance encodes; fewest images, then least language work.
  cursor = 0;
  EXPECT_EQ(place_encode(epd_strategy::colocated, loads, cursor).instance, 3u);
  // The E pool lost: any serving instance with an encoder, said so.
  loads[0].serving = false;
  loads[3].has_encoder = false;
  c = place_encode(epd_strategy::e_p_d, loads, cursor);
  EXPECT_NE(c.instance, 0u);
  EXPECT_NE(c.instance, 1u);
  EXPECT_NE(c.instance, 4u);
  EXPECT_NE(c.why.find("no instance of its encode pool"), std::string::npos) << c.why;
  for (auto& l : loads) l.has_encoder = false;
  EXPECT_EQ(place_encode(epd_strategy::e_p_d, loads, cursor).instance, 0u);
}

TEST(EpdPolicy, TheBatchRuleTakesDecodesThenChunksThenEncodesOnlyWithoutPrefill) {
  epd_limits lim;
  lim.max_decode_tokens = 8;
  lim.max_prefill_tokens = 100;
  lim.max_encode_batch = 3;
  epd_queue q;
  q.decodes = 5;
  q.partial_prefills = {30, 50};
  q.new_prefills = {40, 10};
  q.pending_encodes = 7;
  auto it = plan_epd_iteration(q, lim);
  EXPECT_EQ(it.decode_rows, 5);
  // Partial prefills first, whole while the budget lasts, then a new one
  // cut to what is left.
  EXPECT_EQ(it.partial_rows, (std::vector<int32_t>{30, 50}));
  EXPECT_EQ(it.new_rows, (std::vector<int32_t>{20}));
  EXPECT_EQ(it.prefill_rows(), 100);
  EXPECT_EQ(it.encodes, 0);  // prefill under way: no encodes
  // A budget spent on partial prefills begins no new one.
  q.partial_prefills = {150};
  it = plan_epd_iteration(q, lim);
  EXPECT_EQ(it.partial_rows, (std::vector<int32_t>{100}));
  EXPECT_TRUE(it.new_rows.empty());
  EXPECT_EQ(it.encodes, 0);
  // No prefill anywhere: encodes, up to the encoder batch, beside the decodes.
  q.partial_prefills.clear();
  q.new_prefills.clear();
  it = plan_epd_iteration(q, lim);
  EXPECT_EQ(it.prefill_rows(), 0);
  EXPECT_EQ(it.encodes, 3);
  EXPECT_EQ(it.decode_rows, 5);
  // The decode cap.
  q.decodes = 20;
  EXPECT_EQ(plan_epd_iteration(q, lim).decode_rows, 8);
  EXPECT_TRUE(plan_epd_iteration(epd_queue{}, lim).empty());
}

TEST(EpdPolicy, DualStreamHidesTheOverlappedShareOfTheShorterStream) {
  EXPECT_DOUBLE_EQ(combine_streams(10, 4, false, 0.5), 14);
  EXPECT_DOUBLE_EQ(combine_streams(10, 4, true, 0), 14);
  EXPECT_DOUBLE_EQ(combine_streams(10, 4, true, 0.5), 12);
  EXPECT_DOUBLE_EQ(combine_streams(4, 10, true, 1), 10);
  EXPECT_DOUBLE_EQ(combine_streams(4, 10, true, 7), 10);  // clamped to 1
  epd_costs c{[](int32_t rows, int32_t) { return 2.0 + rows; },
              [](int32_t images) { return 5.0 * images; }, 0.5};
  EXPECT_DOUBLE_EQ(epd_iteration_ms(c, 8, 8, 2, true), 10 + 0.5 * 10);
  EXPECT_DOUBLE_EQ(epd_iteration_ms(c, 0, 0, 2, true), 10);
  EXPECT_DOUBLE_EQ(epd_iteration_ms(c, 8, 8, 0, false), 10);
}

namespace {

// A linear synthetic engine: 2 ms a pass, 0.1 ms a prefill row, 0.5 ms a
// decode row, and an encoder at `encode` ms an image.
epd_costs synthetic(double encode, double overlap = 0) {
  return {[](int32_t rows, int32_t decodes) { return 2 + 0.1 * (rows - decodes) + 0.5 * decodes; },
          [encode](int32_t images) { return 1 + encode * images; }, overlap};
}

}  // namespace

TEST(EpdPolicy, TheProfilersLimitsAreTheLargestUnderTheTpotSlo) {
  const auto c = synthetic(20);
  const epd_workload w{1, 300, 20};
  const auto prof = profile_epd(c, w, 50, 8, true, epd_strategy::e_p_d);
  // E-P-D: decodes alone, so the whole 50 ms: 2 + 0.5 d <= 50 -> 96.
  EXPECT_EQ(prof.limits.max_decode_tokens, 96);
  // Prefill alone: 2 + 0.1 p <= 50 -> 480.
  EXPECT_EQ(prof.limits.max_prefill_tokens, 480);
  // Encoder batch alone: 1 + 20 b <= 50 -> 2.
  EXPECT_EQ(prof.limits.max_encode_batch, 2);
  ASSERT_EQ(prof.pools.size(), 3u);
  EXPECT_EQ(prof.pools[0] + prof.pools[1] + prof.pools[2], 8);
  // Decodes sharing iterations with encodes get half the budget.
  const auto ed = profile_epd(c, w, 50, 8, true, epd_strategy::ed_p);
  EXPECT_EQ(ed.limits.max_decode_tokens, 46);  // 2 + 0.5 d <= 25
  EXPECT_THROW(profile_epd(c, w, 50, 2, true, epd_strategy::e_p_d), std::invalid_argument);
}

TEST(EpdPolicy, TheProfilerPicksTheStrategyThatSustainsTheMost) {
  const epd_workload w{1, 300, 20};
  for (double encode : {0.5, 5.0, 40.0})
    for (double overlap : {0.0, 0.9}) {
      const auto c = synthetic(encode, overlap);
      const auto best = profile_epd(c, w, 50, 8, true);
      EXPECT_EQ(best.log.size(), 4u);
      for (auto s : k_epd_strategies) {
        const auto one = profile_epd(c, w, 50, 8, true, s);
        EXPECT_GE(best.rate, one.rate - 1e-9)
            << "encode " << encode << " overlap " << overlap << ": " << to_string(best.strategy)
            << " chosen over " << to_string(s);
      }
    }
  // Encodes of 400 ms beside decodes keep their mean iteration over a 50 ms
  // TPOT SLO: the strategies that put them there are named so and not
  // chosen.
  const auto heavy = profile_epd(synthetic(400), w, 50, 8, true);
  EXPECT_NE(heavy.strategy, epd_strategy::ed_p);
  EXPECT_NE(heavy.strategy, epd_strategy::colocated);
  ASSERT_EQ(heavy.log.size(), 4u);
  EXPECT_NE(heavy.log[1].find("exceeds the TPOT SLO"), std::string::npos) << heavy.log[1];
  EXPECT_NE(heavy.log[3].find("exceeds the TPOT SLO"), std::string::npos) << heavy.log[3];
  EXPECT_EQ(heavy.log[0].find("exceeds"), std::string::npos) << heavy.log[0];
}

// The profiler by trial climbs to the split and limits its trial measures
// best, and picks the strategy measured best, whatever the estimate said.
TEST(EpdPolicy, TheProfilerByTrialClimbsToTheMeasuredBest) {
  const auto c = synthetic(5);
  const epd_workload w{1, 300, 20};
  int trials = 0;
  // A made-up engine: E-P-D's goodput peaks at pools 2/5/3 and a prefill
  // chunk four times the analytic one; every other strategy measures 1.
  int32_t analytic_chunk =
      profile_epd(c, w, 50, 10, true, epd_strategy::e_p_d).limits.max_prefill_tokens;
  auto trial = [&](epd_strategy s, const epd_limits& lim, const std::vector<int32_t>& pools) {
    ++trials;
    if (s != epd_strategy::e_p_d) return 1.0;
    const double chunk_off =
        std::abs(std::log2(double(lim.max_prefill_tokens) / analytic_chunk) - 2);
    return 20.0 - std::abs(pools[0] - 2) - std::abs(pools[1] - 5) - std::abs(pools[2] - 3) -
           chunk_off;
  };
  const auto best = profile_epd_by_trial(c, w, 50, 10, true, trial);
  EXPECT_EQ(best.strategy, epd_strategy::e_p_d);
  EXPECT_EQ(best.pools, (std::vector<int32_t>{2, 5, 3}));
  EXPECT_EQ(best.limits.max_prefill_tokens, 4 * analytic_chunk);
  EXPECT_DOUBLE_EQ(best.rate, 20.0);
  EXPECT_EQ(best.log.size(), 4u);
  EXPECT_LT(trials, 400);
  // Forced: only that strategy is tried.
  const auto ep = profile_epd_by_trial(c, w, 50, 10, true, trial, epd_strategy::ep_d);
  EXPECT_EQ(ep.strategy, epd_strategy::ep_d);
  EXPECT_EQ(ep.log.size(), 1u);
  EXPECT_THROW(profile_epd_by_trial(c, w, 50, 2, true, trial, epd_strategy::e_p_d),
               std::invalid_argument);
}

TEST(EpdSim, AtLowLoadEveryRequestMeetsItsSlosAndRunsRepeatExactly) {
  epd_sim_config cfg;
  cfg.cost =
      cost_model::load(std::string(TROUPE_SOURCE_DIR) + "/bench/cost_models/stories15m.json");
  cfg.instances = 4;
  cfg.image_tokens = 64;
  const auto reqs = textcaps_like_workload(200, 0.5, 7);
  for (auto s : k_epd_strategies) {
    cfg.strategy = s;
    const auto a = simulate_epd(cfg, reqs);
    const auto b = simulate_epd(cfg, reqs);
    EXPECT_EQ(a.requests, 200u);
    EXPECT_EQ(a.completed, 200u) << to_string(s);
    EXPECT_DOUBLE_EQ(a.attainment, 1.0) << to_string(s);
    EXPECT_EQ(a.iterations, b.iterations);
    EXPECT_DOUBLE_EQ(a.simulated_s, b.simulated_s);
    EXPECT_GT(a.encode_batches, 0u);
  }
  // A profile that never begins a prefill finishes nothing: every request
  // misses (none counts as met).
  epd_profile stuck;
  stuck.strategy = epd_strategy::colocated;
  stuck.pools = {4};
  stuck.limits.max_prefill_tokens = 0;
  cfg.profile = stuck;
  const auto none = simulate_epd(cfg, reqs);
  EXPECT_EQ(none.completed, 0u);
  EXPECT_DOUBLE_EQ(none.attainment, 0.0);
  stuck.pools = {0};
  cfg.profile = stuck;
  EXPECT_THROW(simulate_epd(cfg, reqs), std::invalid_argument);
  cfg.profile.reset();
  cfg.image_tokens = 0;
  EXPECT_THROW(simulate_epd(cfg, reqs), std::invalid_argument);
}

// The report's ablation direction, at reduced scale: request-level
// iterations (every waiting encode and whole prompt at once, one stream)
// serve less at the SLO than the stage-level batch rule on the same pools.
TEST(EpdSim, StageLevelSchedulingServesMoreThanRequestLevelIterations) {
  epd_sim_config cfg;
  cfg.cost =
      cost_model::load(std::string(TROUPE_SOURCE_DIR) + "/bench/cost_models/stories15m.json");
  cfg.instances = 4;
  cfg.strategy = epd_strategy::colocated;
  const double stage = epd_goodput(cfg, 300, 36, 0.9);
  cfg.stage_scheduling = false;
  cfg.dual_stream = false;
  const double request = epd_goodput(cfg, 300, 36, 0.9);
  EXPECT_GT(stage, 1.1 * request) << stage << " vs " << request;
}
