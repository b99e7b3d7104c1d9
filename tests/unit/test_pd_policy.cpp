// Disaggregation and role switching (runtime/service/pd_policy.hpp, issue 11) on
// synthetic snapshots: pools, prefill and decode placement, flip triggers,
// pool order, minimum instances, hysteresis and cooldown; and the
// monitor's windows (runtime/service/service_monitor.hpp).
#include <gtest/gtest.h>

#include "runtime/service/pd_policy.hpp"
#include "runtime/service/service_monitor.hpp"
#include "runtime/service/ttft_predictor.hpp"

namespace troupe {
namespace {

pd_load inst(uint64_t id, pd_pool pool, std::vector<int32_t> queued = {}, int64_t running = 0) {
  pd_load l;
  l.id = id;
  l.pool = pool;
  l.queued_prefills = std::move(queued);
  l.prefilling = int32_t(l.queued_prefills.size());
  l.running_tokens = running;
  l.decoding = running > 0 ? 1 : 0;
  l.total_pages = 100;
  l.used_pages = int32_t(running / 16);
  return l;
}

// A step of p prefill rows takes p ms: fitted from exact samples.
ttft_model linear_model() {
  ttft_model m;
  for (int i = 0; i < 50; ++i) m.steps.observe(10 + i * 7, 0, 0, 10 + i * 7);
  return m;
}

TEST(PdPolicy, PoolsAndFlips) {
  EXPECT_EQ(flip_pool(pd_pool::prefill, instance_role::decode), pd_pool::prefill_to_decode);
  EXPECT_EQ(flip_pool(pd_pool::decode, instance_role::prefill), pd_pool::decode_to_prefill);
  EXPECT_EQ(flip_pool(pd_pool::mixed, instance_role::prefill), pd_pool::decode_to_prefill);
  // Flipping back before its prefill work drained: it may hold decode work by now.
  EXPECT_EQ(flip_pool(pd_pool::prefill_to_decode, instance_role::prefill),
            pd_pool::decode_to_prefill);
  EXPECT_EQ(flip_pool(pd_pool::decode, instance_role::decode), pd_pool::decode);
  EXPECT_EQ(flip_pool(pd_pool::decode, instance_role::mixed), pd_pool::mixed);
  EXPECT_TRUE(takes_decode(pd_pool::prefill_to_decode));
  EXPECT_FALSE(takes_prefill(pd_pool::prefill_to_decode));
  EXPECT_TRUE(takes_prefill(pd_pool::decode_to_prefill));
  // Promoted once the old role's work is done.
  auto l = inst(1, pd_pool::prefill_to_decode, {30});
  EXPECT_EQ(settle(l.pool, l), pd_pool::prefill_to_decode);
  l.queued_prefills.clear();
  l.prefilling = 0;
  EXPECT_EQ(settle(l.pool, l), pd_pool::decode);
  auto d = inst(2, pd_pool::decode_to_prefill, {}, 500);
  EXPECT_EQ(settle(d.pool, d), pd_pool::decode_to_prefill);
  d.decoding = 0;
  EXPECT_EQ(settle(d.pool, d), pd_pool::prefill);
  EXPECT_EQ(parse_role("decode"), instance_role::decode);
  EXPECT_FALSE(parse_role("both"));
  // Hybrid EPD's E pool: neither kind of work; in and out at once.
  EXPECT_EQ(parse_role("encode"), instance_role::encode);
  EXPECT_EQ(pool_of(instance_role::encode), pd_pool::encode);
  EXPECT_FALSE(takes_prefill(pd_pool::encode));
  EXPECT_FALSE(takes_decode(pd_pool::encode));
  EXPECT_EQ(flip_pool(pd_pool::decode, instance_role::encode), pd_pool::encode);
  EXPECT_EQ(flip_pool(pd_pool::encode, instance_role::prefill), pd_pool::prefill);
  EXPECT_STREQ(to_string(pd_pool::encode), "E");
}

TEST(PdPolicy, PrefillGoesToTheLeastQueuedPInstanceThenDToP) {
  auto m = linear_model();
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill, {300}), inst(2, pd_pool::prefill, {100}),
                                inst(3, pd_pool::decode_to_prefill), inst(4, pd_pool::decode)};
  auto c = place_prefill(50, loads, m, {500, 0});
  EXPECT_EQ(c.instance, 2u);
  EXPECT_TRUE(c.meets_target);
  // Its 100 queued rows and the prompt's 50 in one step, after half of the
  // step in flight (its 100 rows).
  EXPECT_NEAR(c.predicted_ttft_ms, 200, 1);
  // No P instance meets 120 ms: the idle D->P one does.
  c = place_prefill(50, loads, m, {120, 0});
  EXPECT_EQ(c.instance, 3u);
  EXPECT_TRUE(c.meets_target);
  // Nothing meets 20 ms: the lowest prediction, marked as a miss.
  c = place_prefill(50, loads, m, {20, 0});
  EXPECT_EQ(c.instance, 3u);
  EXPECT_FALSE(c.meets_target);
  // With no prefill instance serving, a decode instance prefills (the
  // request does not fail) and the placement is marked as missing.
  c = place_prefill(50, {inst(4, pd_pool::decode)}, m, {});
  EXPECT_EQ(c.instance, 4u);
  EXPECT_FALSE(c.meets_target);
  auto down = inst(4, pd_pool::decode);
  down.serving = false;
  EXPECT_EQ(place_prefill(50, {down}, m, {}).instance, 0u);
  // Nor an E instance (hybrid EPD's encoder-only pool).
  EXPECT_EQ(place_prefill(50, {down, inst(5, pd_pool::encode)}, m, {}).instance, 0u);
}

