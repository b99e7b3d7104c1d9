// Serving benchmark workloads (bench/bench_workload.hpp): dataset lengths
// and token ranges, seeding, shared prefixes, JSONL and trace files, class
// mix, and the gamma arrival process's rate and burstiness.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <stdexcept>

#include "bench/bench_workload.hpp"

namespace troupe::bench {
namespace {

std::string temp_file(const std::string& text) {
  char name[] = "/tmp/troupe_bench_XXXXXX";
  int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(name) << text;
  return name;
}

TEST(BenchWorkload, RandomLengthsFollowTheRangeRatio) {
  random_spec spec;
  spec.input_len = 100;
  spec.output_len = 20;
  spec.range_ratio = 0.5;
  spec.tokens = {100, 1000};
  auto reqs = random_dataset(500, spec, 7);
  ASSERT_EQ(reqs.size(), 500u);
  int in_min = 1 << 30, in_max = 0, out_min = 1 << 30, out_max = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    EXPECT_EQ(r.index, i);
    EXPECT_EQ(r.prompt_len, static_cast<int>(r.prompt_tokens.size()));
    for (int32_t t : r.prompt_tokens) {
      EXPECT_GE(t, 100);
      EXPECT_LT(t, 1000);
    }
    in_min = std::min(in_min, r.prompt_len), in_max = std::max(in_max, r.prompt_len);
    out_min = std::min(out_min, r.output_len), out_max = std::max(out_max, r.output_len);
  }
  // [floor(100 * 0.5), ceil(100 * 1.5)] and [10, 30]: 500 draws reach both ends' neighbourhood.
  EXPECT_GE(in_min, 50);
  EXPECT_LE(in_max, 150);
  EXPECT_LT(in_min, 55);
  EXPECT_GT(in_max, 145);
  EXPECT_GE(out_min, 10);
  EXPECT_LE(out_max, 30);
}

// bench/serve_vs_llamaserver.py's workload: inputs uniform in [64, 512] from
// L = 288, r = 224 / 288 and outputs in [32, 256] from L = 144, r = 112 / 144,
// with r as the script prints it (17 significant digits).
TEST(BenchWorkload, ComparisonLengthsAreExactlyTheIssueRanges) {
  random_spec spec;
  spec.input_len = 288;
  spec.output_len = 144;
  spec.range_ratio = std::stod("0.7777777777777778");
  spec.tokens = {256, 32000};
  auto reqs = random_dataset(4000, spec, 3);
  int in_min = 1 << 30, in_max = 0, out_min = 1 << 30, out_max = 0;
  for (const auto& r : reqs) {
    in_min = std::min(in_min, r.prompt_len), in_max = std::max(in_max, r.prompt_len);
    out_min = std::min(out_min, r.output_len), out_max = std::max(out_max, r.output_len);
  }
  EXPECT_EQ(in_min, 64);
  EXPECT_EQ(in_max, 512);
  EXPECT_EQ(out_min, 32);
  EXPECT_EQ(out_max, 256);
}

// The sweep probes one seeded schedule at several rates: the same gaps, scaled.
TEST(BenchWorkload, ArrivalsScaleWithTheRate) {
  auto slow = gamma_arrivals(50, 0.25, 1.0, 9), fast = gamma_arrivals(50, 2.0, 1.0, 9);
  ASSERT_EQ(slow.size(), fast.size());
  for (size_t i = 0; i < slow.size(); ++i) EXPECT_NEAR(fast[i] * 8, slow[i], 1e-9 * (1 + slow[i]));
}

TEST(BenchWorkload, RandomIsSeededAndExactWithoutRange) {
  random_spec spec;
  spec.input_len = 32;
  spec.output_len = 8;
  spec.prefix_len = 5;
  auto a = random_dataset(10, spec, 1), b = random_dataset(10, spec, 1),
       c = random_dataset(10, spec, 2);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].prompt_len, 37);
    EXPECT_EQ(a[i].output_len, 8);
    // The random prefix is shared by all requests.
    EXPECT_TRUE(std::equal(a[0].prompt_tokens.begin(), a[0].prompt_tokens.begin() + 5,
                           a[i].prompt_tokens.begin()));
  }
  EXPECT_NE(a[0].prompt_tokens, c[0].prompt_tokens);
  random_spec bad_ratio, bad_output, bad_tokens;
  bad_ratio.range_ratio = 1.0;
  bad_output.output_len = 0;
  bad_tokens.tokens = {10, 5};
  EXPECT_THROW(random_dataset(1, bad_ratio, 0), std::invalid_argument);
  EXPECT_THROW(random_dataset(1, bad_output, 0), std::invalid_argument);
  EXPECT_THROW(random_dataset(1, bad_tokens, 0), std::invalid_argument);
}

