// The router's placement policies (runtime/service/placement.hpp) on synthetic
// snapshots, and the online prefill-time model.
#include <gtest/gtest.h>

#include "runtime/service/placement.hpp"

namespace troupe {
namespace {

instance_snapshot inst(uint64_t id, int32_t waiting, int32_t running, int64_t queued = 0,
                       std::unordered_set<uint64_t> hashes = {}) {
  instance_snapshot s;
  s.instance = id;
  s.waiting = waiting;
  s.running = running;
  s.queued_prefill_tokens = queued;
  s.free_pages = 100;
  s.total_pages = 100;
  s.prefix_hashes = std::move(hashes);
  return s;
}

TEST(Placement, PolicyNamesRoundTrip) {
  for (auto p : {placement_policy::round_robin, placement_policy::least_load,
                 placement_policy::prefix, placement_policy::slo, placement_policy::load_aware})
    EXPECT_EQ(parse_placement_policy(to_string(p)), p);
  EXPECT_FALSE(parse_placement_policy("random"));
}

TEST(Placement, RoundRobinVisitsEveryServingInstanceInTurn) {
  std::vector<instance_snapshot> s = {inst(1, 0, 0), inst(2, 9, 9), inst(3, 0, 0)};
  s[2].serving = false;  // draining: skipped
  placement_cursor c;
  prefill_model m;
  std::vector<uint64_t> got;
  for (int i = 0; i < 4; ++i)
    got.push_back(place(placement_policy::round_robin, {}, s, c, m, 0).instance);
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 2, 1, 2}));
}

TEST(Placement, LeastLoadUsesVllmsScore) {
  // 4 x waiting + running: 4x1+0 = 4 beats 4x0+5 = 5.
  std::vector<instance_snapshot> s = {inst(1, 0, 5), inst(2, 1, 0), inst(3, 2, 0)};
  placement_cursor c;
  prefill_model m;
  auto p = place(placement_policy::least_load, {}, s, c, m, 0);
  EXPECT_EQ(p.instance, 2u);
  EXPECT_NE(p.why.find("4x1+0=4"), std::string::npos) << p.why;
}

// The global prefix index: pages in an instance's KV store continue its
// device run, weighed by what loading one costs against computing it.
TEST(Placement, PrefixWeighsKvStorePagesByTheirMeasuredCost) {
  EXPECT_DOUBLE_EQ(tier_weight(-1, 5), 0.5);  // not measured yet
  EXPECT_DOUBLE_EQ(tier_weight(1, 4), 0.75);
  EXPECT_DOUBLE_EQ(tier_weight(9, 4), 0.0);  // slower than computing: worth nothing
  placement_request r;
  r.page_hashes = {11, 12, 13, 14, 15, 16};
  r.prompt_tokens = 100;
  r.page_size = 16;
  std::vector<instance_snapshot> s = {inst(1, 0, 0, 0, {11, 12}), inst(2, 0, 0, 0, {11})};
  s[1].tier_hashes = {12, 13, 14, 15, 16};  // 1 on the device + 5 in its store
  placement_cursor c;
  prefill_model m;  // no samples: weight 0.5, 1 + 2.5 > 2
  auto p = place(placement_policy::prefix, r, s, c, m, 0);
  EXPECT_EQ(p.instance, 2u) << p.why;
  EXPECT_NE(p.why.find("1 cached prefix pages + 5 in its KV store"), std::string::npos) << p.why;
  EXPECT_EQ(p.prefix_pages, 1);
  // Measured: loading a page costs more than computing it, so the device
  // run wins.
  for (int i = 0; i < 50; ++i) m.observe(100 + i, 10 + 0.1 * (100 + i));
  s[1].tier_load_ms_per_page = 100;
  EXPECT_EQ(place(placement_policy::prefix, r, s, c, m, 0).instance, 1u);
  // Cheap loads: the store's pages count almost fully.
  s[1].tier_load_ms_per_page = 0.01;
  EXPECT_EQ(place(placement_policy::prefix, r, s, c, m, 0).instance, 2u);
}

