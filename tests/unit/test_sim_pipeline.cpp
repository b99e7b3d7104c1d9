// Pipelined instances in the simulator (sim/sim_pipeline, issue 35): the
// step cost of a pipeline of micro-batches, the skewed, shifting load, and
// layer migration by the pipeline's own rule; then whole simulations of
// pipelined instances with migration on and off.
#include <gtest/gtest.h>

#include <set>

#include "runtime/device/head_migration.hpp"
#include "sim/cluster_sim.hpp"
#include "sim/sim_pipeline.hpp"

namespace troupe {
namespace {

TEST(SimPipeline, AStepCostsTheStagesSharesThroughMicroBatches) {
  sim_pipeline_config c;
  c.stages = 2;
  c.layers = 30;
  c.classifier_layers = 0;
  auto p = make_sim_pipeline(c);
  EXPECT_EQ(p.layers, (std::vector<int32_t>{15, 15}));
  // Two equal stages of 50 ms, two micro-batches: 50 / 2 + 50 / 2 + 50 / 2.
  EXPECT_NEAR(pipeline_step_ms(p, c, 0, 100, 0), 75, 1e-9);
  EXPECT_NEAR(p.busy_s[0], 0.05, 1e-12);
  c.classifier_layers = 10;  // the last stage: 25 of 40 layers' worth
  EXPECT_NEAR(pipeline_step_ms(p, c, 0, 100, 0), (37.5 + 62.5) / 2 + 62.5 / 2, 1e-9);
  c.stages = 31;
  EXPECT_THROW(make_sim_pipeline(c), std::invalid_argument);
}

TEST(SimPipeline, TheLoadIsSkewedOverTheDevicesAndShifts) {
  sim_pipeline_config c;
  c.load_skew = 3;
  c.loaded_share = 0.25;
  c.load_shift_s = 10;
  int loaded = 0, changed = 0;
  for (uint64_t d = 0; d < 4000; ++d) {
    const double now = device_slowdown(c, d, 5), later = device_slowdown(c, d, 15);
    EXPECT_TRUE(now == 1 || now == 3);
    EXPECT_EQ(now, device_slowdown(c, d, 9.9));  // the same within a phase
    loaded += now == 3;
    changed += now != later;
  }
  EXPECT_NEAR(loaded / 4000.0, 0.25, 0.03);
  EXPECT_GT(changed, 1000);  // a new phase loads other devices
  c.load_skew = 1;
  EXPECT_EQ(device_slowdown(c, 7, 5), 1);
}

TEST(SimPipeline, MigrationMovesLayersOffTheSlowStageAndPaysAPause) {
  sim_pipeline_config c;
  c.stages = 2;
  c.layers = 30;
  c.classifier_layers = 8;
  c.migration = true;
  c.migration_opts.move_cost_s = 0.25;
  auto p = make_sim_pipeline(c);
  const double before = pipeline_step_ms(p, c, 0, 100, 0);
  for (int i = 0; i < 99; ++i) pipeline_step_ms(p, c, 0, 100, 0);
  const auto m = pipeline_window(p, c, 1);
  ASSERT_GT(m.layers_moved, 0);
  EXPECT_EQ(m.heads_moved, 0);
  EXPECT_EQ(p.layers[0] + p.layers[1], 30);
  EXPECT_EQ(p.layers[0], 15 + m.layers_moved);  // off the last stage, onto the first
  EXPECT_NEAR(m.pause_ms, 250.0 * m.layers_moved, 1e-9);
  // The next step pays the pause; the ones after are faster than before.
  EXPECT_NEAR(pipeline_step_ms(p, c, 0, 100, 0) - pipeline_step_ms(p, c, 0, 100, 0),
              250.0 * m.layers_moved, 1e-6);
  EXPECT_LT(pipeline_step_ms(p, c, 0, 100, 0), before);
  // A step that starts after the pause ended (the instance idle) waits
  // for nothing; one that starts halfway waits for the rest.
  for (int i = 0; i < 100; ++i) pipeline_step_ms(p, c, 0, 100, 0);
  const double settled = pipeline_step_ms(p, c, 0, 100, 0);
  p.busy_s = {0.1 * p.layers[0], 0.3 * p.layers[1]};  // moves layers again, past the cooldown
  p.windows_since_move = 100;
  const auto again = pipeline_window(p, c, 1, 20.0);
  ASSERT_GT(again.layers_moved, 0);
  const double pause_s = again.pause_ms / 1000;
  const double later = pipeline_step_ms(p, c, 0, 100, 20.0 + pause_s + 1);
  p.pause_until_s = 20.0 + pause_s;
  const double halfway = pipeline_step_ms(p, c, 0, 100, 20.0 + pause_s / 2);
  EXPECT_NEAR(halfway - later, 1000 * pause_s / 2, 1e-6);
  EXPECT_GT(settled, 0);
  // Off: nothing moves.
  c.migration = false;
  auto q = make_sim_pipeline(c);
  for (int i = 0; i < 100; ++i) pipeline_step_ms(q, c, 0, 100, 0);
  EXPECT_EQ(pipeline_window(q, c, 1).layers_moved, 0);
  EXPECT_EQ(q.layers, (std::vector<int32_t>{15, 15}));
}

TEST(SimPipeline, HeadMigrationSendsAttentionToTheIdleStageAndBringsItHome) {
  // Layer moves off: the last stage, heavier by the classifier, gives a
  // group of its KV heads to the first where contexts are long.
  sim_pipeline_config c;
  c.stages = 2;
  c.layers = 30;
  c.classifier_layers = 8;
  c.head_migration = true;
  c.migration_opts.head_move_cost_s = 0.01;
  c.trip_ms = 0.05;                       // a fast link (troupe's PoCL round trip is 0.6 ms)
  c.migration_opts.cooldown_windows = 0;  // the home window follows at once
  auto p = make_sim_pipeline(c);
  const int64_t rows = 16;
  const double context = rows * 2000.0;  // a mean context of 2000
  const double before = pipeline_step_ms(p, c, 0, 100, 0, rows, context);
  for (int i = 0; i < 99; ++i) pipeline_step_ms(p, c, 0, 100, 0, rows, context);
  const auto m = pipeline_window(p, c, 1);
  EXPECT_EQ(m.layers_moved, 0);
  ASSERT_GT(m.heads_moved, 0);
  EXPECT_EQ(p.heads_donor, 1);
  EXPECT_EQ(p.heads_helper, 0);
  EXPECT_EQ(p.layers, (std::vector<int32_t>{15, 15}));  // no weights move
  EXPECT_NEAR(m.pause_ms, 10.0 * 15 * m.heads_moved / 3, 1e-9);
  pipeline_step_ms(p, c, 0, 100, 0, rows, context);  // pays the pause
  std::fill(p.busy_s.begin(), p.busy_s.end(), 0.0);
  EXPECT_LT(pipeline_step_ms(p, c, 0, 100, 0, rows, context), before);
  // The attention moved, and the donor's trips, by the formula.
  const double share = attention_share(576, 9, 3, 64, 1536, 2000);
  const double moved = 100 * 15 / 38.0 * share * m.heads_moved / 3;
  EXPECT_NEAR(p.busy_s[0] * 1000, 100 * 15 / 38.0 + moved, 1e-9);
  EXPECT_NEAR(p.busy_s[1] * 1000, 100 * 23 / 38.0 - moved + 0.05 * 15 * 2, 1e-9);
  // The load shifts: the helper's device is now 3 times slower, so it is
  // the busier of the two and the group comes home, copying nothing.
  c.load_skew = 3;
  c.loaded_share = 1;  // every device: both slower, the helper's share grows
  for (int i = 0; i < 100; ++i) pipeline_step_ms(p, c, 0, 100, 0, rows, context);
  sim_pipeline_config busy_helper = c;
  busy_helper.load_skew = 1;
  p.busy_s[0] = 3 * p.busy_s[1];
  const auto home = pipeline_window(p, busy_helper, 1);
  EXPECT_TRUE(home.heads_home);
  EXPECT_EQ(home.pause_ms, 0);
  EXPECT_EQ(p.heads_away, 0);
  // Short contexts: attention is too small a share for any group to pay.
  auto q = make_sim_pipeline(c);
  c.load_skew = 1;
  for (int i = 0; i < 100; ++i) pipeline_step_ms(q, c, 0, 100, 0, rows, rows * 8.0);
  EXPECT_EQ(pipeline_window(q, c, 1).heads_moved, 0);
}

sim_config pipelined_config(bool migration) {
  sim_config cfg;
  cfg.instances = 8;
  cfg.cost.c0 = 2;
  cfg.cost.c_prefill = 0.05;
  cfg.cost.c_decode = 0.3;
  cfg.cost.kv_pages = 4096;
  cfg.limits = {256, 32, 128, 16};
  cfg.pipeline.stages = 4;  // 32 devices
  cfg.pipeline.layers = 30;
  cfg.pipeline.classifier_layers = 8;
  cfg.pipeline.load_skew = 3;
  cfg.pipeline.load_shift_s = 20;
  cfg.pipeline.migration = migration;
  cfg.pipeline.migration_opts.move_cost_s = 0.05;
  return cfg;
}

TEST(SimPipeline, PipelinedClustersFinishEveryRequestWithAndWithoutMigration) {
  std::vector<sim_request> reqs;
  for (int i = 0; i < 600; ++i) {
    sim_request r;
    r.arrival = i * 0.1;
    r.prompt = 64 + (i % 7) * 16;
    r.output = 32 + (i % 5) * 8;
    reqs.push_back(r);
  }
  const auto off = simulate(pipelined_config(false), reqs);
  const auto on = simulate(pipelined_config(true), reqs);
  for (const auto* r : {&off, &on}) {
    EXPECT_EQ(r->stats.devices, 32);
    for (const auto& rec : r->records) EXPECT_TRUE(rec.success) << rec.error_message;
  }
  EXPECT_EQ(off.stats.layer_moves, 0u);
  EXPECT_GT(on.stats.layer_moves, 0u);
  EXPECT_GT(on.stats.move_pause_ms, 0);
  // KV-head moves alone, on long prompts: groups go away and come home
  // as the load shifts, and every request still finishes.
  auto heads = pipelined_config(false);
  heads.pipeline.head_migration = true;
  heads.pipeline.trip_ms = 0.001;  // a fast link: these steps take a few ms
  std::vector<sim_request> long_reqs = reqs;
  for (auto& r : long_reqs) r.prompt = 1500 + r.prompt;
  const auto h = simulate(heads, long_reqs);
  for (const auto& rec : h.records) EXPECT_TRUE(rec.success) << rec.error_message;
  EXPECT_EQ(h.stats.layer_moves, 0u);
  EXPECT_GT(h.stats.head_moves, 0u);
  // Not pipelined with --pd or --autoscale (yet): refused by name.
  auto bad = pipelined_config(true);
  bad.pd = true;
  EXPECT_THROW(simulate(bad, reqs), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