// The load score is vLLM's (4 x waiting + running): a prompt admitted and
// being prefilled in chunks counts as running, not as waiting (it used to
// count 4, steering prompts onto the instances busiest decoding: 0.93x of
// mixed least-load on the phase trace at 16 instances).  Ties go to the
// most free KV pages, as least-load placement breaks them.
TEST(PdPolicy, PrefillPlacementWeighsAdmittedPromptsAsRunningAndTiesByFreePages) {
  auto m = linear_model();
  auto chunking = inst(1, pd_pool::mixed, {400});  // admitted: 1
  auto queued = inst(2, pd_pool::mixed, {20});     // waiting: 4
  queued.waiting = 1;
  auto decoding = inst(3, pd_pool::mixed, {}, 64);  // 2 decoding
  decoding.decoding = 2;
  EXPECT_EQ(chunking.load_score(), 1);
  EXPECT_EQ(queued.load_score(), 4);
  auto c = place_prefill(50, {queued, decoding, chunking}, m, {5000, 0});
  EXPECT_EQ(c.instance, 1u) << c.why;
  // Equal scores: the instance with more free pages, though its queue is longer.
  auto roomy = inst(4, pd_pool::mixed, {300});
  auto full = inst(5, pd_pool::mixed, {10});
  full.used_pages = 60;
  EXPECT_EQ(place_prefill(50, {full, roomy}, m, {5000, 0}).instance, 4u);
  full.used_pages = 0;  // then the lower prediction
  EXPECT_EQ(place_prefill(50, {roomy, full}, m, {5000, 0}).instance, 5u);
}

TEST(PdPolicy, DecodeStaysOnAMixedPrefillInstanceElseFewestRunningTokensUnderCaps) {
  pd_config cfg;
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill), inst(2, pd_pool::decode, {}, 800),
                                inst(3, pd_pool::decode, {}, 400), inst(4, pd_pool::mixed)};
  auto d = place_decode(4, 100, loads, cfg, {});
  EXPECT_EQ(d.instance, 4u);
  EXPECT_FALSE(d.transfer);
  loads.pop_back();  // (a mixed instance takes decode work from others too)
  d = place_decode(1, 100, loads, cfg, {});
  EXPECT_EQ(d.instance, 3u);
  EXPECT_TRUE(d.transfer);
  // Instance 3 over the step-time cap (the TPOT target): 2 instead.
  loads[2].token_interval_ms = 80;
  loads[1].token_interval_ms = 30;
  EXPECT_EQ(place_decode(1, 100, loads, cfg, {0, 50}).instance, 2u);
  // Both over the KV cap: the fewest running tokens anyway.
  loads[1].used_pages = 95;
  loads[2].used_pages = 95;
  d = place_decode(1, 100, loads, cfg, {0, 0});
  EXPECT_EQ(d.instance, 3u);
  EXPECT_NE(d.why.find("over a cap"), std::string::npos);
  // No decode instance: the prefill instance keeps it.
  EXPECT_EQ(place_decode(1, 100, {inst(1, pd_pool::prefill)}, cfg, {}).instance, 1u);
}

