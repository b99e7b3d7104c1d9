// The step policy (runtime/engine/scheduler.hpp): decode before prefill, token
// budget, chunking, the sequence cap, admission order, preemption victims.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "runtime/engine/scheduler.hpp"

namespace troupe {
namespace {

sched_seq decoding(uint64_t id, int32_t computed, int32_t pages, uint64_t order = 0,
                   seq_class cls = seq_class::online) {
  return {id, cls, order == 0 ? id : order, computed, computed + 1, pages, false, {}};
}

sched_seq prefilling(uint64_t id, int32_t computed, int32_t total, int32_t pages,
                     seq_class cls = seq_class::online) {
  return {id, cls, id, computed, total, pages, false, {}};
}

sched_seq waiting_prompt(uint64_t id, int32_t total, seq_class cls = seq_class::online) {
  return {id, cls, id, 0, total, 0, false, {}};
}

scheduler_limits limits(int32_t budget, int32_t max_seqs, int32_t chunk, int32_t page = 16) {
  return {budget, max_seqs, chunk, page};
}

std::vector<uint64_t> ids(const std::vector<step_chunk>& cs) {
  std::vector<uint64_t> out;
  for (const auto& c : cs) out.push_back(c.id);
  return out;
}

TEST(Scheduler, ValidatesLimits) {
  EXPECT_EQ(validate(limits(64, 16, 32)), "");
  EXPECT_NE(validate(limits(0, 1, 32)), "");
  EXPECT_NE(validate(limits(64, 0, 32)), "");
  EXPECT_NE(validate(limits(64, 16, 0)), "");
  EXPECT_NE(validate(limits(64, 16, 32, 0)), "");
  EXPECT_NE(validate(limits(8, 16, 32)), "");  // decodes could starve
}

TEST(Scheduler, DecodeFirstThenPrefillThenAdmissionWithinBudget) {
  std::vector<sched_seq> running = {prefilling(1, 16, 100, 1), decoding(2, 40, 3),
                                    decoding(3, 20, 2)};
  std::vector<sched_seq> waiting = {waiting_prompt(4, 50)};
  auto plan = plan_step(running, waiting, limits(32, 8, 16), 100);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{2, 3}));
  for (const auto& c : plan.decode) EXPECT_TRUE(c.sample);
  ASSERT_EQ(plan.prefill.size(), 2u);
  EXPECT_EQ(plan.prefill[0].id, 1u);
  EXPECT_EQ(plan.prefill[0].start, 16);
  EXPECT_EQ(plan.prefill[0].n_tokens, 16);  // the chunk size
  EXPECT_FALSE(plan.prefill[0].sample);
  EXPECT_EQ(plan.prefill[1].id, 4u);
  EXPECT_EQ(plan.prefill[1].n_tokens, 32 - 2 - 16);  // what the budget leaves
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{4}));
  EXPECT_EQ(plan.tokens, 32);
  // The decodes fit in the pages they hold; seq 1 grows to 2 pages, seq 4 takes 1.
  EXPECT_EQ(plan.new_pages, 2);
}

TEST(Scheduler, LongPromptsArePrefilledInChunksAndSampledAtTheEnd) {
  std::vector<sched_seq> waiting = {waiting_prompt(1, 300), waiting_prompt(2, 10)};
  auto plan = plan_step({}, waiting, limits(256, 8, 64), 100);
  ASSERT_EQ(plan.prefill.size(), 2u);
  EXPECT_EQ(plan.prefill[0].n_tokens, 64);
  EXPECT_FALSE(plan.prefill[0].sample);
  EXPECT_EQ(plan.prefill[1].n_tokens, 10);
  EXPECT_TRUE(plan.prefill[1].sample);
  // The last chunk of a running prefill samples.
  plan = plan_step({prefilling(1, 256, 300, 16)}, {}, limits(256, 8, 64), 100);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].start, 256);
  EXPECT_EQ(plan.prefill[0].n_tokens, 44);
  EXPECT_TRUE(plan.prefill[0].sample);
  EXPECT_EQ(plan.new_pages, 3);  // 300 tokens: 19 pages
}

TEST(Scheduler, SequenceCapLimitsAdmission) {
  std::vector<sched_seq> running = {decoding(1, 5, 1), decoding(2, 5, 1)};
  std::vector<sched_seq> waiting = {waiting_prompt(3, 5), waiting_prompt(4, 5),
                                    waiting_prompt(5, 5)};
  auto plan = plan_step(running, waiting, limits(64, 3, 32), 100);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{3}));
}

