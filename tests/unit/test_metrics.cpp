// runtime/service/metrics: the Prometheus text format, counters that only go up,
// cumulative histogram buckets, label escaping, and use from many threads.
#include "runtime/service/metrics.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace troupe {
namespace {

TEST(Metrics, RendersCountersAndGaugesWithHelpAndType) {
  metrics_registry m;
  m.counter_add("troupe_requests_total", "requests by finish", {{"finish", "stop"}});
  m.counter_add("troupe_requests_total", "requests by finish", {{"finish", "stop"}}, 2);
  m.counter_add("troupe_requests_total", "requests by finish", {{"finish", "length"}});
  m.gauge_set("troupe_kv_pages_free", "free pages", {}, 12);
  m.gauge_set("troupe_kv_pages_free", "free pages", {}, 10);
  const std::string text = m.render();
  EXPECT_NE(text.find("# HELP troupe_requests_total requests by finish\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE troupe_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_requests_total{finish=\"stop\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_requests_total{finish=\"length\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE troupe_kv_pages_free gauge\ntroupe_kv_pages_free 10\n"),
            std::string::npos);
  EXPECT_EQ(m.value("troupe_requests_total", {{"finish", "stop"}}), 3);
  EXPECT_EQ(m.value("troupe_nothing"), 0);
}

// Series of instances that left, and an instance's old role, are dropped
// (a probe found a removed node's gauges served forever); others stay.
TEST(Metrics, SeriesOfWhatLeftAreDropped) {
  metrics_registry m;
  for (const char* i : {"instance-1", "instance-2", "in\"st"}) {
    m.gauge_set("troupe_queue_length", "waiting", {{"instance", i}}, 3);
    m.counter_set("troupe_steps_total", "steps", {{"state", "x"}, {"instance", i}}, 7);
  }
  m.gauge_set("troupe_kv_tier_bytes", "bytes", {{"node", "a:1"}, {"tier", "host"}}, 5);
  m.gauge_set("troupe_requests_in_flight", "in flight", {}, 2);
  m.keep_only("instance", {"instance-2", "in\"st"});
  EXPECT_EQ(m.value("troupe_queue_length", {{"instance", "instance-1"}}), 0);
  EXPECT_EQ(m.value("troupe_queue_length", {{"instance", "instance-2"}}), 3);
  EXPECT_EQ(m.value("troupe_queue_length", {{"instance", "in\"st"}}), 3);
  EXPECT_EQ(m.value("troupe_steps_total", {{"state", "x"}, {"instance", "instance-2"}}), 7);
  EXPECT_EQ(m.render().find("instance-1"), std::string::npos) << m.render();
  EXPECT_EQ(m.value("troupe_kv_tier_bytes", {{"node", "a:1"}, {"tier", "host"}}), 5);
  EXPECT_EQ(m.value("troupe_requests_in_flight"), 2);
  m.keep_only("node", {});
  EXPECT_EQ(m.value("troupe_kv_tier_bytes", {{"node", "a:1"}, {"tier", "host"}}), 0);

  m.gauge_set("troupe_instance_role", "role", {{"instance", "instance-2"}, {"role", "prefill"}}, 1);
  m.gauge_set("troupe_instance_role", "role", {{"instance", "instance-2"}, {"role", "decode"}}, 1);
  m.keep_series("troupe_instance_role", {{{"instance", "instance-2"}, {"role", "decode"}}});
  EXPECT_EQ(m.value("troupe_instance_role", {{"instance", "instance-2"}, {"role", "prefill"}}), 0);
  EXPECT_EQ(m.value("troupe_instance_role", {{"instance", "instance-2"}, {"role", "decode"}}), 1);
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  metrics_registry m;
  const std::vector<double> b{0.1, 1, 10};
  for (double v : {0.05, 0.5, 0.7, 5.0, 100.0}) m.observe("troupe_ttft_seconds", "ttft", b, v);
  const std::string text = m.render();
  EXPECT_NE(text.find("# TYPE troupe_ttft_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_bucket{le=\"0.1\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_bucket{le=\"1\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_bucket{le=\"10\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_bucket{le=\"+Inf\"} 5\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_sum 106.25\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_count 5\n"), std::string::npos);
  EXPECT_EQ(m.value("troupe_ttft_seconds"), 5);
}

TEST(Metrics, DeclaredFamiliesAreListedBeforeAnyValue) {
  metrics_registry m;
  m.declare_counter("troupe_tokens_total", "tokens", false);
  m.declare_counter("troupe_requests_total", "requests", true);
  m.declare_histogram("troupe_ttft_seconds", "ttft", {0.1, 1});
  const std::string text = m.render();
  EXPECT_NE(text.find("# TYPE troupe_tokens_total counter\ntroupe_tokens_total 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE troupe_requests_total counter\n"), std::string::npos);
  EXPECT_EQ(text.find("\ntroupe_requests_total"), std::string::npos);  // no sample yet
  EXPECT_NE(text.find("troupe_ttft_seconds_bucket{le=\"1\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_ttft_seconds_count 0\n"), std::string::npos);
  m.observe("troupe_ttft_seconds", "ttft", {5}, 0.5);  // the declared bounds stay
  EXPECT_NE(m.render().find("troupe_ttft_seconds_bucket{le=\"1\"} 1\n"), std::string::npos);
}

TEST(Metrics, EscapesLabelValuesAndRefusesMisuse) {
  metrics_registry m;
  m.gauge_set("g", "a \\ help\nline", {{"k", "a\"b\\c\nd"}}, 1.5);
  const std::string text = m.render();
  EXPECT_NE(text.find("# HELP g a \\\\ help\\nline\n"), std::string::npos);
  EXPECT_NE(text.find("g{k=\"a\\\"b\\\\c\\nd\"} 1.5\n"), std::string::npos);
  EXPECT_THROW(m.counter_add("g", "", {}), std::invalid_argument);  // a gauge already
  EXPECT_THROW(m.counter_add("c", "", {}, -1), std::invalid_argument);
  EXPECT_THROW(m.gauge_set("bad name", "", {}, 1), std::invalid_argument);
  EXPECT_THROW(m.gauge_set("ok", "", {{"bad-label", "x"}}, 1), std::invalid_argument);
  EXPECT_THROW(m.observe("h", "", {1, 0.5}, 1), std::invalid_argument);
}

TEST(Metrics, CountsFromManyThreads) {
  metrics_registry m;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        m.counter_add("n_total", "n", {});
        m.observe("h", "h", latency_buckets(), 0.01);
        if (i % 100 == 0) (void)m.render();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(m.value("n_total"), 4000);
  EXPECT_EQ(m.value("h"), 4000);
}

}  // namespace
}  // namespace troupe