// Device > host > disk: the same run counts less the slower its tier loads.
TEST(Placement, PrefixWeighsHostPagesAboveDiskPages) {
  placement_request r;
  r.page_hashes = {11, 12, 13, 14, 15, 16};
  r.prompt_tokens = 100;
  r.page_size = 16;
  std::vector<instance_snapshot> s = {inst(1, 0, 0, 0, {11}), inst(2, 0, 0, 0, {11})};
  s[0].disk_hashes = {12, 13, 14, 15, 16};
  s[1].tier_hashes = {12, 13};
  s[1].disk_hashes = {13, 14, 15, 16};  // 13 in both tiers: counted in the host
  const auto held = held_by(s[1], r.page_hashes);
  EXPECT_EQ(held.device, 1);
  EXPECT_EQ(held.host, 2);
  EXPECT_EQ(held.disk, 3);
  EXPECT_EQ(held_run(s[0], r.page_hashes), 6);
  prefill_model m;
  for (int i = 0; i < 50; ++i) m.observe(100 + i, 10 + 0.1 * (100 + i));  // 1.6 ms a page
  for (auto& x : s) {
    x.tier_load_ms_per_page = 0.4;  // host weight 0.75
    x.disk_load_ms_per_page = 1.2;  // disk weight 0.25
  }
  placement_cursor c;
  // 1 + 0.25 x 5 = 2.25 against 1 + 0.75 x 2 + 0.25 x 3 = 3.25.
  auto p = place(placement_policy::prefix, r, s, c, m, 0);
  EXPECT_EQ(p.instance, 2u) << p.why;
  EXPECT_NE(p.why.find("5 in its KV store (3 on disk)"), std::string::npos) << p.why;
  // An unmeasured disk is worth no more than half a device page...
  for (auto& x : s) x.disk_load_ms_per_page = -1;
  s[1].tier_hashes = {12};
  s[1].disk_hashes = {13};
  // 1 + 0.5 x 5 = 3.5 against 1 + 0.75 + 0.5 = 2.25.
  EXPECT_EQ(place(placement_policy::prefix, r, s, c, m, 0).instance, 1u);
  // ... nor more than a host page: with host loads at 1.2 ms (weight
  // 0.25) an unmeasured disk page weighs 0.25 too.  The first holds 3 disk
  // pages past its device page (1.75; 2.5 were the disk weighed 0.5), the
  // second 4 host pages (2.0).
  for (auto& x : s) x.tier_load_ms_per_page = 1.2;
  s[0].disk_hashes = {12, 13, 14};
  s[1].tier_hashes = {12, 13, 14, 15};
  s[1].disk_hashes = {};
  auto q = place(placement_policy::prefix, r, s, c, m, 0);
  EXPECT_EQ(q.instance, 2u) << q.why;
}

// The slo prediction: queued work, this prompt's rows past what the
// instance holds, and loading its store's pages.
TEST(Placement, SloCountsWhatAnInstanceHoldsOfThePrompt) {
  prefill_model m;
  for (int l = 16; l <= 2048; l *= 2) m.observe(l, 0.5 * l + 0.0001 * double(l) * l + 3);
  placement_request r;
  r.prompt_tokens = 800;
  r.page_size = 16;
  for (uint64_t h = 1; h <= 40; ++h) r.page_hashes.push_back(h);
  std::unordered_set<uint64_t> all(r.page_hashes.begin(), r.page_hashes.end());
  std::vector<instance_snapshot> s = {inst(1, 0, 0, 0), inst(2, 0, 0, 200, all),
                                      inst(3, 0, 0, 200)};
  s[2].disk_hashes = all;
  s[2].disk_load_ms_per_page = 10;  // 400 ms to load the 40 pages
  placement_cursor c;
  auto p = place(placement_policy::slo, r, s, c, m, 300);
  EXPECT_EQ(p.instance, 2u) << p.why;
  EXPECT_EQ(p.prefix_pages, 40);
  EXPECT_NEAR(p.predicted_ttft_ms, m.predict_ms(200) + m.predict_ms(160), 1e-9);
  // The third alone: its prediction carries the 400 ms of disk loads.
  p = place(placement_policy::slo, r, {s[2]}, c, m, 300);
  EXPECT_NEAR(p.predicted_ttft_ms, m.predict_ms(200) + m.predict_ms(160) + 400, 1e-9);
  // Nothing held anywhere: the whole prompt, and the instance with no
  // queued work.
  for (auto& x : s) x.prefix_hashes.clear(), x.disk_hashes.clear();
  p = place(placement_policy::slo, r, s, c, m, 1e9);
  EXPECT_EQ(p.instance, 1u) << p.why;
  EXPECT_NEAR(p.predicted_ttft_ms, m.predict_ms(800), 1e-9);
  // Cheap disk loads: the third is predicted as fast as the second was.
  s = {inst(1, 0, 0, 0), inst(3, 0, 0, 200)};
  s[1].disk_hashes = all;
  s[1].disk_load_ms_per_page = 0.01;
  p = place(placement_policy::slo, r, s, c, m, 300);
  EXPECT_EQ(p.instance, 3u) << p.why;
}