// D->P preemption by migration: each decoding sequence of the instance
// leaving decode goes to the decode-taking instance with the fewest
// running tokens under the caps, counting the ones placed before it;
// never back to itself, never over a cap.
TEST(PdPolicy, EvacuationPlacesEachSequenceUnderTheCapsCountingTheOnesBefore) {
  pd_config cfg;
  std::vector<pd_load> loads = {inst(1, pd_pool::decode_to_prefill, {}, 3000),
                                inst(2, pd_pool::decode, {}, 400), inst(3, pd_pool::mixed, {}, 600),
                                inst(4, pd_pool::prefill), inst(5, pd_pool::prefill_to_decode)};
  // Instance 5 (P->D: takes decode) is empty: it takes the first; then
  // 5 has 500 and 2 has 400, so 2; then 5 (500 < 900 and 600).
  auto to = plan_evacuation(1, {500, 500, 500}, loads, cfg, {});
  EXPECT_EQ(to, (std::vector<uint64_t>{5, 2, 5}));
  // The KV cap: instance 5 has room for 40 pages under 90% of 100 only
  // once (its used pages grow by 32 a sequence of 500 tokens).
  loads[4].used_pages = 50;
  to = plan_evacuation(1, {500, 500, 500}, loads, cfg, {});
  EXPECT_EQ(to, (std::vector<uint64_t>{5, 2, 3}));
  // The step cap (the TPOT target): 2 and 3 over it, 5 full after one:
  // the rest stay (0) rather than join an instance over a cap.
  loads[1].token_interval_ms = 80;
  loads[2].token_interval_ms = 80;
  to = plan_evacuation(1, {500, 500, 500}, loads, cfg, {0, 50});
  EXPECT_EQ(to, (std::vector<uint64_t>{5, 0, 0}));
  // Nowhere to go: every sequence stays.
  to = plan_evacuation(1, {100, 100}, {loads[0], loads[3]}, cfg, {});
  EXPECT_EQ(to, (std::vector<uint64_t>{0, 0}));
  // A lost instance takes nothing.
  loads[4].serving = false;
  to = plan_evacuation(1, {500}, loads, cfg, {0, 50});
  EXPECT_EQ(to, (std::vector<uint64_t>{0}));
}

// The report's switching (straight between P and D, one flip a window),
// as the tests below check it; the first flip decided, if any.
std::optional<flip_decision> first_flip(const std::vector<pd_load>& loads, const pd_window& w,
                                        const pd_targets& t, pd_config c, double now_s,
                                        flip_memory& mem) {
  c.via_mixed = false;
  c.max_flips = 1;
  auto fs = decide_flips(loads, w, t, c, now_s, mem);
  if (fs.empty()) return std::nullopt;
  return fs.front();
}

TEST(PdPolicy, FlipToPrefillNeedsConsecutiveWindowsAndTakesPToDFirst) {
  pd_config cfg;
  cfg.min_decode = 1;
  cfg.violation_windows = 2;
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill, {500}), inst(2, pd_pool::decode, {}, 100),
                                inst(3, pd_pool::decode, {}, 50),
                                inst(4, pd_pool::prefill_to_decode, {}, 900)};
  flip_memory mem;
  pd_window miss{3, 5};
  EXPECT_FALSE(first_flip(loads, miss, {}, cfg, 0, mem));  // one window: not yet
  auto f = first_flip(loads, miss, {}, cfg, 1, mem);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->instance, 4u);  // P->D first, although it is the heaviest
  EXPECT_EQ(f->to, instance_role::prefill);
  // Too few misses (under miss_share of the window's prefills) do not count.
  mem = {};
  EXPECT_FALSE(first_flip(loads, {1, 20}, {}, cfg, 0, mem));
  EXPECT_FALSE(first_flip(loads, {1, 20}, {}, cfg, 1, mem));
  // A window without misses resets the streak.
  mem = {};
  EXPECT_FALSE(first_flip(loads, miss, {}, cfg, 0, mem));
  EXPECT_FALSE(first_flip(loads, {0, 5}, {}, cfg, 1, mem));
  EXPECT_FALSE(first_flip(loads, miss, {}, cfg, 2, mem));
  // Without P->D: the lightest D instance.
  loads.pop_back();
  mem = {};
  first_flip(loads, miss, {}, cfg, 0, mem);
  f = first_flip(loads, miss, {}, cfg, 1, mem);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->instance, 3u);
}

