// SLO-ODBS (runtime/engine/slo_batching, issue 36 item 2): the bucketed
// output-length predictor, the four batch orders on synthetic queues, and
// the static-batch simulator (sim/static_batch_sim) on the repository's
// stories15M cost model, where grouping by length must cut padding and
// deadline misses against FIFO.
#include <gtest/gtest.h>

#include "runtime/engine/slo_batching.hpp"
#include "sim/static_batch_sim.hpp"

namespace troupe {
namespace {

TEST(SloBatching, LengthBucketsAreThePredictorsClasses) {
  EXPECT_EQ(length_bucket(0), 0);
  EXPECT_EQ(length_bucket(7), 0);
  EXPECT_EQ(length_bucket(8), 1);
  EXPECT_EQ(length_bucket(15), 1);
  EXPECT_EQ(length_bucket(16), 2);
  EXPECT_EQ(length_bucket(1023), 7);
  EXPECT_EQ(length_bucket(1024), 8);
  EXPECT_EQ(length_bucket(2047), 8);
  EXPECT_EQ(length_bucket(2048), 9);
  EXPECT_EQ(length_bucket(1 << 30), 9);
  EXPECT_EQ(bucket_tokens(0), 8);
  EXPECT_EQ(bucket_tokens(8), 2048);
  EXPECT_EQ(bucket_tokens(9), 4096);
}

TEST(SloBatching, ThePredictorKeepsAtMostItsCapOfClasses) {
  output_length_predictor p;
  for (size_t i = 0; i < kMaxLengthClasses + 10; ++i) {
    // Appended, not "c" + ...: GCC 12 warns falsely (-Wrestrict) on that.
    std::string name = "c";
    name += std::to_string(i);
    p.observe(name, 0, 100);
  }
  EXPECT_EQ(p.classes(), kMaxLengthClasses);
  // A class past the cap is predicted by the global counts.
  p.observe("late", 0, 3);
  EXPECT_EQ(p.predict("late"), length_bucket(100));
  EXPECT_EQ(p.predict("c0"), length_bucket(100));
}

TEST(SloBatching, PredictorLearnsEachClassAndScoresItself) {
  output_length_predictor p;
  EXPECT_EQ(p.predict("chat", 3), 3);  // nothing seen: the fallback
  p.observe("chat", 3, 100);           // bucket 4: wrong
  EXPECT_EQ(p.predict("chat"), 4);
  EXPECT_EQ(p.predict("code"), 4);  // unseen class: the global mode
  p.observe("code", 4, 1500);       // bucket 8: wrong
  p.observe("code", 8, 1600);       // right
  p.observe("code", 8, 20);         // bucket 2: wrong; code holds 8 twice, 2 once
  EXPECT_EQ(p.predict("code"), 8);
  EXPECT_EQ(p.predict("chat"), 4);
  p.observe("chat", 4, 10);  // bucket 1 ties bucket 4 for chat: the longer
  EXPECT_EQ(p.predict("chat"), 4);
  EXPECT_EQ(p.observed(), 5u);
  EXPECT_DOUBLE_EQ(p.bucket_accuracy(), 1.0 / 5);
}

std::vector<batch_candidate> queue_of(std::vector<std::pair<double, int32_t>> slo_len) {
  std::vector<batch_candidate> q;
  for (size_t i = 0; i < slo_len.size(); ++i) q.push_back({i, slo_len[i].first, slo_len[i].second});
  return q;
}

using batches = std::vector<std::vector<uint64_t>>;

TEST(SloBatching, BaselinesSortThenCut) {
  const auto q = queue_of({{30, 512}, {5, 16}, {20, 16}, {10, 512}, {40, 64}});
  odbs_params p;
  p.max_batch = 2;
  EXPECT_EQ(plan_batches(q, batch_order::fifo, p), (batches{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(plan_batches(q, batch_order::length, p), (batches{{1, 2}, {4, 0}, {3}}));
  EXPECT_EQ(plan_batches(q, batch_order::slo, p), (batches{{1, 3}, {2, 0}, {4}}));
  EXPECT_EQ(plan_batches({}, batch_order::slo_odbs, p), batches{});
}

TEST(SloBatching, SloOdbsGroupsAlikeDeadlinesAndLengths) {
  // Deadlines in two tiers, lengths in two kinds, interleaved.
  const auto q = queue_of({{10, 16}, {10, 1024}, {10, 16}, {10, 1024}, {60, 16}, {60, 16}});
  odbs_params p;
  p.max_batch = 8;
  p.threshold = 0.5;
  // In SLO order, first fit: the shorts of tier 10 together, the longs
  // together, tier 60 apart (50 s from tier 10's batch: 50 * 3 / 10 > 0.5).
  EXPECT_EQ(plan_batches(q, batch_order::slo_odbs, p), (batches{{0, 2}, {1, 3}, {4, 5}}));
  // Two tiers of one length: apart with the SLO spread weighed (50 s
  // apart, the median 60: 50 * 2 / 60 > 0.5), together by length alone
  // (w1 = 0, ODBS).
  const auto tiers = queue_of({{10, 16}, {60, 16}});
  EXPECT_EQ(plan_batches(tiers, batch_order::slo_odbs, p), (batches{{0}, {1}}));
  p.w1 = 0;
  EXPECT_EQ(plan_batches(tiers, batch_order::slo_odbs, p), (batches{{0, 1}}));
  // A loose threshold: only max_batch cuts, in SLO order.
  p.w1 = 1;
  p.threshold = 1e9;
  p.max_batch = 4;
  EXPECT_EQ(plan_batches(q, batch_order::slo_odbs, p), (batches{{0, 1, 2, 3}, {4, 5}}));
  // A late queue (negative slack) still batches: the scale is the slack's
  // size, not its sign (the review found 989 batches of 1000 under load).
  p = odbs_params{};
  p.max_batch = 4;
  const auto late = queue_of({{-100, 64}, {-99, 64}, {-98, 64}, {-97, 64}, {-96, 64}});
  EXPECT_EQ(plan_batches(late, batch_order::slo_odbs, p), (batches{{0, 1, 2, 3}, {4}}));
  EXPECT_EQ(parse_batch_order("slo-odbs"), batch_order::slo_odbs);
  EXPECT_FALSE(parse_batch_order("sjf"));
}

// fill: a group takes later requests predicted no longer than its longest
// until it holds max_batch; a longer one never joins a shorter group, and
// groups left empty are dropped.
TEST(SloBatching, FillTopsGroupsUpWithRequestsNoLongerThanTheirLongest) {
  const auto q = queue_of({{10, 16}, {10, 1024}, {10, 16}, {10, 1024}, {60, 16}, {60, 16}});
  odbs_params p;
  p.max_batch = 8;
  p.threshold = 0.5;
  p.fill = true;
  EXPECT_EQ(plan_batches(q, batch_order::slo_odbs, p), (batches{{0, 2, 4, 5}, {1, 3}}));
  p.max_batch = 3;
  EXPECT_EQ(plan_batches(q, batch_order::slo_odbs, p), (batches{{0, 2, 4}, {1, 3, 5}}));
  // Only slo-odbs forms groups short of max_batch: the others are unchanged.
  EXPECT_EQ(plan_batches(q, batch_order::fifo, p), (batches{{0, 1, 2}, {3, 4, 5}}));
}

TEST(SloBatching, StaticBatchesGroupedByLengthPadLessAndMissFewerDeadlines) {
  const cost_model cost =
      cost_model::load(std::string(TROUPE_SOURCE_DIR) + "/bench/cost_models/stories15m.json");
  const auto reqs = static_workload(600, 0.25, 1, 60, 36);  // near capacity
  static_batch_config c;
  c.odbs.max_batch = 8;
  c.order = batch_order::fifo;
  const auto fifo = run_static_batches(reqs, c, cost);
  c.order = batch_order::slo_odbs;
  const auto odbs = run_static_batches(reqs, c, cost);
  EXPECT_EQ(fifo.completed, 600u);
  EXPECT_EQ(odbs.completed, 600u);
  EXPECT_LT(odbs.padding_share, fifo.padding_share);
  EXPECT_LT(odbs.violation_rate, fifo.violation_rate / 2);  // measured: 10.8% against 97%
  EXPECT_GT(odbs.bucket_accuracy, 0.75);  // nine in ten, less the first of each class
  c.oracle = true;
  EXPECT_DOUBLE_EQ(run_static_batches(reqs, c, cost).bucket_accuracy, 1.0);
}

}  // namespace
}  // namespace troupe
