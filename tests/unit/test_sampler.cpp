// Token sampling (runtime/engine/sampler.hpp): greedy choice, seeding, the
// distribution each truncation leaves (checked by chi-square over many
// draws), the penalties (measured exactly by probing greedy choices),
// logprobs, and parameter validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/engine/sampler.hpp"

namespace troupe {
namespace {

std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, double(v));
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  for (auto& x : p) x /= sum;
  return p;
}

// Logits whose softmax is probs (up to normalization).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? float(std::log(p)) : -1e9f);
  return l;
}

// probs restricted to keep (ids), renormalized.
std::vector<double> restricted(const std::vector<double>& probs, const std::set<int>& keep) {
  std::vector<double> out(probs.size(), 0.0);
  double sum = 0.0;
  for (int i : keep) sum += probs[i];
  for (int i : keep) out[i] = probs[i] / sum;
  return out;
}

std::vector<int> draw_counts(const sampling_params& p, const std::vector<float>& logits, int n,
                             const std::vector<int32_t>& history = {}) {
  // A draw depends on the seed and the position only, so the draws come
  // from n seeds at one position.
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    auto pi = p;
    pi.seed = p.seed + static_cast<uint64_t>(i);
    sampler s(pi);
    const int32_t t = s.sample(logits, history).token;
    EXPECT_GE(t, 0);
    EXPECT_LT(t, int32_t(logits.size()));
    if (t >= 0 && t < int32_t(logits.size())) ++counts[t];
  }
  return counts;
}

// Chi-square of counts against expected probabilities.  A token with
// probability 0 must never be drawn.  The bound is far out in the tail
// (p < 1e-5 for up to ~10 degrees of freedom); the draws are seeded, so the
// test is deterministic anyway.
void expect_distribution(const std::vector<int>& counts, const std::vector<double>& expected) {
  ASSERT_EQ(counts.size(), expected.size());
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0.0;
  int df = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] <= 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " must never be drawn";
      continue;
    }
    const double e = n * expected[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++df;
  }
  EXPECT_LT(chi2, 20.0 + 3.0 * std::max(df, 1)) << "degrees of freedom " << df;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  sampler s(sampling_params{});
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 5.0f, 3.0f, 5.0f, -2.0f}, {}).token, 1);
  EXPECT_EQ(s.sample(std::vector<float>{-3.0f, -1.0f, -2.0f}, {}).token, 1);
  EXPECT_EQ(s.sample(std::vector<float>{7.0f, 7.0f, 7.0f}, {}).token, 0);
  EXPECT_EQ(s.sample(std::vector<float>{0.0f, 0.0f, 0.5f, 0.5f}, {}).token, 2);
  EXPECT_EQ(s.sample(std::vector<float>{42.0f}, {}).token, 0);
  // Greedy ignores the seed and truncation settings.
  sampling_params p;
  p.seed = 99;
  p.top_k = 2;
  p.top_p = 0.5f;
  sampler s2(p);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(s2.sample(std::vector<float>{0.1f, 0.3f, 0.2f}, {}).token, 1);
}

// OpenAI's logit_bias: added before everything else, greedy or sampled;
// -100 bans a token, +100 forces it; logprobs stay those of the raw logits.
TEST(Sampler, LogitBiasIsAddedBeforeSamplingAndLogprobsStayRaw) {
  const std::vector<float> logits{1.0f, 5.0f, 3.0f, 4.0f};
  sampling_params p;
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(sampler(p).sample(logits, {}).token, 3) << "the argmax banned: the next best";
  p.logit_bias = {{0, 4.5f}};
  EXPECT_EQ(sampler(p).sample(logits, {}).token, 0) << "1 + 4.5 > 5";
  p.logit_bias = {{0, 3.9f}};
  EXPECT_EQ(sampler(p).sample(logits, {}).token, 1);
  // Sampled, with a seed: a forced token is always drawn, a banned one never.
  p.temperature = 1.0f;
  p.seed = 3;
  p.logit_bias = {{2, 100.0f}};
  sampler forced(p);
  for (size_t pos = 0; pos < 100; ++pos) EXPECT_EQ(forced.sample_at(logits, pos), 2);
  p.logit_bias = {{1, -100.0f}, {3, -100.0f}};
  sampler banned(p);
  for (size_t pos = 0; pos < 200; ++pos) {
    const int32_t t = banned.sample_at(logits, pos);
    EXPECT_TRUE(t == 0 || t == 2) << t;
  }
  // Penalties and bias together; logprobs from the unbiased logits.
  sampling_params q;
  q.logit_bias = {{0, 10.0f}};
  q.n_logprobs = 2;
  q.logprobs = true;
  q.presence_penalty = 1.0f;
  const auto r = sampler(q).sample(logits, std::vector<int32_t>{1});
  EXPECT_EQ(r.token, 0);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 1) << "the raw distribution's best";
  // Out of range biases are refused by validate; ids past the logits are
  // skipped (the vocabulary check is the request's).
  sampling_params bad;
  bad.logit_bias = {{0, 101.0f}};
  EXPECT_NE(validate(bad), "");
  bad.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(validate(bad), "");
  bad.logit_bias = {{99, 100.0f}};
  EXPECT_EQ(validate(bad), "");
  EXPECT_EQ(sampler(bad).sample(logits, {}).token, 1);
}