TEST(Placement, PrefixTakesTheLongestLeadingRunThenLoad) {
  placement_request r;
  r.page_hashes = {11, 12, 13, 14};
  std::vector<instance_snapshot> s = {
      inst(1, 0, 0, 0, {11, 12}), inst(2, 3, 3, 0, {11, 12, 13}),  // longest run, though busier
      inst(3, 0, 0, 0, {12, 13, 14}),  // holds 3 pages but not the first: no run
  };
  placement_cursor c;
  prefill_model m;
  auto p = place(placement_policy::prefix, r, s, c, m, 0);
  EXPECT_EQ(p.instance, 2u);
  EXPECT_EQ(p.prefix_pages, 3);
  // Equal runs: the lighter one.
  s[0].prefix_hashes = {11, 12, 13};
  EXPECT_EQ(place(placement_policy::prefix, r, s, c, m, 0).instance, 1u);
  // No run anywhere: least load.
  r.page_hashes = {99};
  s[0].waiting = 5;
  EXPECT_EQ(place(placement_policy::prefix, r, s, c, m, 0).instance, 3u);
}

TEST(Placement, SloPrefersTheLightestThatMeetsTheTargetElseTheFastest) {
  prefill_model m;
  for (int l = 16; l <= 2048; l *= 2) m.observe(l, 0.5 * l + 0.0001 * double(l) * l + 3);
  placement_request r;
  r.prompt_tokens = 200;
  std::vector<instance_snapshot> s = {inst(1, 0, 1, 4000), inst(2, 2, 2, 100), inst(3, 1, 9, 300)};
  placement_cursor c;
  // Target 400 ms: 1 is predicted far above it (4000 queued tokens); 2 and
  // 3 meet it; 3 has load 4+9 = 13, 2 has 8 + 2 = 10.
  auto p = place(placement_policy::slo, r, s, c, m, 400);
  EXPECT_EQ(p.instance, 2u) << p.why;
  EXPECT_LE(p.predicted_ttft_ms, 400);
  // Target 10 ms: nobody meets it; the lowest prediction wins.
  p = place(placement_policy::slo, r, s, c, m, 10);
  EXPECT_EQ(p.instance, 2u) << p.why;
  EXPECT_NE(p.why.find("none meets it"), std::string::npos);
}

TEST(Placement, NoServingInstanceGivesNone) {
  std::vector<instance_snapshot> s = {inst(1, 0, 0)};
  s[0].serving = false;
  placement_cursor c;
  prefill_model m;
  EXPECT_EQ(place(placement_policy::least_load, {}, s, c, m, 0).instance, 0u);
  EXPECT_EQ(place(placement_policy::least_load, {}, {}, c, m, 0).instance, 0u);
}