// A content salt keeps salt 0's lengths (prompt, prefix and output) and
// changes the token ids: a sweep's probes send new prompts of one size.
TEST(BenchWorkload, RandomContentSaltKeepsTheSizes) {
  random_spec spec;
  spec.input_len = 100;
  spec.output_len = 50;
  spec.range_ratio = 0.5;
  spec.prefix_len = 4;
  const auto plain = random_dataset(20, spec, 7);
  spec.content_salt = 3;
  const auto salted = random_dataset(20, spec, 7), again = random_dataset(20, spec, 7);
  spec.content_salt = 4;
  const auto other = random_dataset(20, spec, 7);
  size_t differ = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(salted[i].prompt_len, plain[i].prompt_len);
    EXPECT_EQ(salted[i].output_len, plain[i].output_len);
    EXPECT_EQ(other[i].prompt_len, plain[i].prompt_len);
    EXPECT_EQ(salted[i].prompt_tokens, again[i].prompt_tokens);
    differ += salted[i].prompt_tokens != plain[i].prompt_tokens;
    differ += other[i].prompt_tokens != salted[i].prompt_tokens;
  }
  EXPECT_EQ(differ, 2 * plain.size());
}

TEST(BenchWorkload, SharedPrefixGroups) {
  shared_prefix_spec spec;
  spec.num_groups = 3;
  spec.prefix_len = 16;
  spec.suffix_len = 4;
  spec.output_len = 7;
  auto reqs = shared_prefix_dataset(30, spec, 3);
  std::map<std::vector<int32_t>, int> groups;
  for (const auto& r : reqs) {
    ASSERT_EQ(r.prompt_len, 20);
    EXPECT_EQ(r.output_len, 7);
    ++groups[std::vector<int32_t>(r.prompt_tokens.begin(), r.prompt_tokens.begin() + 16)];
  }
  ASSERT_EQ(groups.size(), 3u);
  for (const auto& [prefix, count] : groups) EXPECT_EQ(count, 10);
  spec.num_groups = 0;
  EXPECT_THROW(shared_prefix_dataset(1, spec, 0), std::invalid_argument);
}