TEST(Sampler, TopKOneIsArgmax) {
  sampling_params p;
  p.temperature = 1.5f;
  p.top_k = 1;
  p.seed = 5;
  sampler s(p);
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(s.sample(std::vector<float>{0.1f, 0.3f, 0.29f, -1.0f}, {}).token, 1);
}

TEST(Sampler, SameSeedSameDrawsDifferentSeedsDiffer) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(500, std::vector<float>(16));
  for (auto& r : rows)
    for (auto& v : r) v = nd(rng);

  auto run = [&](uint64_t seed, int top_k, float top_p) {
    sampling_params p;
    p.temperature = 0.9f;
    p.top_k = top_k;
    p.top_p = top_p;
    p.seed = seed;
    sampler s(p);
    std::vector<int32_t> out;
    for (const auto& r : rows) out.push_back(s.sample(r, out).token);
    return out;
  };
  EXPECT_EQ(run(42, 0, 1.0f), run(42, 0, 1.0f));
  EXPECT_EQ(run(42, 8, 0.9f), run(42, 8, 0.9f));
  EXPECT_EQ(run(0, 0, 1.0f), run(0, 0, 1.0f));
  const auto a = run(42, 0, 1.0f), b = run(43, 0, 1.0f);
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_GT(differ, 250);  // independent draws agree well under half the time here
}

TEST(Sampler, TemperatureFrequenciesMatchSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  for (float t : {1.0f, 0.7f, 2.0f}) {
    sampling_params p;
    p.temperature = t;
    p.seed = 11;
    expect_distribution(draw_counts(p, logits, 100000), softmax(logits, t));
  }
}

TEST(Sampler, LowTemperatureConcentratesOnArgmax) {
  sampling_params p;
  p.temperature = 0.01f;
  p.seed = 3;
  const auto counts = draw_counts(p, {1.0f, 2.0f, 1.9f}, 2000);
  EXPECT_EQ(counts[1], 2000);
}

TEST(Sampler, TopKDrawsOnlyFromTheKBest) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> logits(50);
  for (auto& v : logits) v = nd(rng);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int k : {1, 3, 5, 10}) {
    sampling_params p;
    p.temperature = 1.0f;
    p.top_k = k;
    p.seed = 100 + k;
    const std::set<int> best(order.begin(), order.begin() + k);
    expect_distribution(draw_counts(p, logits, 50000), restricted(softmax(logits), best));
  }
  // top_k above the vocabulary size is no restriction.
  sampling_params p;
  p.temperature = 1.0f;
  p.top_k = 1000;
  p.seed = 1;
  const std::vector<float> small = {0.0f, 0.5f, 1.0f};
  expect_distribution(draw_counts(p, small, 50000), softmax(small));
}

TEST(Sampler, TopPDrawsFromTheSmallestPrefixReachingP) {
  // Ids deliberately out of probability order.
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  const auto logits = logits_of(probs);
  struct tc {
    float top_p;
    std::set<int> keep;
  };
  // Sorted masses: 0.4 (id 1), 0.3 (3), 0.15 (4), 0.1 (0), 0.05 (2);
  // cumulative 0.4, 0.7, 0.85, 0.95, 1.
  for (const tc& c : {tc{0.35f, {1}}, tc{0.5f, {1, 3}}, tc{0.8f, {1, 3, 4}}, tc{0.9f, {1, 3, 4, 0}},
                      tc{0.99f, {0, 1, 2, 3, 4}}}) {
    sampling_params p;
    p.temperature = 1.0f;
    p.top_p = c.top_p;
    p.seed = 7;
    SCOPED_TRACE(c.top_p);
    expect_distribution(draw_counts(p, logits, 50000), restricted(probs, c.keep));
  }
}