TEST(PrefillModel, RecoversAQuadraticFromSamples) {
  prefill_model m;
  EXPECT_EQ(m.predict_ms(100), 0);
  auto truth = [](double l) { return 2e-4 * l * l + 0.7 * l + 5; };
  for (int i = 0; i < 200; ++i) {
    const double l = 16 + (i * 37) % 2000;
    m.observe(l, truth(l));
  }
  for (double l : {64.0, 512.0, 1024.0, 3000.0})
    EXPECT_NEAR(m.predict_ms(l), truth(l), 0.02 * truth(l)) << "L = " << l;
  EXPECT_EQ(m.predict_ms(0), 0);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(KvPull, PullsTheLongestRunPastWhatTheInstanceHolds) {
  const std::vector<uint64_t> h = {11, 12, 13, 14, 15, 16};
  instance_snapshot mine = inst(1, 0, 0, 0, {11});
  mine.tier_hashes = {12};  // its store continues the arena's run
  EXPECT_EQ(held_run(mine, h), 2);
  const std::unordered_set<uint64_t> a = {11, 12, 13};          // one page past
  const std::unordered_set<uint64_t> b = {13, 14, 15};          // three past, no first pages
  const std::unordered_set<uint64_t> c = {11, 12, 14, 15, 16};  // a hole at 13: nothing
  const std::vector<int32_t> runs = {run_after(a, h, 2), run_after(b, h, 2), run_after(c, h, 2)};
  EXPECT_EQ(runs, (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(run_after(b, h, 0), 0);  // a store's run starts where the instance's ends
  const auto& from3 = runs;
  auto p = pick_kv_pull(from3, {-1, -1, -1}, -1);
  EXPECT_EQ(p.store, 1);
  EXPECT_EQ(p.pages, 3);
  // Pulling a page over its link costs more than computing it: recompute.
  EXPECT_EQ(pick_kv_pull(from3, {9.0, 9.0, 9.0}, 3.0).store, -1);
  EXPECT_EQ(pick_kv_pull(from3, {1.0, 1.0, 1.0}, 3.0).store, 1);
  // Per link: the short run over a fast link saves more than the long run
  // over a slow one (1 x (3 - 0.1) > 3 x (3 - 2.5)).
  EXPECT_EQ(pick_kv_pull(from3, {0.1, 2.5, -1}, 3.0).store, 0);
  // An unmeasured link counts half the compute time: it is tried.
  EXPECT_EQ(pick_kv_pull(from3, {0.1, -1, -1}, 3.0).store, 1);
  EXPECT_EQ(pick_kv_pull(from3, {0.1, 2.9, -1}, 3.0).store, 0);
  // Nothing held anywhere past the instance's own pages.
  EXPECT_EQ(pick_kv_pull({0, 0}, {-1, -1}, -1).store, -1);
  EXPECT_EQ(pick_kv_pull({}, {}, -1).store, -1);
}

// BanaServe's load-aware dispatch (Algorithm 4-2): memory share plus the
// prefill backlog's predicted time over the TTFT target; the least
// utilised while below the threshold, else the shortest queue; cached
// prefixes play no part.
TEST(Placement, LoadAwareTakesTheLeastUtilisedThenTheShortestQueue) {
  prefill_model m;
  for (int i = 1; i <= 40; ++i) m.observe(100.0 * i, 1.0 * i);  // 1 ms per 100 tokens
  ASSERT_NEAR(m.predict_ms(500), 5.0, 0.1);
  placement_cursor c;
  // Instance 1 holds the prompt's prefix but has 60% of its pages in use;
  // instance 2 has 20% in use and 500 tokens queued (5 ms of a 50 ms
  // target: 0.1): U 0.6 against 0.3.
  auto a = inst(1, 0, 3, 0, {11, 12});
  a.free_pages = 40;
  auto b = inst(2, 1, 1, 500);
  b.free_pages = 80;
  const auto u = utilisation_of(b, m, 50);
  EXPECT_NEAR(u.memory, 0.2, 1e-9);
  EXPECT_NEAR(u.compute, 0.1, 0.01);
  placement_request r;
  r.page_hashes = {11, 12};
  auto p = place(placement_policy::load_aware, r, {a, b}, c, m, 50);
  EXPECT_EQ(p.instance, 2u) << p.why;
  EXPECT_NE(p.why.find("U 0.30 (memory 0.20 + compute 0.10), 1 waiting"), std::string::npos)
      << p.why;
  // Equal U: the shorter queue.
  auto d = inst(3, 0, 1, 500);
  d.free_pages = 80;
  EXPECT_EQ(place(placement_policy::load_aware, r, {b, d}, c, m, 50).instance, 3u);
  // Every instance at U >= 1: the shortest queue, whatever its U.
  auto full1 = inst(4, 5, 8, 100000);  // compute capped at 1, memory 0.9: U 1.9
  full1.free_pages = 10;
  auto full2 = inst(5, 2, 8, 100000);  // U 2.0, shorter queue
  full2.free_pages = 0;
  p = place(placement_policy::load_aware, r, {full1, full2}, c, m, 50);
  EXPECT_EQ(p.instance, 5u) << p.why;
  EXPECT_NE(p.why.find("the shortest queue"), std::string::npos) << p.why;
  // Before any prefill is measured, memory alone; never a draining one.
  prefill_model fresh;
  auto e = inst(6, 0, 0);
  e.free_pages = 10;
  auto f = inst(7, 9, 0, 5000);
  f.free_pages = 90;
  EXPECT_EQ(place(placement_policy::load_aware, r, {e, f}, c, fresh, 50).instance, 7u);
  f.serving = false;
  EXPECT_EQ(place(placement_policy::load_aware, r, {e, f}, c, fresh, 50).instance, 6u);
}

}  // namespace
}  // namespace troupe
