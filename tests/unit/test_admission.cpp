// The admission policy (runtime/engine/admission, issue 36 item 2 on a
// real instance): which waiting sequences the scheduler may admit, in what
// order, under continuous and static batching.
#include <gtest/gtest.h>

#include <unordered_set>

#include "runtime/engine/admission.hpp"

namespace troupe {
namespace {

admission_candidate fresh(uint64_t key, double slo_s, int32_t tokens) {
  return {key, false, slo_s, tokens};
}

TEST(Admission, TheDefaultLeavesTheQueueToTheScheduler) {
  admission_policy p;  // continuous, deadline
  admission_state st;
  auto order =
      admission_order({fresh(3, 9, 10), fresh(1, 1, 500)}, p, st, [](uint64_t) { return true; });
  EXPECT_EQ(order, (std::vector<uint64_t>{3, 1}));
  EXPECT_TRUE(st.batch.empty());
}

TEST(Admission, ContinuousOrdersFollowTheirKeys) {
  // Arrival order 1 .. 5: (completion deadline s, predicted tokens).
  const std::vector<admission_candidate> q = {fresh(1, 30, 400), fresh(2, 5, 300), fresh(3, 7, 10),
                                              fresh(4, 6, 12), fresh(5, 8, 290)};
  admission_state st;
  auto alive = [](uint64_t) { return true; };
  admission_policy p;
  p.order = batch_order::fifo;
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  p.order = batch_order::length;
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{3, 4, 5, 2, 1}));
  p.order = batch_order::slo;
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{2, 4, 3, 5, 1}));
  // SLO-ODBS, in units of the medians (7 s, 290 tokens): 2 opens a group;
  // 4 is as urgent but far shorter, and opens its own; 3 joins 4's (1 s
  // and 2 tokens apart); 5 joins 2's (3 s and 10 tokens apart: 0.93 of
  // the threshold); 1 is 22 s later than any and opens a third.  Groups
  // run in the order they opened.
  p.order = batch_order::slo_odbs;
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{2, 5, 4, 3, 1}));
  EXPECT_TRUE(st.batch.empty());  // continuous: no batch held
}

TEST(Admission, StaticBatchesAdmitOneBatchUntilItsMembersLeave) {
  admission_policy p;
  p.mode = batching_mode::static_batches;
  p.order = batch_order::fifo;
  p.odbs.max_batch = 2;
  admission_state st;
  std::unordered_set<uint64_t> present = {1, 2, 3, 4};
  auto alive = [&](uint64_t k) { return present.count(k) > 0; };
  std::vector<admission_candidate> q = {fresh(1, 9, 9), fresh(2, 9, 9), fresh(3, 9, 9),
                                        fresh(4, 9, 9)};
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(st.batch, (std::unordered_set<uint64_t>{1, 2}));
  // 1 and 2 run: only the new ones wait, and none may start.
  q = {fresh(3, 9, 9), fresh(4, 9, 9)};
  EXPECT_TRUE(admission_order(q, p, st, alive).empty());
  // 1 finished, 2 still runs: still none.
  present.erase(1);
  EXPECT_TRUE(admission_order(q, p, st, alive).empty());
  // 2 finished: the next batch.
  present.erase(2);
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(st.batch, (std::unordered_set<uint64_t>{3, 4}));
  EXPECT_EQ(st.formed, 2u);
}

TEST(Admission, AMemberWaitingAgainStaysAdmissibleAndStartedWorkGoesFirst) {
  admission_policy p;
  p.mode = batching_mode::static_batches;
  p.order = batch_order::slo;
  p.odbs.max_batch = 2;
  admission_state st;
  auto alive = [](uint64_t) { return true; };
  std::vector<admission_candidate> q = {fresh(1, 9, 9), fresh(2, 1, 9), fresh(3, 5, 9)};
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{2, 3}));
  // 3 was admitted, 2 could not be yet; an imported sequence (7, with its
  // KV) arrives: it goes first, then the member still waiting; 1 waits.
  q = {fresh(1, 9, 9), fresh(2, 1, 9), {7, true, 50, 9}};
  EXPECT_EQ(admission_order(q, p, st, alive), (std::vector<uint64_t>{7, 2}));
}

TEST(Admission, OnlyTheOldestWindowIsPlannedTheRestFollowsByArrival) {
  admission_policy p;
  p.order = batch_order::length;
  admission_state st;
  std::vector<admission_candidate> q;
  const uint64_t n = k_admission_window + 3;
  // Each newer one predicted shorter: within the window the length order
  // reverses them; past it they keep arrival order.
  for (uint64_t k = 0; k < n; ++k) q.push_back(fresh(k, 9, int32_t(10000 - k)));
  auto o = admission_order(q, p, st, [](uint64_t) { return true; });
  ASSERT_EQ(o.size(), n);
  EXPECT_EQ(o.front(), k_admission_window - 1);
  EXPECT_EQ(o[k_admission_window - 1], 0u);
  EXPECT_EQ((std::vector<uint64_t>(o.end() - 3, o.end())),
            (std::vector<uint64_t>{n - 3, n - 2, n - 1}));
}

TEST(Admission, ModesAndOrdersParseByTheirSettingNames) {
  EXPECT_EQ(parse_batching_mode("continuous"), batching_mode::continuous);
  EXPECT_EQ(parse_batching_mode("static"), batching_mode::static_batches);
  EXPECT_FALSE(parse_batching_mode("dynamic"));
  EXPECT_STREQ(to_string(batching_mode::static_batches), "static");
  for (const char* o : {"fifo", "length", "slo", "slo-odbs"})
    EXPECT_STREQ(to_string(*parse_batch_order(o)), o);
}

}  // namespace
}  // namespace troupe