TEST(PdPolicy, KeepsTheMinimumOfDecodeAndPrefillInstances) {
  pd_config cfg;
  cfg.min_decode = 2;
  cfg.violation_windows = 1;
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill, {500}), inst(2, pd_pool::decode, {}, 100),
                                inst(3, pd_pool::decode, {}, 50)};
  flip_memory mem;
  EXPECT_FALSE(first_flip(loads, {1, 1}, {}, cfg, 0, mem));  // 2 decode instances: none to give
  cfg.min_decode = 1;
  EXPECT_TRUE(first_flip(loads, {1, 1}, {}, cfg, 0, mem));
  // The other way: slow decode, but the only prefill instance stays.
  loads[1].token_interval_ms = 90;
  cfg.min_prefill = 1;
  mem = {};
  EXPECT_FALSE(first_flip(loads, {}, {0, 50}, cfg, 0, mem));
}

TEST(PdPolicy, FlipToDecodeOnSlowTokensShortKvOrIdlePrefillFromDToPFirst) {
  pd_config cfg;
  cfg.violation_windows = 1;
  cfg.min_prefill = 1;
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill, {40}), inst(2, pd_pool::prefill, {10}),
                                inst(3, pd_pool::decode, {}, 300)};
  loads[2].token_interval_ms = 90;
  flip_memory mem;
  auto f = first_flip(loads, {}, {0, 50}, cfg, 0, mem);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->to, instance_role::decode);
  EXPECT_EQ(f->instance, 2u);  // the lighter P instance
  EXPECT_NE(f->why.find("token interval"), std::string::npos);
  // D->P is taken first.
  loads.push_back(inst(5, pd_pool::decode_to_prefill, {100}));
  mem = {};
  EXPECT_EQ(first_flip(loads, {}, {0, 50}, cfg, 0, mem)->instance, 5u);
  // Short KV on the decode side.
  loads.pop_back();
  loads[2].token_interval_ms = 10;
  loads[2].used_pages = 95;
  mem = {};
  f = first_flip(loads, {}, {0, 50}, cfg, 0, mem);
  ASSERT_TRUE(f);
  EXPECT_NE(f->why.find("KV"), std::string::npos);
  // Idle prefill while decode works.
  loads[2].used_pages = 10;
  for (int i : {0, 1}) {
    loads[i].queued_prefills.clear();
    loads[i].busy = 0.05;
  }
  mem = {};
  f = first_flip(loads, {}, {0, 50}, cfg, 0, mem);
  ASSERT_TRUE(f);
  EXPECT_NE(f->why.find("idle"), std::string::npos);
  // ... but not when decode is idle too.
  loads[2].decoding = 0;
  mem = {};
  EXPECT_FALSE(first_flip(loads, {}, {0, 50}, cfg, 0, mem));
}

TEST(PdPolicy, AnInstanceCoolsDownAfterAFlip) {
  pd_config cfg;
  cfg.violation_windows = 1;
  cfg.cooldown_s = 5;
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill, {500}), inst(2, pd_pool::decode, {}, 10),
                                inst(3, pd_pool::decode, {}, 900)};
  flip_memory mem;
  auto f = first_flip(loads, {1, 1}, {}, cfg, 0, mem);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->instance, 2u);
  // Still missing a second later: 2 cools down, so 3 goes (a real router
  // would have moved 2 to D->P; here it is still D).
  f = first_flip(loads, {1, 1}, {}, cfg, 1, mem);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->instance, 3u);
  mem.last_flip_s[3] = 1;
  EXPECT_FALSE(first_flip(loads, {1, 1}, {}, cfg, 2, mem));
  EXPECT_TRUE(first_flip(loads, {1, 1}, {}, cfg, 6, mem));
}

