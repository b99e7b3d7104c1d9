// Step overlap's device side (runtime/engine/step_overlap.hpp): the device draws
// the very token the instance's sampler will (greedy and seeded sampling,
// at any position), refuses what it cannot draw, and fills a step's
// placeholders only from the draws of the step it ran just before.
#include <gtest/gtest.h>

#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/engine/sampler.hpp"
#include "runtime/engine/step_overlap.hpp"

namespace troupe {
namespace {

constexpr int32_t k_vocab = 300;

forward_result random_logits(int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 3.0f);
  forward_result r;
  r.n_vocab = k_vocab;
  r.logits.resize(size_t(rows) * k_vocab);
  for (auto& v : r.logits) v = n(rng);
  return r;
}

std::vector<sampling_params> drawable_params() {
  std::vector<sampling_params> out(5);
  out[1].temperature = 0.8f;
  out[1].seed = 11;
  out[2].temperature = 1.0f;
  out[2].top_k = 20;
  out[2].min_p = 0.05f;
  out[2].seed = 5;
  out[3].temperature = 0.7f;
  out[3].top_p = 0.9f;
  out[3].seed = 99;
  out[3].logprobs = true;
  out[3].n_logprobs = 4;
  out[4].temperature = 1.5f;
  out[4].seed = 3;
  return out;
}

TEST(StepOverlap, TheDeviceDrawsWhatTheSamplerSamples) {
  const auto params = drawable_params();
  forward_result r = random_logits(static_cast<int>(params.size()), 1);
  for (int64_t position : {0, 1, 17, 513, 4096}) {
    forward_batch b;
    for (size_t i = 0; i < params.size(); ++i)
      b.presample.push_back({static_cast<int32_t>(i), params[i], position});
    const auto drawn = presample(b, r);
    ASSERT_EQ(drawn.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      // The instance samples with the sequence's real history: its length
      // is what matters, not its tokens.
      std::vector<int32_t> history(static_cast<size_t>(position), 7);
      sampler s(params[i]);
      const std::span<const float> row(r.logits.data() + i * k_vocab, k_vocab);
      EXPECT_EQ(drawn[i], s.sample(row, history).token)
          << "params " << i << " position " << position;
    }
  }
}

TEST(StepOverlap, SeededDrawsDependOnThePosition) {
  sampling_params p;
  p.temperature = 1.0f;
  p.seed = 42;
  forward_result r = random_logits(1, 2);
  std::vector<int32_t> seen;
  for (int64_t pos = 0; pos < 32; ++pos) {
    forward_batch b;
    b.presample.push_back({0, p, pos});
    seen.push_back(presample(b, r).at(0));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 3)
      << "the draw ignores the position";
}

TEST(StepOverlap, ALogitRowItCannotSampleIsRefusedNotGuessed) {
  forward_result r = random_logits(2, 3);
  r.logits[k_vocab + 5] = std::nanf("");
  forward_batch b;
  b.presample.push_back({0, {}, 4});
  b.presample.push_back({1, {}, 4});
  const auto drawn = presample(b, r);
  EXPECT_GE(drawn[0], 0);
  EXPECT_EQ(drawn[1], -1);
}

// Penalties: the instance sends the counts of the window but its last
// token (make_presample_row), the draw counts the row's input token
// itself, and the token is the one the sampler picks from the whole
// history: greedy and sampled, short and long windows, with a logit_bias.
TEST(StepOverlap, PenalizedDrawsCountTheirInputTokenAsTheSamplerDoes) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> tok(0, 11);  // few tokens: many repeats
  forward_result r = random_logits(1, 4);
  // The penalized tokens lead, so the penalties decide the draws.
  for (int32_t t = 0; t < 12; ++t) r.logits[t] += 6.0f;
  int changed = 0;
  for (int trial = 0; trial < 200; ++trial) {
    sampling_params p;
    p.repetition_penalty = trial % 3 ? 1.4f : 1.0f;
    p.frequency_penalty = trial % 4 ? 0.6f : 0.0f;
    p.presence_penalty = trial % 5 ? 0.5f : -0.3f;
    p.penalty_last_n = trial % 7 == 0 ? -1 : trial % 7 == 1 ? 0 : 1 + trial % 9;
    p.temperature = trial % 2 ? 0.0f : 0.9f;
    p.seed = static_cast<uint64_t>(trial);
    if (trial % 6 == 0) p.logit_bias = {{2, 1.5f}, {7, -2.0f}};
    std::vector<int32_t> history(static_cast<size_t>(1 + trial % 23));
    for (auto& t : history) t = tok(rng);
    const auto position = static_cast<int64_t>(history.size());
    // The last token is the row's input: not known to the instance.
    const auto row = make_presample_row(
        0, p, position, std::span<const int32_t>(history.data(), history.size() - 1));
    EXPECT_EQ(row.count_input, p.penalty_last_n != 0);
    forward_batch b;
    b.tokens = {history.back()};
    b.logit_rows = {0};
    b.presample.push_back(row);
    sampler s(p);
    const int32_t want = s.sample(r.logits, history).token;
    EXPECT_EQ(presample(b, r).at(0), want) << "trial " << trial;
    sampling_params plain = p;
    plain.repetition_penalty = 1.0f;
    plain.frequency_penalty = plain.presence_penalty = 0.0f;
    changed += sampler(plain).sample(r.logits, history).token != want;
  }
  EXPECT_GT(changed, 20);  // the penalties matter in these draws
}

