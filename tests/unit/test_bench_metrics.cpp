// Serving benchmark metrics (bench/bench_metrics.hpp) on synthetic
// timestamp streams whose answers follow by hand from vLLM's definitions.
#include <gtest/gtest.h>

#include <stdexcept>

#include "bench/bench_metrics.hpp"

namespace troupe::bench {
namespace {

request_record ok(double send, std::vector<double> times, std::vector<int> tokens, int prompt) {
  request_record r;
  r.send_time = send;
  r.chunk_times = std::move(times);
  r.chunk_tokens = std::move(tokens);
  r.end_time = r.chunk_times.back();
  r.prompt_tokens = prompt;
  for (int t : r.chunk_tokens) r.output_tokens += t;
  r.success = true;
  return r;
}

std::vector<request_record> sample() {
  request_record failed;
  failed.send_time = 0.2;
  failed.end_time = 0.3;
  failed.prompt_tokens = 100;
  failed.error_code = "connect";
  return {
      ok(0.0, {0.1, 0.2, 0.3, 0.5}, {1, 1, 1, 1}, 10),  // ttft 100, e2e 500, tpot 133.3
      ok(1.0, {1.3, 1.5}, {2, 3}, 20),                  // ttft 300, e2e 500, tpot 50
      failed, ok(2.0, {2.2}, {1}, 30),                  // ttft 200, e2e 200, one token: no tpot
  };
}

TEST(BenchMetrics, PercentileMatchesNumpyLinear) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile({4, 3, 2, 1}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile({5}, 90), 5);
  EXPECT_DOUBLE_EQ(percentile({}, 90), 0);
}

TEST(BenchMetrics, PerRequestDefinitions) {
  auto r = sample()[0];
  EXPECT_DOUBLE_EQ(r.ttft(), 0.1);
  EXPECT_DOUBLE_EQ(r.e2e(), 0.5);
  EXPECT_NEAR(r.tpot(), 0.4 / 3, 1e-12);
  auto gaps = r.itls();
  ASSERT_EQ(gaps.size(), 3u);
  EXPECT_NEAR(gaps[0], 0.1, 1e-12);
  EXPECT_NEAR(gaps[2], 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(sample()[3].tpot(), 0.0);
}

TEST(BenchMetrics, RunTotals) {
  auto m = compute_metrics(sample(), 4.0);
  EXPECT_EQ(m.requests, 4u);
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.total_input_tokens, 60);  // the failed request's prompt is not counted
  EXPECT_EQ(m.total_output_tokens, 10);
  EXPECT_DOUBLE_EQ(m.request_throughput, 0.75);
  EXPECT_DOUBLE_EQ(m.output_throughput, 2.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 17.5);
  EXPECT_EQ(m.errors.at("connect"), 1u);
  EXPECT_EQ(m.max_concurrency, 2u);
  EXPECT_DOUBLE_EQ(m.request_goodput, 0.0);  // no SLOs given
}

TEST(BenchMetrics, Distributions) {
  auto m = compute_metrics(sample(), 4.0);
  EXPECT_EQ(m.ttft_ms.count, 3u);
  EXPECT_NEAR(m.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft_ms.std, 81.64965809277261, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p90, 280, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p99, 298, 1e-9);
  EXPECT_EQ(m.tpot_ms.count, 2u);  // the one-token request has no TPOT
  EXPECT_NEAR(m.tpot_ms.mean, (400.0 / 3 + 50) / 2, 1e-9);
  EXPECT_EQ(m.itl_ms.count, 4u);  // 3 gaps + 1 gap; a 2-token chunk is one gap
  EXPECT_NEAR(m.itl_ms.mean, 150, 1e-9);
  EXPECT_NEAR(m.itl_ms.p90, 200, 1e-9);
  EXPECT_NEAR(m.e2el_ms.mean, 400, 1e-9);
  EXPECT_NEAR(m.e2el_ms.max, 500, 1e-9);
}

TEST(BenchMetrics, EmptyRunReadsZero) {
  auto m = compute_metrics({}, 1.0);
  EXPECT_EQ(m.completed, 0u);
  EXPECT_DOUBLE_EQ(m.ttft_ms.mean, 0);
  EXPECT_DOUBLE_EQ(m.itl_ms.p99, 0);
}

TEST(BenchMetrics, Goodput) {
  EXPECT_DOUBLE_EQ(compute_metrics(sample(), 4.0, slo::parse({"ttft:250"})).request_goodput, 0.5);
  // One-token requests count TPOT as 0, so D passes any TPOT goal.
  EXPECT_DOUBLE_EQ(
      compute_metrics(sample(), 4.0, slo::parse({"ttft:250", "tpot:100"})).request_goodput, 0.25);
  EXPECT_EQ(compute_metrics(sample(), 4.0, slo::parse({"e2el:300"})).good_completed, 1u);
  EXPECT_EQ(compute_metrics(sample(), 4.0, slo::parse({"e2el:500"})).good_completed, 3u);
}

TEST(BenchMetrics, SloParseErrors) {
  EXPECT_THROW(slo::parse({"ttft"}), std::invalid_argument);
  EXPECT_THROW(slo::parse({"ttft:abc"}), std::invalid_argument);
  EXPECT_THROW(slo::parse({"ttft:5x"}), std::invalid_argument);
  EXPECT_THROW(slo::parse({"itl:5"}), std::invalid_argument);
  EXPECT_THROW(slo::parse({"ttft:-1"}), std::invalid_argument);
  auto s = slo::parse({"tpot:12.5"});
  EXPECT_DOUBLE_EQ(*s.tpot_ms, 12.5);
  EXPECT_FALSE(s.ttft_ms.has_value());
}

TEST(BenchMetrics, JsonAndSummary) {
  auto m = compute_metrics(sample(), 4.0, slo::parse({"ttft:250"}));
  auto j = to_json(m);
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["errors"]["connect"], 1);
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["p90"].get<double>(), 280);
  auto text = format_summary(m, slo::parse({"ttft:250"}));
  EXPECT_NE(text.find("Request goodput (req/s):"), std::string::npos);
  EXPECT_NE(text.find("P99 ITL (ms):"), std::string::npos);
  EXPECT_NE(text.find("connect:"), std::string::npos);
}

}  // namespace
}  // namespace troupe::bench
