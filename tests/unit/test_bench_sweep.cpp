// The rate sweep's policy (bench/bench_sweep.hpp), driven by synthetic
// monotone pass/fail functions: the threshold is found within the
// precision, a failing start halves the rate, all-fail gives no answer, all-pass stops at the cap,
// the probe limit holds; and the sweep's argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <stdexcept>

#include "bench/bench_sweep.hpp"

namespace troupe::bench {
namespace {

// Runs the sweep against a monotone (or any) pass/fail function of the rate.
std::vector<sweep_probe> sweep_with(const sweep_spec& spec,
                                    const std::function<bool(double)>& passes) {
  size_t calls = 0;
  auto probes = run_sweep(spec, [&](double rate) {
    ++calls;
    const bool ok = passes(rate);
    return sweep_probe{0, ok ? 1.0 : 0.0, ok};
  });
  EXPECT_EQ(calls, probes.size());
  return probes;
}

TEST(BenchSweep, FindsTheThresholdWithinThePrecision) {
  for (double threshold : {0.3, 0.77, 1.0, 3.3, 5.9, 40.0}) {
    sweep_spec spec;
    spec.start = 0.25;
    spec.max_probes = 100;
    spec.precision = 0.05;
    auto probes = sweep_with(spec, [&](double r) { return r <= threshold; });
    auto best = sweep_answer(probes);
    ASSERT_TRUE(best) << threshold;
    EXPECT_LE(*best, threshold);
    EXPECT_GE(*best, threshold / 1.05) << threshold;
    // Doubling first: the probes before the first fail are start * 2^k.
    for (size_t i = 0; i < probes.size() && probes[i].pass; ++i)
      EXPECT_DOUBLE_EQ(probes[i].rate, 0.25 * std::pow(2.0, static_cast<double>(i)));
  }
}

TEST(BenchSweep, BisectsGeometrically) {
  sweep_spec spec;
  spec.start = 1;
  spec.precision = 0.1;
  std::vector<sweep_probe> probes = {{1, 1, true}, {2, 1, true}, {4, 0.5, false}};
  auto next = next_sweep_rate(probes, spec);
  ASSERT_TRUE(next);
  EXPECT_DOUBLE_EQ(*next, std::sqrt(8.0));
  // hi / lo - 1 = 0.09 < 0.1: done.
  probes = {{1, 1, true}, {1.09, 0.2, false}};
  EXPECT_FALSE(next_sweep_rate(probes, spec));
  EXPECT_DOUBLE_EQ(*sweep_answer(probes), 1.0);
}

TEST(BenchSweep, AllFailHalvesUntilTheProbesRunOutWithNoAnswer) {
  sweep_spec spec;
  spec.max_probes = 4;
  auto probes = sweep_with(spec, [](double) { return false; });
  ASSERT_EQ(probes.size(), 4u);
  for (size_t i = 0; i < probes.size(); ++i)
    EXPECT_DOUBLE_EQ(probes[i].rate, spec.start / std::pow(2.0, static_cast<double>(i)));
  EXPECT_FALSE(sweep_answer(probes));
}

TEST(BenchSweep, FailingStartHalvesThenBisects) {
  sweep_spec spec;
  spec.start = 1;
  spec.max_probes = 100;
  spec.precision = 0.05;
  const double threshold = 0.3;
  auto probes = sweep_with(spec, [&](double r) { return r <= threshold; });
  // 1 and 0.5 fail, 0.25 passes, then bisection between 0.25 and 0.5.
  ASSERT_GE(probes.size(), 4u);
  EXPECT_DOUBLE_EQ(probes[1].rate, 0.5);
  EXPECT_DOUBLE_EQ(probes[2].rate, 0.25);
  EXPECT_DOUBLE_EQ(probes[3].rate, std::sqrt(0.125));
  auto best = sweep_answer(probes);
  ASSERT_TRUE(best);
  EXPECT_LE(*best, threshold);
  EXPECT_GE(*best, threshold / 1.05);
}

TEST(BenchSweep, AllPassStopsAtTheCap) {
  sweep_spec spec;
  spec.start = 0.25;
  spec.max = 3;
  spec.max_probes = 20;
  auto probes = sweep_with(spec, [](double) { return true; });
  // 0.25, 0.5, 1, 2, then 3 (capped), then stop.
  ASSERT_EQ(probes.size(), 5u);
  EXPECT_DOUBLE_EQ(probes.back().rate, 3.0);
  EXPECT_DOUBLE_EQ(*sweep_answer(probes), 3.0);
  // A start at the cap probes once.
  spec.start = 3;
  EXPECT_EQ(sweep_with(spec, [](double) { return true; }).size(), 1u);
}

TEST(BenchSweep, ProbeLimitHolds) {
  sweep_spec spec;
  spec.start = 0.25;
  spec.max_probes = 3;
  auto probes = sweep_with(spec, [](double) { return true; });
  ASSERT_EQ(probes.size(), 3u);
  EXPECT_DOUBLE_EQ(*sweep_answer(probes), 1.0);
  spec.max_probes = 5;
  spec.precision = 1e-6;
  probes = sweep_with(spec, [](double r) { return r < 0.7; });
  EXPECT_EQ(probes.size(), 5u);  // 0.25, 0.5, 1 (fail), 0.707 (fail), 0.595
  EXPECT_LT(*sweep_answer(probes), 0.7);
  spec.max_probes = 1;
  EXPECT_EQ(sweep_with(spec, [](double) { return true; }).size(), 1u);
}

TEST(BenchSweep, NoisyFailsBelowTheBestPassAreIgnored) {
  sweep_spec spec;
  spec.start = 1;
  spec.precision = 0.1;
  // A fail at 1, a pass at 2 (noise): the policy keeps going up from 2.
  std::vector<sweep_probe> probes = {{2, 1, true}, {1, 0.5, false}};
  EXPECT_DOUBLE_EQ(*next_sweep_rate(probes, spec), 4.0);
}

TEST(BenchSweep, TargetCountsSentRequests) {
  EXPECT_TRUE(meets_target(9, 10, 0.9));
  EXPECT_FALSE(meets_target(8, 10, 0.9));
  EXPECT_TRUE(meets_target(22, 24, 0.9));
  EXPECT_FALSE(meets_target(21, 24, 0.9));
  EXPECT_TRUE(meets_target(10, 10, 1.0));
  EXPECT_FALSE(meets_target(9, 10, 1.0));
  EXPECT_FALSE(meets_target(0, 0, 0.5));
}

TEST(BenchSweep, BadSpecsNameTheOption) {
  auto message = [](sweep_spec s) {
    try {
      s.check();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  sweep_spec ok;
  EXPECT_EQ(message(ok), "");
  auto s = ok;
  s.target = 0;
  EXPECT_NE(message(s).find("--goodput-target"), std::string::npos);
  s = ok, s.target = 1.5;
  EXPECT_NE(message(s).find("--goodput-target"), std::string::npos);
  s = ok, s.start = 0;
  EXPECT_NE(message(s).find("--sweep-start"), std::string::npos);
  s = ok, s.start = INFINITY;
  EXPECT_NE(message(s).find("--sweep-start"), std::string::npos);
  s = ok, s.max = 0.1;
  EXPECT_NE(message(s).find("--sweep-max"), std::string::npos);
  s = ok, s.max_probes = 0;
  EXPECT_NE(message(s).find("--sweep-steps"), std::string::npos);
  s = ok, s.precision = 0;
  EXPECT_NE(message(s).find("--sweep-precision"), std::string::npos);
}

TEST(BenchSweep, SweepWithoutGoodputIsRefused) {
  try {
    check_sweep(sweep_spec{}, slo{});
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--sweep needs --goodput"), std::string::npos);
  }
  EXPECT_NO_THROW(check_sweep(sweep_spec{}, slo::parse({"ttft:500"})));
  sweep_spec bad;
  bad.target = 2;
  EXPECT_THROW(check_sweep(bad, slo::parse({"tpot:50"})), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::bench