// Through M (the default): a burst of misses turns as many decode
// instances mixed as the share missing asks (P->D first, lightest first,
// at most max_flips); slow decode turns a prefill instance mixed; with
// every instance mixed nothing flips again, whatever the window says.
TEST(PdPolicy, ViaMixedFlipsAsManyAsTheShortfallAndEndsAllMixed) {
  pd_config cfg;
  cfg.violation_windows = 1;
  cfg.min_decode = 1;
  cfg.max_flips = 4;
  std::vector<pd_load> loads = {
      inst(1, pd_pool::prefill, {500}),  inst(2, pd_pool::prefill, {500}),
      inst(3, pd_pool::decode, {}, 300), inst(4, pd_pool::decode, {}, 100),
      inst(5, pd_pool::decode, {}, 200), inst(6, pd_pool::prefill_to_decode, {}, 900)};
  flip_memory mem;
  // 3 of 4 prefills missing on 2 prefill instances: 2 more take prefill.
  auto fs = decide_flips(loads, {3, 4}, {}, cfg, 0, mem);
  ASSERT_EQ(fs.size(), 2u);
  EXPECT_EQ(fs[0].instance, 6u);  // P->D first
  EXPECT_EQ(fs[1].instance, 4u);  // then the lightest D
  for (const auto& f : fs) EXPECT_EQ(f.to, instance_role::mixed);
  // Every prefill missing: as many as there are prefill takers, at most
  // max_flips, and every D may go since mixed ones keep decoding.
  for (auto& l : loads)
    if (l.id == 6 || l.id == 4) l.pool = pd_pool::mixed;
  mem = {};
  cfg.max_flips = 1;
  EXPECT_EQ(decide_flips(loads, {8, 8}, {}, cfg, 10, mem).size(), 1u);
  cfg.max_flips = 8;
  mem = {};
  fs = decide_flips(loads, {8, 8}, {}, cfg, 10, mem);
  ASSERT_EQ(fs.size(), 2u);  // the two D left
  // Slow decode: a prefill instance turns mixed, the only one-kind
  // prefill instance included, since mixed ones prefill too.
  for (auto& l : loads)
    if (l.pool == pd_pool::decode) l.pool = pd_pool::mixed;
  loads[0].pool = pd_pool::prefill;
  loads[1].pool = pd_pool::mixed;
  loads[2].pool = pd_pool::decode;
  loads[2].token_interval_ms = 90;
  mem = {};
  fs = decide_flips(loads, {}, {0, 50}, cfg, 20, mem);
  ASSERT_EQ(fs.size(), 1u);
  EXPECT_EQ(fs[0].instance, 1u);
  EXPECT_EQ(fs[0].to, instance_role::mixed);
  // All mixed: nothing left to flip.
  for (auto& l : loads) l.pool = pd_pool::mixed;
  mem = {};
  EXPECT_TRUE(decide_flips(loads, {8, 8}, {0, 50}, cfg, 30, mem).empty());
}

// The report's way, straight between P and D, may also flip several in a
// window, keeping min_decode instances that only decode.
TEST(PdPolicy, StraightFlipsKeepTheDecodeMinimumWhenSeveralGo) {
  pd_config cfg;
  cfg.via_mixed = false;
  cfg.violation_windows = 1;
  cfg.min_decode = 2;
  cfg.max_flips = 8;
  std::vector<pd_load> loads = {inst(1, pd_pool::prefill, {500}), inst(2, pd_pool::decode, {}, 10),
                                inst(3, pd_pool::decode, {}, 20), inst(4, pd_pool::decode, {}, 30),
                                inst(5, pd_pool::decode, {}, 40)};
  flip_memory mem;
  auto fs = decide_flips(loads, {10, 10}, {}, cfg, 0, mem);
  ASSERT_EQ(fs.size(), 1u);  // one prefill taker missing everything: one more (not 2: min_decode)
  EXPECT_EQ(fs[0].to, instance_role::prefill);
  loads.push_back(inst(6, pd_pool::prefill, {500}));
  loads.push_back(inst(7, pd_pool::prefill, {500}));
  mem = {};
  fs = decide_flips(loads, {10, 10}, {}, cfg, 0, mem);
  ASSERT_EQ(fs.size(), 2u);  // three asked, two spare
  EXPECT_EQ(fs[0].instance, 2u);
  EXPECT_EQ(fs[1].instance, 3u);
}

TEST(ServiceMonitor, RollingWindowsAndPredictionError) {
  service_monitor mon(1.0);
  mon.ttft(1, 100, 80, 0.1);
  mon.ttft(1, 50, 100, 0.5);
  mon.step(1, 10, 0, 200, 0.4);
  mon.step(1, 4, 4, 30, 0.6);
  mon.step(1, 4, 4, 50, 0.8);
  auto w = mon.window(1, 0.9);
  EXPECT_DOUBLE_EQ(w.ttft_ms, 90);
  EXPECT_EQ(w.ttft_samples, 2);
  EXPECT_DOUBLE_EQ(w.token_interval_ms, 40);
  EXPECT_NEAR(w.busy, 0.28, 1e-9);
  EXPECT_NEAR(mon.ttft_mape(), (0.25 + 0.5) / 2, 1e-9);
  // A second later the old samples are out of the window.
  w = mon.window(1, 1.55);
  EXPECT_EQ(w.ttft_samples, 0);
  EXPECT_EQ(w.steps, 2);
  mon.placed(true);
  mon.placed(false);
  auto pw = mon.take_window();
  EXPECT_EQ(pw.prefills, 2);
  EXPECT_EQ(pw.unmet_prefills, 1);
  EXPECT_EQ(mon.take_window().prefills, 0);
}

}  // namespace
}  // namespace troupe