TEST(Sampler, TopPAppliesToTheTemperatureScaledDistribution) {
  // At T = 0.5 the masses become p^2 normalized: 0.658, 0.237, 0.105, so
  // top_p = 0.6 keeps only the best token (at T = 1 it would keep two).
  const std::vector<double> probs = {0.5, 0.3, 0.2};
  sampling_params p;
  p.temperature = 0.5f;
  p.top_p = 0.6f;
  p.seed = 8;
  const auto counts = draw_counts(p, logits_of(probs), 5000);
  EXPECT_EQ(counts[0], 5000);
}

TEST(Sampler, MinPExcludesTokensBelowTheScaledMax) {
  const std::vector<double> probs = {0.05, 0.5, 0.09, 0.2, 0.06, 0.1};
  const auto logits = logits_of(probs);
  struct tc {
    float min_p;
    std::set<int> keep;
  };
  // floor = 0.5 * min_p
  for (const tc& c : {tc{0.15f, {1, 2, 3, 5}}, tc{0.3f, {1, 3}}, tc{0.5f, {1}},
                      tc{0.01f, {0, 1, 2, 3, 4, 5}}, tc{1.0f, {1}}}) {
    sampling_params p;
    p.temperature = 1.0f;
    p.min_p = c.min_p;
    p.seed = 9;
    SCOPED_TRACE(c.min_p);
    expect_distribution(draw_counts(p, logits, 50000), restricted(probs, c.keep));
  }
}

TEST(Sampler, TruncationsCombine) {
  const std::vector<double> probs = {0.3, 0.25, 0.2, 0.15, 0.06, 0.04};
  const auto logits = logits_of(probs);
  sampling_params p;
  p.temperature = 1.0f;
  p.seed = 10;
  p.top_k = 4;      // {0, 1, 2, 3}
  p.top_p = 0.95f;  // within top-k masses 0.33, 0.28, 0.22, 0.17 -> all four
  p.min_p = 0.6f;   // floor 0.18 of top-k mass -> {0, 1, 2}
  expect_distribution(draw_counts(p, logits, 50000), restricted(probs, {0, 1, 2}));
  p.top_p = 0.5f;  // cumulative 0.33, 0.61 -> {0, 1}
  expect_distribution(draw_counts(p, logits, 50000), restricted(probs, {0, 1}));
}

// The logit a token has after penalties, measured with greedy choices: a
// competitor (the last id, never in the history) wins exactly when its logit
// exceeds the target's penalized logit.  Bisection to 1e-5.
float penalized_logit(sampling_params p, float logit, int32_t target,
                      const std::vector<int32_t>& history) {
  p.temperature = 0.0f;
  const int vocab = 32;
  std::vector<float> logits(vocab, -1000.0f);
  logits[target] = logit;
  sampler s(p);
  double lo = -100.0, hi = 100.0;  // target wins at lo, competitor at hi
  while (hi - lo > 1e-5) {
    const double mid = (lo + hi) / 2;
    logits[vocab - 1] = float(mid);
    if (s.sample(logits, history).token == target)
      lo = mid;
    else
      hi = mid;
  }
  return float((lo + hi) / 2);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  sampling_params p;
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> hist = {3, 5, 3};
  EXPECT_NEAR(penalized_logit(p, 3.0f, 3, hist), 1.5f, 1e-4);
  EXPECT_NEAR(penalized_logit(p, -1.0f, 3, hist), -2.0f, 1e-4);
  EXPECT_NEAR(penalized_logit(p, 0.0f, 5, hist), 0.0f, 1e-4);
  EXPECT_NEAR(penalized_logit(p, 3.0f, 4, hist), 3.0f, 1e-4);  // not seen
  p.repetition_penalty = 0.5f;                                 // < 1 favours seen tokens
  EXPECT_NEAR(penalized_logit(p, 3.0f, 5, hist), 6.0f, 1e-4);
  EXPECT_NEAR(penalized_logit(p, -1.0f, 5, hist), -0.5f, 1e-4);
  // Applied once per token, however often it was seen.
  p.repetition_penalty = 1.5f;
  EXPECT_NEAR(penalized_logit(p, 3.0f, 3, {3, 3, 3, 3}), 2.0f, 1e-4);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesSubtract) {
  sampling_params p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const std::vector<int32_t> hist = {2, 7, 2, 2, 9};
  // logit - count * frequency - presence (if count > 0)
  EXPECT_NEAR(penalized_logit(p, 1.0f, 2, hist), 1.0f - 3 * 0.25f - 0.5f, 1e-4);
  EXPECT_NEAR(penalized_logit(p, 1.0f, 7, hist), 1.0f - 0.25f - 0.5f, 1e-4);
  EXPECT_NEAR(penalized_logit(p, 1.0f, 4, hist), 1.0f, 1e-4);
  // Negative penalties encourage.
  p.presence_penalty = -1.0f;
  p.frequency_penalty = 0.0f;
  EXPECT_NEAR(penalized_logit(p, 1.0f, 2, hist), 2.0f, 1e-4);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = -0.5f;
  EXPECT_NEAR(penalized_logit(p, 1.0f, 2, hist), 2.5f, 1e-4);
  // With a repetition penalty too: divide first, then subtract.
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 1.0f;
  EXPECT_NEAR(penalized_logit(p, 4.0f, 7, hist), 4.0f / 2 - 1 - 1, 1e-4);
  EXPECT_NEAR(penalized_logit(p, 4.0f, 2, hist), 4.0f / 2 - 3 - 1, 1e-4);
}

