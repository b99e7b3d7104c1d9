// The data-parallel balance policy (runtime/service/dp_balance): admission to the
// replica with the most free KV, the gap measure, and the moves that bring
// the gap under its threshold.
#include <gtest/gtest.h>

#include "runtime/service/dp_balance.hpp"

namespace troupe {
namespace {

TEST(DpBalance, AdmitsToTheReplicaWithTheMostFreeKv) {
  std::vector<replica_load> r{{1, true, 1000, 600}, {2, true, 2000, 1200}, {3, true, 1000, 100}};
  EXPECT_EQ(admit_most_free_kv(r), 3u);  // 900 free, against 400 and 800
  r[2].kv_tokens = 300;                  // 700 free
  EXPECT_EQ(admit_most_free_kv(r), 2u);
  r[1].serving = false;
  EXPECT_EQ(admit_most_free_kv(r), 3u);
  for (auto& x : r) x.serving = false;
  EXPECT_EQ(admit_most_free_kv(r), 0u);
}

TEST(DpBalance, AdmissionTiesGoToTheLighterThenTheLowerId) {
  std::vector<replica_load> r{{4, true, 1000, 500}, {2, true, 1000, 500}};
  EXPECT_EQ(admit_most_free_kv(r), 2u);
  r = {{1, true, 1200, 700}, {2, true, 1000, 500}};  // both 500 free
  EXPECT_EQ(admit_most_free_kv(r), 2u);
}

TEST(DpBalance, GapOverMeanOfTheServingReplicas) {
  std::vector<replica_load> r{{1, true, 1000, 300}, {2, true, 1000, 100}, {3, false, 1000, 900}};
  const auto b = balance_of(r);
  EXPECT_EQ(b.max_tokens, 300);
  EXPECT_EQ(b.min_tokens, 100);
  EXPECT_DOUBLE_EQ(b.mean_tokens, 200);
  EXPECT_DOUBLE_EQ(b.gap_over_mean, 1.0);
  EXPECT_EQ(b.most_loaded, 1u);
  EXPECT_EQ(b.least_loaded, 2u);
  EXPECT_EQ(balance_of({{1, true, 10, 0}, {2, true, 10, 0}}).gap_over_mean, 0);
  EXPECT_EQ(balance_of({{1, true, 10, 7}}).gap_over_mean, 0);
}

TEST(DpBalance, NoMovesUnderTheThreshold) {
  std::vector<replica_load> r{{1, true, 1000, 110}, {2, true, 1000, 90}};  // gap 20 = 20% of 100
  EXPECT_TRUE(plan_dp_moves(r, {{7, 20}}, 0.2, 8).empty());
}

TEST(DpBalance, MovesTheSequencesThatCloseTheGap) {
  // 4 x 100 tokens on replica 2, none on 1: two move (gap 400 -> 200 -> 0).
  std::vector<replica_load> r{{1, true, 1000, 0}, {2, true, 1000, 400}};
  const auto m = plan_dp_moves(r, {{10, 100}, {11, 100}, {12, 100}, {13, 100}}, 0.2, 8);
  ASSERT_EQ(m.size(), 2u);
  for (const auto& x : m) {
    EXPECT_EQ(x.from, 2u);
    EXPECT_EQ(x.to, 1u);
    EXPECT_EQ(x.tokens, 100);
  }
  EXPECT_EQ(m[0].sequence, 10u);
  EXPECT_EQ(m[1].sequence, 11u);
}

TEST(DpBalance, PrefersTheSequenceNearestHalfTheGap) {
  // Gap 300: moving 150 closes it; 280 would leave 260 the other way.
  std::vector<replica_load> r{{1, true, 1000, 100}, {2, true, 1000, 400}};
  const auto m = plan_dp_moves(r, {{1, 280}, {2, 150}, {3, 20}}, 0.1, 8);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].sequence, 2u);
}

TEST(DpBalance, NeverMovesASequenceThatWidensTheGapOrBeyondTheCap) {
  std::vector<replica_load> r{{1, true, 1000, 0}, {2, true, 1000, 500}};
  EXPECT_TRUE(plan_dp_moves(r, {{1, 500}, {2, 600}}, 0.2, 8).empty());  // t >= gap
  const auto m = plan_dp_moves(r, {{1, 50}, {2, 50}, {3, 50}, {4, 50}}, 0.0, 3);
  EXPECT_EQ(m.size(), 3u);
}

TEST(DpPendingAdmissions, StayUntilTheReplicaCountsThemArrived) {
  using namespace std::chrono_literals;
  const auto t0 = pending_admissions::clock::time_point{} + 1h;
  pending_admissions p;
  p.report(7, t0);  // the first report sets the count
  p.admit(190, t0);
  // A report asked for after the admission, answered before the request
  // arrived: the prompt still counts (the race the flaky test found).
  p.report(7, t0 + 1ms);
  EXPECT_EQ(p.tokens(), 190);
  p.admit(5, t0 + 2ms);
  p.admit(6, t0 + 2ms);
  p.report(8, t0 + 3ms);  // the long one arrived: the two short stay
  EXPECT_EQ(p.tokens(), 11);
  EXPECT_EQ(p.size(), 2u);
  p.report(12, t0 + 4ms);  // more arrived than were admitted (asked-for ones)
  EXPECT_EQ(p.tokens(), 0);
}

TEST(DpPendingAdmissions, ExpireRestartAndJoinAgain) {
  using namespace std::chrono_literals;
  const auto t0 = pending_admissions::clock::time_point{} + 1h;
  pending_admissions p(5s);
  p.admit(100, t0);  // before any report: kept by the first one
  p.report(3, t0 + 1ms);
  EXPECT_EQ(p.tokens(), 100);
  p.report(3, t0 + 6s);  // never arrived (its client left): it expires
  EXPECT_EQ(p.tokens(), 0);
  p.admit(40, t0 + 6s);
  p.report(1, t0 + 6s);  // the count went back: the replica restarted
  EXPECT_EQ(p.tokens(), 0);
  p.admit(40, t0 + 7s);
  p.reset();
  EXPECT_EQ(p.tokens(), 0);
  p.admit(30, t0 + 7s);
  p.report(9, t0 + 7s);  // no count to compare with after a reset
  EXPECT_EQ(p.tokens(), 30);
  p.report(10, t0 + 7s);
  EXPECT_EQ(p.tokens(), 0);
}

}  // namespace
}  // namespace troupe