TEST(Scheduler, AdmitsOnlineBeforeOfflineThenByArrival) {
  std::vector<sched_seq> waiting = {waiting_prompt(1, 5, seq_class::offline), waiting_prompt(3, 5),
                                    waiting_prompt(2, 5)};
  auto plan = plan_step({}, waiting, limits(64, 2, 32), 100);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{2, 3}));
}

TEST(Scheduler, AdmissionStopsAtTheFirstThatDoesNotFit) {
  // A swapped sequence needs its whole table back: 3 pages, 2 free.
  sched_seq swapped{1, seq_class::online, 1, 40, 41, 0, true, {}};
  auto plan = plan_step({}, {swapped, waiting_prompt(2, 5)}, limits(64, 8, 32), 2);
  EXPECT_TRUE(plan.admitted.empty());
  plan = plan_step({}, {swapped, waiting_prompt(2, 5)}, limits(64, 8, 32), 4);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(plan.new_pages, 4);
  // A prompt's first chunk shrinks to the free pages; none free: none admitted.
  plan = plan_step({}, {waiting_prompt(3, 100)}, limits(64, 8, 64), 2);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].n_tokens, 32);
  plan = plan_step({}, {waiting_prompt(3, 100)}, limits(64, 8, 64), 0);
  EXPECT_TRUE(plan.admitted.empty());
}

TEST(Scheduler, PreemptsOfflineBeforeOnlineThenMostRecent) {
  // Every decode crosses into a new page; no page is free.
  std::vector<sched_seq> running = {
      decoding(1, 32, 2, 1), decoding(2, 32, 2, 2, seq_class::offline), decoding(3, 32, 2, 3),
      decoding(4, 32, 2, 4), decoding(5, 32, 2, 5, seq_class::offline)};
  auto plan = plan_step(running, {waiting_prompt(9, 4)}, limits(64, 8, 32), 0);
  // Victim 5 (offline, latest) frees 2 pages: 4 decodes need 4.  Victim 2
  // (offline) frees 2 more and removes its own need: 3 needed, 4 free.
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{5, 2}));
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_TRUE(plan.admitted.empty());  // a preempting step admits nobody
  EXPECT_EQ(plan.new_pages, 3);

  // Online only: the most recently arrived goes first.
  running = {decoding(1, 32, 2, 1), decoding(2, 32, 2, 2), decoding(3, 32, 2, 3)};
  plan = plan_step(running, {}, limits(64, 8, 32), 1);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{3}));
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{1, 2}));
}

TEST(Scheduler, ResumedSequencesKeepTheirArrivalOrder) {
  // Seq 1 arrived first and was preempted: it comes back before seq 2.
  std::vector<sched_seq> waiting = {waiting_prompt(2, 10), waiting_prompt(1, 60)};
  auto plan = plan_step({}, waiting, limits(64, 8, 64), 4);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{1}));  // 60 tokens fill the 4 pages
}

TEST(Scheduler, PrefillShrinksToFreePagesAndPreemptsOnlyWhenNothingRuns) {
  // Seq 1's last page has 8 free slots, no free page: it computes 8 tokens.
  auto plan = plan_step({prefilling(1, 24, 100, 2)}, {}, limits(64, 8, 64), 0);
  EXPECT_TRUE(plan.preempted.empty());
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].n_tokens, 8);
  // Both prefills have full pages and the arena is full: the later one goes.
  std::vector<sched_seq> running = {prefilling(1, 32, 100, 2), prefilling(2, 48, 100, 3)};
  plan = plan_step(running, {}, limits(64, 8, 64), 0);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].id, 1u);
  EXPECT_EQ(plan.prefill[0].n_tokens, 48);  // the 3 freed pages
  EXPECT_EQ(plan.new_pages, 3);
}

TEST(Scheduler, EmptyWhenIdle) {
  auto plan = plan_step({}, {}, limits(64, 8, 32), 10);
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(plan.tokens, 0);
}