TEST(Sampler, PenaltyWindowSeesOnlyTheLastN) {
  sampling_params p;
  p.frequency_penalty = 1.0f;
  const std::vector<int32_t> hist = {6, 6, 1, 6, 1, 1};
  auto at = [&](int last_n) {
    p.penalty_last_n = last_n;
    return penalized_logit(p, 10.0f, 6, hist);
  };
  EXPECT_NEAR(at(0), 10.0f, 1e-4);  // 0: no window, no penalty
  EXPECT_NEAR(at(1), 10.0f, 1e-4);
  EXPECT_NEAR(at(2), 10.0f, 1e-4);
  EXPECT_NEAR(at(3), 9.0f, 1e-4);
  EXPECT_NEAR(at(5), 8.0f, 1e-4);
  EXPECT_NEAR(at(6), 7.0f, 1e-4);
  EXPECT_NEAR(at(100), 7.0f, 1e-4);
  EXPECT_NEAR(at(-1), 7.0f, 1e-4);  // -1: the whole history
  // The default window is 64 tokens.
  sampling_params d;
  d.presence_penalty = 1.0f;
  std::vector<int32_t> long_hist(64, 1);
  long_hist.insert(long_hist.begin(), 6);
  EXPECT_NEAR(penalized_logit(d, 10.0f, 6, long_hist), 10.0f, 1e-4);
  long_hist.erase(long_hist.begin() + 1);
  EXPECT_NEAR(penalized_logit(d, 10.0f, 6, long_hist), 9.0f, 1e-4);
}

TEST(Sampler, PenaltiesIgnoreOutOfRangeHistory) {
  sampling_params p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 1.0f;
  EXPECT_NEAR(penalized_logit(p, 3.0f, 0, {-1, 1000, 32, 0}), 0.5f, 1e-4);
}

TEST(Sampler, PenaltiesShapeTheSampledDistribution) {
  // Two equal logits; a presence penalty of ln 3 on token 0 makes it 1:3.
  sampling_params p;
  p.temperature = 1.0f;
  p.presence_penalty = float(std::log(3.0));
  p.seed = 12;
  expect_distribution(draw_counts(p, {0.0f, 0.0f}, 50000, {0, 0}), {0.25, 0.75});
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
  auto p = softmax(logits);
  for (auto& x : p) x = std::log(x);
  return p;
}

TEST(Sampler, LogprobsAreOfTheUnmodifiedLogits) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  sampling_params p;
  p.temperature = 0.8f;
  p.top_k = 4;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.logprobs = true;
  p.n_logprobs = 5;
  p.seed = 4;
  sampler s(p);
  std::vector<int32_t> hist = {1, 2, 3};
  for (int it = 0; it < 200; ++it) {
    std::vector<float> logits(40);
    for (auto& v : logits) v = nd(rng);
    const auto lp = log_softmax(logits);
    const auto r = s.sample(logits, hist);
    ASSERT_GE(r.token, 0);
    EXPECT_NEAR(r.logprob, lp[r.token], 1e-4);
    ASSERT_EQ(r.top.size(), 5u);
    std::vector<int> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return lp[a] > lp[b]; });
    for (size_t i = 0; i < r.top.size(); ++i) {
      EXPECT_EQ(r.top[i].token, order[i]);
      EXPECT_NEAR(r.top[i].logprob, lp[order[i]], 1e-4);
      if (i > 0) {
        EXPECT_GE(r.top[i - 1].logprob, r.top[i].logprob);
      }
    }
    hist.push_back(r.token);
  }
}