TEST(BenchWorkload, JsonlPrompts) {
  auto path = temp_file(
      "{\"prompt\": \"hello\", \"output_tokens\": 5}\n\n{\"prompt\": [1, 2, 3]}\n"
      "{\"prompt\": \"x\", \"max_tokens\": 2}\n");
  auto reqs = jsonl_dataset(path, 5, 9);
  ASSERT_EQ(reqs.size(), 5u);
  EXPECT_EQ(reqs[0].prompt_text, "hello");
  EXPECT_EQ(reqs[0].output_len, 5);
  EXPECT_EQ(reqs[0].prompt_len, 0);  // unknown until the server counts it
  EXPECT_EQ(reqs[1].prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(reqs[1].prompt_len, 3);
  EXPECT_EQ(reqs[1].output_len, 9);
  EXPECT_EQ(reqs[2].output_len, 2);
  EXPECT_EQ(reqs[3].prompt_text, "hello");  // cycles
  EXPECT_EQ(reqs[4].index, 4u);
  std::remove(path.c_str());

  auto bad = temp_file("{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n");
  try {
    jsonl_dataset(bad, 1, 1);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
  }
  std::remove(bad.c_str());
  EXPECT_THROW(jsonl_dataset("/nonexistent/x.jsonl", 1, 1), std::runtime_error);
}

// Each turn resends the history: the previous turn's prompt, a fixed-length
// answer and a new user message; turns follow each other, not the schedule.
TEST(BenchWorkload, MultiTurnHistoriesGrowTurnByTurn) {
  multi_turn_spec spec;
  spec.turns = 3;
  spec.system_len = 10;
  spec.user_len = 4;
  spec.answer_len = 5;
  spec.output_len = 7;
  spec.think_s = 0.25;
  auto reqs = multi_turn_dataset(7, spec, 3);  // two conversations and a first turn
  ASSERT_EQ(reqs.size(), 7u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    EXPECT_EQ(r.index, i);
    EXPECT_EQ(r.turn, int(i % 3));
    EXPECT_EQ(r.output_len, 7);
    EXPECT_EQ(r.prompt_len, 10 + 4 + r.turn * 9);
    if (r.turn == 0) {
      EXPECT_EQ(r.after, -1);
      EXPECT_EQ(r.think_s, 0);
      continue;
    }
    EXPECT_EQ(r.after, long(i) - 1);
    EXPECT_EQ(r.think_s, 0.25);
    const auto& prev = reqs[i - 1].prompt_tokens;
    EXPECT_TRUE(std::equal(prev.begin(), prev.end(), r.prompt_tokens.begin()));
  }
  // Conversations have their own system prompts unless shared.
  EXPECT_NE(
      std::vector<int32_t>(reqs[0].prompt_tokens.begin(), reqs[0].prompt_tokens.begin() + 10),
      std::vector<int32_t>(reqs[3].prompt_tokens.begin(), reqs[3].prompt_tokens.begin() + 10));
  spec.shared_system = true;
  reqs = multi_turn_dataset(4, spec, 3);
  EXPECT_EQ(
      std::vector<int32_t>(reqs[0].prompt_tokens.begin(), reqs[0].prompt_tokens.begin() + 10),
      std::vector<int32_t>(reqs[3].prompt_tokens.begin(), reqs[3].prompt_tokens.begin() + 10));
  spec.user_len = 0;
  EXPECT_THROW(multi_turn_dataset(4, spec, 3), std::invalid_argument);
}

TEST(BenchWorkload, ClassMix) {
  std::vector<bench_request> reqs(100);
  assign_classes(reqs, 0.3, 5);
  EXPECT_EQ(std::count_if(reqs.begin(), reqs.end(), [](auto& r) { return r.offline; }), 30);
  assign_classes(reqs, 0.0, 5);
  EXPECT_EQ(std::count_if(reqs.begin(), reqs.end(), [](auto& r) { return r.offline; }), 0);
  EXPECT_THROW(assign_classes(reqs, 1.5, 5), std::invalid_argument);
}

// Mean gap 1/rate; coefficient of variation of the gaps 1/sqrt(burstiness).
TEST(BenchWorkload, GammaArrivals) {
  for (double burst : {1.0, 0.25, 4.0}) {
    auto t = gamma_arrivals(20001, 50.0, burst, 11);
    EXPECT_EQ(t[0], 0.0);
    std::vector<double> gaps;
    for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
    double var = 0;
    for (double g : gaps) var += (g - mean) * (g - mean);
    const double cv = std::sqrt(var / gaps.size()) / mean;
    EXPECT_NEAR(mean, 1.0 / 50, 0.03 / 50) << burst;
    EXPECT_NEAR(cv, 1.0 / std::sqrt(burst), 0.05 / std::sqrt(burst)) << burst;
  }
  auto all_at_once = gamma_arrivals(5, infinite_rate, 1.0, 0);
  EXPECT_EQ(all_at_once, std::vector<double>(5, 0.0));
  EXPECT_EQ(gamma_arrivals(10, 3.0, 1.0, 4), gamma_arrivals(10, 3.0, 1.0, 4));
  EXPECT_THROW(gamma_arrivals(1, 0.0, 1.0, 0), std::invalid_argument);
  EXPECT_THROW(gamma_arrivals(1, 1.0, 0.0, 0), std::invalid_argument);
}

TEST(BenchWorkload, TraceReplay) {
  auto path = temp_file("10.5\n{\"timestamp\": 11}\n\n12.25\n");
  EXPECT_EQ(load_trace(path), (std::vector<double>{0.0, 0.5, 1.75}));
  std::remove(path.c_str());
  auto back = temp_file("2\n1\n");
  EXPECT_THROW(load_trace(back), std::runtime_error);
  std::remove(back.c_str());
  auto junk = temp_file("soon\n");
  EXPECT_THROW(load_trace(junk), std::runtime_error);
  std::remove(junk.c_str());
}

// The Azure LLM inference trace (issue 36 item 1): both releases' date
// formats, any column order and case, sizes and send times from the rows.
TEST(BenchWorkload, AzureTraceGivesSizesAndSendTimes) {
  const auto y2023 = temp_file(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.6805900,374,44\n"
      "2023-11-16 18:15:50.9951690,396,109\n"
      "2023-11-17 00:00:00.0000000,879,3\n");
  const token_space tokens{256, 32000};
  auto t = load_azure_trace(y2023, 10, tokens, 1);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].prompt_len, 374);
  EXPECT_EQ(t.requests[0].prompt_tokens.size(), 374u);
  EXPECT_EQ(t.requests[1].output_len, 109);
  EXPECT_EQ(t.requests[2].index, 2u);
  ASSERT_EQ(t.send_s.size(), 3u);
  EXPECT_DOUBLE_EQ(t.send_s[0], 0.0);
  EXPECT_NEAR(t.send_s[1], 4.314579, 1e-6);
  EXPECT_NEAR(t.send_s[2], 5 * 3600 + 44 * 60 + 13.31941, 1e-5);         // across midnight
  EXPECT_EQ(load_azure_trace(y2023, 2, tokens, 1).requests.size(), 2u);  // the first n
  // 2024: a time zone, other column order and case, quoted fields.
  const auto y2024 = temp_file(
      "\"generatedtokens\",\"TIMESTAMP\",\"contexttokens\"\r\n"
      "12,2024-05-10 00:00:00.009930+00:00,4808\r\n"
      "7,2024-05-10 02:00:01.009930+02:00,100\r\n");
  t = load_azure_trace(y2024, 10, tokens, 1);
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[0].prompt_len, 4808);
  EXPECT_EQ(t.requests[0].output_len, 12);
  EXPECT_NEAR(t.send_s[1], 1.0, 1e-6);  // 02:00:01+02:00 is 00:00:01 UTC
  const auto seconds = temp_file("TIMESTAMP,ContextTokens,GeneratedTokens\n10.5,5,5\n12,6,6\n");
  EXPECT_NEAR(load_azure_trace(seconds, 10, tokens, 1).send_s[1], 1.5, 1e-12);
  for (const char* bad : {"Time,ContextTokens,GeneratedTokens\n1,2,3\n",  // no TIMESTAMP
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n2,5,5\n1,5,5\n",  // back
                          "TIMESTAMP,ContextTokens,GeneratedTokens\nnoon,5,5\n",
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n1,5.5,5\n",
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n1,0,5\n",
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n1,5\n",
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n",  // no rows
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-01 00:00:00,5,5\n",
                          "TIMESTAMP,ContextTokens,GeneratedTokens\n1,5,5\n1e308,5,5\n"}) {
    const auto f = temp_file(bad);
    EXPECT_THROW(load_azure_trace(f, 10, tokens, 1), std::runtime_error) << bad;
    std::remove(f.c_str());
  }
  std::remove(y2023.c_str());
  std::remove(y2024.c_str());
  std::remove(seconds.c_str());
}

}  // namespace
}  // namespace troupe::bench