// Random states: the plan keeps every limit, never spends pages it does not
// have, chunks start at computed, and victims are the lowest priority.
TEST(Scheduler, RandomStatesKeepTheLimits) {
  std::mt19937 rng(7);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iter = 0; iter < 4000; ++iter) {
    auto lim = limits(uni(8, 96), uni(1, 8), uni(1, 64), uni(1, 32));
    lim.offline_yields = iter % 2 == 1;
    std::vector<sched_seq> running, waiting;
    uint64_t id = 1;
    for (int n = uni(0, lim.max_seqs); n > 0; --n) {
      sched_seq s;
      s.id = id++;
      s.order = uint64_t(uni(1, 1000));
      s.cls = uni(0, 1) ? seq_class::online : seq_class::offline;
      s.total = uni(1, 300);
      s.computed = uni(0, 1) ? s.total - 1 : uni(0, s.total - 1);
      s.pages = (s.computed + lim.page_size - 1) / lim.page_size + uni(0, 1);
      running.push_back(s);
    }
    for (int n = uni(0, 6); n > 0; --n) {
      sched_seq s;
      s.id = id++;
      s.order = uint64_t(uni(1, 1000));
      s.total = uni(1, 300);
      s.swapped = uni(0, 3) == 0;
      s.cls = uni(0, 1) ? seq_class::online : seq_class::offline;
      s.deadline = uni(0, 1) ? uni(1, 500) : 0;
      s.computed = s.swapped ? uni(0, s.total - 1) : 0;
      waiting.push_back(s);
    }
    const int32_t free_pages = uni(0, 40);
    auto plan = plan_step(running, waiting, lim, free_pages);

    std::map<uint64_t, const sched_seq*> all;
    for (const auto& s : running) all[s.id] = &s;
    for (const auto& s : waiting) all[s.id] = &s;
    std::set<uint64_t> victims(plan.preempted.begin(), plan.preempted.end());
    int32_t freed = 0;
    for (auto v : plan.preempted) freed += all.at(v)->pages;
    // Victims are the lowest-priority running sequences.
    for (const auto& s : running) {
      if (victims.count(s.id)) continue;
      for (auto v : plan.preempted) {
        EXPECT_TRUE(runs_before(s, *all.at(v)));
      }
    }
    if (!plan.preempted.empty()) {
      EXPECT_TRUE(plan.admitted.empty());
    }

    int32_t tokens = 0, pages = 0;
    std::set<uint64_t> seen;
    for (const auto* list : {&plan.decode, &plan.prefill})
      for (const auto& c : *list) {
        const sched_seq& s = *all.at(c.id);
        EXPECT_TRUE(seen.insert(c.id).second);
        EXPECT_FALSE(victims.count(c.id));
        EXPECT_EQ(c.start, s.computed);
        EXPECT_GT(c.n_tokens, 0);
        EXPECT_LE(c.start + c.n_tokens, s.total);
        EXPECT_EQ(c.sample, c.start + c.n_tokens == s.total);
        if (list == &plan.prefill) {
          EXPECT_LE(c.n_tokens, lim.chunk_size);
        }
        tokens += c.n_tokens;
        int32_t need = (c.start + c.n_tokens + lim.page_size - 1) / lim.page_size - s.pages;
        pages += std::max(0, need);
      }
    // Every surviving decode gets its row, except offline ones that yield
    // (and everything in a plan that only preempts for an admission).
    const bool preempt_only = plan.empty() && !plan.preempted.empty();
    for (const auto& s : running) {
      if (!victims.count(s.id) && s.total - s.computed == 1 && !preempt_only &&
          (!lim.offline_yields || s.cls == seq_class::online)) {
        EXPECT_TRUE(seen.count(s.id));
      }
    }

    EXPECT_EQ(tokens, plan.tokens);
    EXPECT_LE(tokens, lim.max_batch_tokens);
    EXPECT_EQ(pages, plan.new_pages);
    EXPECT_LE(pages, free_pages + freed);
    EXPECT_LE(running.size() - victims.size() + plan.admitted.size(), size_t(lim.max_seqs));
    // Something runs whenever a running sequence is left.
    if (running.size() > victims.size() && !preempt_only) {
      EXPECT_FALSE(plan.empty());
    }
  }
}

// The livelock of issue 9: a re-admitted sequence mapped a cached prefix
// page another running sequence also held; the plan counted that page as
// freed by preempting it, the pool freed nothing, and the step came up
// short forever.  With the tables known, the plan preempts until the pages
// really freed cover the decode rows.
TEST(Scheduler, SharedPrefixPagesAreNotCountedAsFreedByPreemption) {
  auto lim = limits(64, 8, 32);
  sched_seq a = decoding(1, 32, 2);  // needs a third page for position 32
  a.table = {10, 11};
  sched_seq c = prefilling(2, 16, 40, 1);  // its own page
  c.table = {12};
  sched_seq b = prefilling(3, 16, 40, 1);  // re-admitted: its one page is a's first
  b.table = {10};
  auto plan = plan_step({a, b, c}, {}, lim, 0);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{1}));
  // Without the tables (each sequence's pages its own) one victim suffices.
  a.table.clear(), b.table.clear(), c.table.clear();
  EXPECT_EQ(plan_step({a, b, c}, {}, lim, 0).preempted, (std::vector<uint64_t>{3}));
}