TEST(Sampler, LogprobsUnderGreedyWithPenalties) {
  // The penalty moves the choice to token 1; its logprob is still the
  // model's own.
  sampling_params p;
  p.repetition_penalty = 2.0f;
  p.logprobs = true;
  const std::vector<float> logits = {3.0f, 2.0f, 0.0f};
  sampler s(p);
  const auto r = s.sample(logits, std::vector<int32_t>{0});
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprob, log_softmax(logits)[1], 1e-5);
  EXPECT_TRUE(r.top.empty());
}

TEST(Sampler, LogprobsOptions) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f};
  {
    sampler s(sampling_params{});
    const auto r = s.sample(logits, {});
    EXPECT_EQ(r.token, 1);
    EXPECT_TRUE(r.top.empty());
  }
  {
    // n_logprobs implies logprobs; more than the vocabulary gives all of it.
    sampling_params p;
    p.n_logprobs = 10;
    sampler s(p);
    const auto r = s.sample(logits, {});
    const auto lp = log_softmax(logits);
    EXPECT_NEAR(r.logprob, lp[1], 1e-5);
    ASSERT_EQ(r.top.size(), 3u);
    EXPECT_EQ(r.top[0].token, 1);
    EXPECT_EQ(r.top[1].token, 0);
    EXPECT_EQ(r.top[2].token, 2);
    EXPECT_NEAR(r.top[2].logprob, lp[2], 1e-5);
  }
  {
    // Large logits do not overflow.
    sampling_params p;
    p.logprobs = true;
    sampler s(p);
    const auto r = s.sample(std::vector<float>{1000.0f, 999.0f}, {});
    EXPECT_NEAR(r.logprob, -std::log1p(std::exp(-1.0)), 1e-4);
  }
}

TEST(Sampler, ValidateAcceptsDefaultsAndBounds) {
  EXPECT_EQ(validate(sampling_params{}), "");
  sampling_params p;
  p.temperature = 100.0f;
  p.top_k = 1000000;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.repetition_penalty = 10.0f;
  p.presence_penalty = -10.0f;
  p.frequency_penalty = 10.0f;
  p.penalty_last_n = -1;
  p.n_logprobs = 20;
  p.seed = ~uint64_t(0);
  EXPECT_EQ(validate(p), "");
  p.min_p = 0.0f;
  p.top_p = 1e-3f;
  p.repetition_penalty = 1e-3f;
  p.penalty_last_n = 0;
  EXPECT_EQ(validate(p), "");
}

TEST(Sampler, ValidateRejectsBadValuesNamingTheParameter) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct tc {
    const char* name;
    void (*set)(sampling_params&, float);
    std::vector<float> bad;
  };
  const std::vector<tc> cases = {
      {"temperature",
       [](sampling_params& p, float v) { p.temperature = v; },
       {-0.1f, nan, inf, 1e9f}},
      {"top_k", [](sampling_params& p, float v) { p.top_k = int(v); }, {-1.0f, -100.0f}},
      {"top_p", [](sampling_params& p, float v) { p.top_p = v; }, {0.0f, -0.5f, 1.5f, nan, inf}},
      {"min_p", [](sampling_params& p, float v) { p.min_p = v; }, {-0.1f, 1.5f, nan, -inf}},
      {"repetition_penalty",
       [](sampling_params& p, float v) { p.repetition_penalty = v; },
       {0.0f, -1.0f, nan, inf, 1e6f}},
      {"presence_penalty",
       [](sampling_params& p, float v) { p.presence_penalty = v; },
       {nan, inf, -inf, 1e6f, -1e6f, 10.5f}},
      {"frequency_penalty",
       [](sampling_params& p, float v) { p.frequency_penalty = v; },
       {nan, inf, -inf, 1e6f, -1e6f, -10.5f}},
      {"penalty_last_n",
       [](sampling_params& p, float v) { p.penalty_last_n = int(v); },
       {-2.0f, -1000.0f}},
      {"n_logprobs",
       [](sampling_params& p, float v) { p.n_logprobs = int(v); },
       {-1.0f, 21.0f, 1e6f}},
  };
  for (const auto& c : cases) {
    for (float v : c.bad) {
      sampling_params p;
      c.set(p, v);
      const std::string msg = validate(p);
      EXPECT_NE(msg.find(c.name), std::string::npos) << c.name << " = " << v << ": " << msg;
    }
  }
}

}  // namespace
}  // namespace troupe