TEST(StepOverlap, MissingRowsAndUnknownInputsAreErrors) {
  forward_result r = random_logits(1, 4);
  forward_batch b;
  sampling_params pen;
  pen.repetition_penalty = 1.2f;
  // The input token of a penalized draw must be known by the time it draws.
  b.presample.push_back(make_presample_row(0, pen, 3, std::vector<int32_t>{1, 2}));
  b.logit_rows = {0};
  b.tokens = {device_draw_token(0)};
  EXPECT_THROW(presample(b, r), std::invalid_argument);
  b.tokens = {5};
  EXPECT_EQ(presample(b, r).size(), 1u);
  // A window longer than the tokens known.
  EXPECT_THROW(make_presample_row(0, pen, 9, std::vector<int32_t>{1, 2}), std::invalid_argument);
  b.presample = {{1, {}, 3}};
  EXPECT_THROW(presample(b, r), std::invalid_argument);
}

TEST(StepOverlap, PlaceholdersTakeTheDrawsOfTheStepRunJustBefore) {
  forward_batch b;
  b.step = 8;
  b.tokens = {5, 0, 6, 0};
  b.after = 7;
  b.placeholders = {{1, 2}, {3, 0}};
  fill_placeholders(b, 7, {40, 41, 42});
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{5, 42, 6, 40}));

  forward_batch plain;
  plain.tokens = {1, 2};
  fill_placeholders(plain, 0, {});  // no placeholders: nothing to check
  EXPECT_EQ(plain.tokens, (std::vector<int32_t>{1, 2}));

  // A refused draw (NaN logits) leaves a harmless row: its sequence ends on
  // those logits at the instance, and the step's other rows go on.
  forward_batch refused;
  refused.tokens = {5, 0};
  refused.after = 7;
  refused.placeholders = {{1, 0}};
  fill_placeholders(refused, 7, {-1});
  EXPECT_EQ(refused.tokens, (std::vector<int32_t>{5, 0}));
}

TEST(StepOverlap, PlaceholdersAfterAnotherStepOrAMissingDrawAreRefused) {
  auto batch = [] {
    forward_batch b;
    b.step = 8;
    b.tokens = {5, 0};
    b.after = 7;
    b.placeholders = {{1, 0}};
    return b;
  };
  auto b = batch();
  EXPECT_THROW(fill_placeholders(b, 6, {40}), std::invalid_argument);  // another step ran last
  b = batch();
  EXPECT_THROW(fill_placeholders(b, 0, {}), std::invalid_argument);  // the last step failed
  b = batch();
  EXPECT_THROW(fill_placeholders(b, 7, {}), std::invalid_argument);  // no such draw
  b = batch();
  b.placeholders = {{2, 0}};
  EXPECT_THROW(fill_placeholders(b, 7, {40}), std::invalid_argument);  // no such row
}

}  // namespace
}  // namespace troupe