// Two victims sharing a page free it together.
TEST(Scheduler, APageSharedOnlyByVictimsIsFreedWithTheLast) {
  auto lim = limits(64, 8, 32);
  sched_seq a = decoding(1, 32, 2);
  a.table = {1, 2};
  sched_seq b = decoding(2, 15, 1);
  b.table = {7};
  sched_seq c = decoding(3, 15, 1);
  c.table = {7};
  auto plan = plan_step({a, b, c}, {}, lim, 0);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{1}));
}

// Co-location (issue 11): online rows first, offline ones take the rest.
TEST(Scheduler, OfflineDecodeYieldsTheBudgetAndKeepsItsPages) {
  auto lim = limits(20, 8, 16);
  lim.offline_yields = true;
  std::vector<sched_seq> running = {decoding(1, 40, 3, 1, seq_class::offline),
                                    decoding(2, 40, 3, 2, seq_class::offline),
                                    prefilling(3, 0, 100, 0), decoding(4, 20, 2, 4)};
  auto plan = plan_step(running, {}, lim, 100);
  EXPECT_TRUE(plan.preempted.empty());
  // Online decode 4, online prefill 3 (16 rows), then offline with what is left.
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{4, 1, 2}));
  EXPECT_EQ(ids(plan.prefill), (std::vector<uint64_t>{3}));
  lim.max_batch_tokens = 17;
  plan = plan_step(running, {}, lim, 100);
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{4}));  // both offline decodes skip the step
  EXPECT_TRUE(plan.preempted.empty());
  // Without co-location every running decode keeps its row.
  lim.offline_yields = false;
  plan = plan_step(running, {}, lim, 100);
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{4, 1, 2}));
}

TEST(Scheduler, OfflineRowsBesideOnlineOnesAreCapped) {
  auto lim = limits(64, 16, 32);
  lim.offline_yields = true;
  lim.offline_rows = 1;
  std::vector<sched_seq> running = {decoding(1, 40, 3, 1),
                                    decoding(2, 40, 3, 2, seq_class::offline),
                                    decoding(3, 40, 3, 3, seq_class::offline)};
  auto plan = plan_step(running, {}, lim, 100);
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{1, 2}));  // one offline row beside online
  // Alone, offline work has the whole budget.
  plan = plan_step({running[1], running[2]}, {}, lim, 100);
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{2, 3}));
}

TEST(Scheduler, OfflinePrefillPausesAtItsChunkBoundary) {
  auto lim = limits(32, 8, 32);
  lim.offline_yields = true;
  std::vector<sched_seq> running = {prefilling(1, 32, 200, 2, seq_class::offline)};
  auto plan = plan_step(running, {waiting_prompt(2, 64)}, lim, 100);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].id, 2u);    // the online arrival takes the whole budget
  EXPECT_TRUE(plan.preempted.empty());  // the offline prefill keeps its 32 computed tokens
}

TEST(Scheduler, AnOnlineArrivalPreemptsOfflineWorkForASlot) {
  auto lim = limits(64, 2, 32);
  lim.offline_yields = true;
  std::vector<sched_seq> running = {decoding(1, 40, 3, 1, seq_class::offline),
                                    decoding(2, 40, 3, 2, seq_class::offline)};
  auto plan = plan_step(running, {waiting_prompt(3, 10)}, lim, 100);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(plan.empty());  // only preempts: the caller plans again
  plan = plan_step({running[0]}, {waiting_prompt(3, 10)}, lim, 100);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{3}));
  // For pages too: none free, the offline victim's pages go to it.
  plan = plan_step({running[0]}, {waiting_prompt(3, 10)}, lim, 0);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{1}));
  // Online-priority without preemption: the arrival waits.
  lim.offline_yields = false;
  plan = plan_step(running, {waiting_prompt(3, 10)}, lim, 100);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(ids(plan.decode), (std::vector<uint64_t>{1, 2}));
}

TEST(Scheduler, OnlineSequencesRunEarliestDeadlineFirst) {
  auto a = waiting_prompt(1, 10), b = waiting_prompt(2, 10), c = waiting_prompt(3, 10);
  a.deadline = 300;
  b.deadline = 100;  // arrived later, due sooner
  auto plan = plan_step({}, {a, b, c}, limits(64, 2, 32), 100);
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{2, 1}));
  auto off = waiting_prompt(4, 10, seq_class::offline);
  off.deadline = 1;  // the class comes first
  EXPECT_TRUE(runs_before(c, off));
}

}  // namespace
}  // namespace troupe
