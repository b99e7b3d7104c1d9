// Sampled draws on the device (kernels/draw.cl, sample_rows) against the
// host sampler (runtime/engine/sampler.cpp): the same token for the same
// logits, parameters, seed and position, every time.  Exact equality is
// the design (runtime/engine/draw_arith.hpp), so any difference fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/draw_penalties.hpp"
#include "runtime/device/llama_forward.hpp"
#include "runtime/engine/draw_arith.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/step_overlap.hpp"
#include "tests/unit/kernel_test_io.hpp"

namespace troupe {
namespace {

using kernel_test::download;
using kernel_test::random_floats;
using kernel_test::shared_context;
using kernel_test::upload;

shared_context& context() {
  static shared_context shared;
  return kernel_test::make_once(shared, [](cl::context&) {
    return std::optional<std::string>("-cl-std=CL1.2 -cl-mad-enable");
  });
}

class KernelSample : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!context().ctx) GTEST_SKIP() << "no OpenCL device: " << context().no_device;
  }
  cl::context& ctx() { return *context().ctx; }

  // Draws each (row, params, position) on the device; the greedy rows
  // (temperature 0) by argmax_rows, as llama_forward does.
  std::vector<int32_t> device_draws(const std::vector<float>& logits, int n_vocab,
                                    const std::vector<int32_t>& rows,
                                    const std::vector<sampling_params>& params,
                                    const std::vector<uint64_t>& positions,
                                    size_t per_launch = SIZE_MAX) {
    auto& c = ctx();
    std::vector<int32_t> off = {0}, toks, which, greedy;
    std::vector<float> vals, fpar;
    std::vector<uint32_t> ipar;
    std::vector<uint64_t> bits;
    for (size_t k = 0; k < params.size(); ++k) {
      const auto& p = params[k];
      for (const auto& tb : p.logit_bias) {
        toks.push_back(tb.token);
        vals.push_back(tb.bias);
      }
      off.push_back(static_cast<int32_t>(toks.size()));
      if (p.temperature == 0.0f || !std::isfinite(1.0f / p.temperature)) {
        greedy.push_back(static_cast<int32_t>(k));
        continue;
      }
      which.push_back(static_cast<int32_t>(k));
      fpar.push_back(1.0f / p.temperature);
      fpar.push_back(p.min_p);
      ipar.push_back(static_cast<uint32_t>(p.top_k));
      ipar.push_back(draw::top_p_fixed(p.top_p));
      bits.push_back(draw::seeded_bits(p.seed, positions[k]));
    }
    if (toks.empty()) {
      toks.push_back(0);
      vals.push_back(0.0f);
    }
    const auto lb = upload(c, logits), rb = upload(c, rows), ob = upload(c, off),
               tb = upload(c, toks), vb = upload(c, vals);
    const auto db = c.alloc(rows.size() * 4);
    if (!greedy.empty()) {
      const auto gb = upload(c, greedy);
      auto argmax = c.make_kernel("argmax_rows");
      argmax.args(lb, n_vocab, rb, db, ob, tb, vb, gb);
      c.launch(argmax, {greedy.size()}, {1});
    }
    if (!which.empty()) {
      const auto wb = upload(c, which), fb = upload(c, fpar), ib = upload(c, ipar),
                 bb = upload(c, bits);
      // Launches of at most per_launch draws over one scratch, as
      // llama_forward makes them.
      const size_t per = std::min(per_launch, which.size());
      const auto scratch = c.alloc(per * 3 * static_cast<size_t>(n_vocab) * 4);
      auto k = c.make_kernel("sample_rows");
      for (size_t first = 0; first < which.size(); first += per) {
        k.args(lb, n_vocab, rb, db, ob, tb, vb, wb, fb, ib, bb, scratch,
               static_cast<int32_t>(first));
        c.launch(k, {std::min(per, which.size() - first) * 8}, {8});
      }
    }
    return download<int32_t>(c, db, rows.size());
  }

  static int32_t host_draw(const std::vector<float>& logits, int n_vocab, int row,
                           const sampling_params& p, uint64_t position) {
    sampler s(p);
    try {
      return s.sample_at(
          {logits.data() + static_cast<size_t>(row) * n_vocab, static_cast<size_t>(n_vocab)},
          position);
    } catch (const std::invalid_argument&) {
      return -1;
    }
  }

  void expect_same(const std::vector<float>& logits, int n_vocab, const std::vector<int32_t>& rows,
                   const std::vector<sampling_params>& params,
                   const std::vector<uint64_t>& positions, size_t per_launch = SIZE_MAX) {
    const auto got = device_draws(logits, n_vocab, rows, params, positions, per_launch);
    for (size_t k = 0; k < rows.size(); ++k) {
      const auto& p = params[k];
      EXPECT_EQ(got[k], host_draw(logits, n_vocab, rows[k], p, positions[k]))
          << "draw " << k << " of row " << rows[k] << ": T " << p.temperature << " top_k "
          << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " seed " << p.seed
          << " position " << positions[k] << " biases " << p.logit_bias.size();
    }
  }
};

sampling_params sampled(float t, int top_k, float top_p, float min_p, uint64_t seed) {
  sampling_params p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

// Every truncation alone and together, over vocabularies from one token to
// Gemma's size, many seeds and positions: the device's token is the host's.
TEST_F(KernelSample, SampledDrawsEqualTheHostSamplers) {
  std::mt19937 rng(29);
  for (const int n_vocab : {1, 7, 100, 1000, 49152}) {
    SCOPED_TRACE("n_vocab " + std::to_string(n_vocab));
    const int R = 3;
    auto logits = random_floats(static_cast<size_t>(R) * n_vocab, -8.0f, 8.0f, rng);
    // Row 1 peaked (a few tokens hold the mass), row 2 coarse (many ties).
    for (int i = 0; i < n_vocab; ++i) {
      logits[static_cast<size_t>(n_vocab) + i] *= 3.0f;
      logits[2 * static_cast<size_t>(n_vocab) + i] =
          std::round(logits[2 * static_cast<size_t>(n_vocab) + i]);
    }
    std::vector<int32_t> rows;
    std::vector<sampling_params> params;
    std::vector<uint64_t> positions;
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
    const int top_ks[] = {0, 1, 2, 40, 5000};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.1f, 1e-9f};
    const float min_ps[] = {0.0f, 0.05f, 0.5f};
    for (int trial = 0; trial < 48; ++trial) {
      rows.push_back(trial % R);
      params.push_back(sampled(temps[trial % 5], top_ks[(trial / 2) % 5], top_ps[(trial / 3) % 5],
                               min_ps[(trial / 5) % 3], 1000 + trial));
      positions.push_back(static_cast<uint64_t>(trial * 7919 % 4096));
    }
    expect_same(logits, n_vocab, rows, params, positions);
  }
}

// A large vocabulary as a language model's logits look (Gemma 3's 262,144
// tokens: most far under the maximum, a few hundred near it, scattered):
// sample_rows skips whole blocks of tokens that weigh nothing, beside
// blocks where only one lane weighs anything; every truncation and
// temperature draws the host's token.
TEST_F(KernelSample, LargeVocabulariesWithFewLiveTokensAreTheHosts) {
  std::mt19937 rng(41);
  const int n_vocab = 262149;  // the last item's chunk ends in a tail of 5
  const int R = 2;
  auto logits = random_floats(static_cast<size_t>(R) * n_vocab, -30.0f, -10.0f, rng);
  std::uniform_int_distribution<int> tok(0, n_vocab - 1);
  std::uniform_real_distribution<float> near(-4.0f, 8.0f);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < (r == 0 ? 300 : 5); ++j)
      logits[static_cast<size_t>(r) * n_vocab + static_cast<size_t>(tok(rng))] = near(rng);
  logits[static_cast<size_t>(n_vocab) - 1] = 8.5f;  // the last token, in the tail
  std::vector<int32_t> rows;
  std::vector<sampling_params> params;
  std::vector<uint64_t> positions;
  const float temps[] = {0.3f, 0.8f, 1.0f, 2.5f};
  for (int trial = 0; trial < 24; ++trial) {
    rows.push_back(trial % R);
    params.push_back(sampled(temps[trial % 4], trial % 3 == 1 ? 40 : 0,
                             trial % 5 < 2 ? 0.95f : 1.0f, trial % 7 == 3 ? 0.05f : 0.0f,
                             500 + trial));
    // logit_bias: a far token raised to the top, the tail's lowered out.
    if (trial % 6 == 5) params.back().logit_bias = {{17, 30.0f}, {n_vocab - 1, -100.0f}};
    positions.push_back(static_cast<uint64_t>(trial));
  }
  expect_same(logits, n_vocab, rows, params, positions, 8);
}

// The same seed walks a sequence of positions (what a request draws token
// after token): every one of 200 draws equal.
TEST_F(KernelSample, ASequenceOfSeededDrawsIsTheHosts) {
  std::mt19937 rng(31);
  const int n_vocab = 4096;
  auto logits = random_floats(n_vocab, -6.0f, 6.0f, rng);
  std::vector<int32_t> rows(200, 0);
  std::vector<sampling_params> params(200, sampled(0.8f, 0, 0.95f, 0.0f, 42));
  std::vector<uint64_t> positions(200);
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = 17 + i;
  expect_same(logits, n_vocab, rows, params, positions);
  expect_same(logits, n_vocab, rows, params, positions, 32);  // seven launches
}

// OpenAI's logit_bias before sampling, infinities, a NaN (refused: -1),
// signed zeros and a row of equal logits (the ties' order is the index's).
TEST_F(KernelSample, BiasInfinitiesNaNsAndTiesAreTheHosts) {
  const int n_vocab = 300;
  std::mt19937 rng(37);
  const int R = 5;
  auto logits = random_floats(static_cast<size_t>(R) * n_vocab, -3.0f, 3.0f, rng);
  auto row = [&](int r) { return logits.begin() + static_cast<ptrdiff_t>(r) * n_vocab; };
  std::fill(row(1), row(2), 0.25f);
  row(2)[7] = std::numeric_limits<float>::infinity();
  row(2)[9] = std::numeric_limits<float>::infinity();
  row(3)[100] = std::nanf("");
  for (int i = 0; i < n_vocab; ++i) row(4)[i] = i % 2 ? 0.0f : -0.0f;
  std::vector<int32_t> rows;
  std::vector<sampling_params> params;
  std::vector<uint64_t> positions;
  for (int r = 0; r < R; ++r)
    for (int variant = 0; variant < 6; ++variant) {
      auto p = sampled(0.9f, variant % 3 == 1 ? 3 : 0, variant >= 3 ? 0.6f : 1.0f, 0.0f,
                       static_cast<uint64_t>(r * 10 + variant));
      if (variant == 2) p.logit_bias = {{1, 5.0f}, {2, -100.0f}, {n_vocab + 3, 1.0f}};
      if (variant == 5) p.logit_bias = {{0, 0.5f}, {150, 2.0f}};
      if (variant == 4) p.temperature = 1e-45f;  // 1 / T is infinite: greedy
      rows.push_back(r);
      params.push_back(p);
      positions.push_back(static_cast<uint64_t>(variant));
    }
  expect_same(logits, n_vocab, rows, params, positions);
}

// Penalized draws (kernels/penalty.cl): penalize_rows writes each draw's
// row with its logit_bias and penalties, argmax_rows and sample_rows draw
// from it, and the token is the host sampler's over the whole history, for
// greedy and sampled draws, inputs given as tokens or as draws of the
// step before, windows short, long and whole, and ties and infinities.
TEST_F(KernelSample, PenalizedDrawsEqualTheHostSamplers) {
  std::mt19937 rng(41);
  for (const int n_vocab : {5, 300, 49152}) {
    SCOPED_TRACE("n_vocab " + std::to_string(n_vocab));
    const int R = 3;
    auto logits = random_floats(static_cast<size_t>(R) * n_vocab, -4.0f, 4.0f, rng);
    const int hot = std::min(n_vocab, 12);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < hot; ++t) logits[static_cast<size_t>(r) * n_vocab + t] += 5.0f;
    for (int t = 0; t < hot; t += 2) logits[t] = std::round(logits[t]);  // ties in row 0
    logits[2 * static_cast<size_t>(n_vocab) + 1] = std::numeric_limits<float>::infinity();
    std::uniform_int_distribution<int32_t> tok(0, hot - 1);
    std::vector<int32_t> prev;  // the step before's draws, for inputs named as draws
    std::vector<presample_row> draws;
    std::vector<std::vector<int32_t>> histories;
    std::vector<int32_t> inputs;  // as b.tokens holds them
    for (int trial = 0; trial < 40; ++trial) {
      sampling_params p = sampled(trial % 3 == 0 ? 0.0f : 0.9f, trial % 5 == 1 ? 3 : 0,
                                  trial % 4 == 2 ? 0.8f : 1.0f, 0.0f, 500 + trial);
      p.repetition_penalty = trial % 3 == 1 ? 1.0f : 1.3f;
      p.frequency_penalty = trial % 2 ? 0.4f : 0.0f;
      p.presence_penalty = trial % 5 ? 0.7f : -0.5f;
      p.penalty_last_n = trial % 6 == 0 ? -1 : 2 + trial % 11;
      if (trial % 7 == 3) p.logit_bias = {{1, 2.0f}, {4, -3.0f}, {n_vocab + 2, 1.0f}};
      std::vector<int32_t> h(static_cast<size_t>(2 + trial % 29));
      for (auto& t : h) t = tok(rng);
      const auto row = make_presample_row(trial % R, p, static_cast<int64_t>(h.size()),
                                          std::span<const int32_t>(h.data(), h.size() - 1));
      draws.push_back(row);
      if (trial % 2) {  // the input token is a draw of the step before
        inputs.push_back(device_draw_token(static_cast<int32_t>(prev.size())));
        prev.push_back(h.back());
      } else {
        inputs.push_back(h.back());
      }
      histories.push_back(std::move(h));
    }
    // The penalized rows, after the R logit rows.
    penalty_inputs in;
    std::vector<int32_t> rows;
    std::vector<sampling_params> params;
    std::vector<uint64_t> positions;
    for (size_t k = 0; k < draws.size(); ++k) {
      const auto& d = draws[k];
      sampling_params q = d.sampling;
      if (penalized_draw(d)) {
        const int32_t dst = R + static_cast<int32_t>(in.draws());
        add_penalized_draw(in, d, d.logit_index, dst, inputs[k]);
        rows.push_back(dst);
        q.logit_bias.clear();  // in the row already
      } else {
        rows.push_back(d.logit_index);
      }
      params.push_back(q);
      positions.push_back(static_cast<uint64_t>(d.position));
    }
    ASSERT_EQ(in.draws(), draws.size());
    auto& c = ctx();
    std::vector<float> all = logits;
    all.resize(static_cast<size_t>(R + in.draws()) * n_vocab, 0.0f);
    const auto lb = upload(c, all);
    const auto sb = upload(c, in.src), db = upload(c, in.dst), ib = upload(c, in.input),
               pb = upload(c, in.par), ob = upload(c, in.off), tb = upload(c, in.tok),
               cb = upload(c, in.cnt), hb = upload(c, in.has_bias), bb = upload(c, in.bias),
               prevb = upload(c, prev);
    auto pen = c.make_kernel("penalize_rows");
    pen.args(lb, n_vocab, sb, db, ib, pb, ob, tb, cb, hb, bb, prevb);
    c.launch(pen, {(static_cast<size_t>(n_vocab) + 63) / 64, in.draws()});
    const auto penalized = download<float>(c, lb, all.size());
    // Each penalized row, bit for bit, as the host computes it: bias,
    // then draw::penalize with the input token counted.
    for (size_t j = 0; j < in.draws(); ++j) {
      const auto& d = draws[j];
      std::vector<float> want(logits.begin() + static_cast<ptrdiff_t>(d.logit_index) * n_vocab,
                              logits.begin() + static_cast<ptrdiff_t>(d.logit_index + 1) * n_vocab);
      for (const auto& tb : d.sampling.logit_bias)
        if (tb.token < n_vocab) want[static_cast<size_t>(tb.token)] += tb.bias;
      const auto& s = d.sampling;
      for (const auto& tc : count_one_more(d.counts, histories[j].back()))
        want[static_cast<size_t>(tc.token)] =
            draw::penalize(want[static_cast<size_t>(tc.token)], tc.count, s.repetition_penalty,
                           1.0f / s.repetition_penalty, s.frequency_penalty, s.presence_penalty);
      const float* got_row = penalized.data() + static_cast<size_t>(R + j) * n_vocab;
      int differ = 0;
      for (int i = 0; i < n_vocab; ++i)
        differ += std::memcmp(&want[static_cast<size_t>(i)], got_row + i, sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "penalized row " << j;
    }
    const auto got = device_draws(penalized, n_vocab, rows, params, positions);
    for (size_t k = 0; k < draws.size(); ++k) {
      const auto& d = draws[k];
      sampler host(d.sampling);
      const auto* row = logits.data() + static_cast<size_t>(d.logit_index) * n_vocab;
      const int32_t want = host.sample({row, static_cast<size_t>(n_vocab)}, histories[k]).token;
      EXPECT_EQ(got[k], want) << "draw " << k << ": T " << d.sampling.temperature << " rep "
                              << d.sampling.repetition_penalty << " last_n "
                              << d.sampling.penalty_last_n << " input " << inputs[k];
    }
  }
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Which draws the device makes itself, so that the next step is queued
// behind the last without waiting for the host: greedy, sampled and
// penalized rows alike; not an unsorted logit_bias or penalty counts.
TEST(DeviceDraws, SampledAndPenalizedRowsAreDrawnOnTheDevice) {
  presample_row greedy{0, {}, 5};
  presample_row hot{1, sampled(0.8f, 0, 0.95f, 0.0f, 7), 9};
  EXPECT_TRUE(llama_forward::draws_on_device({greedy, hot}));
  presample_row penalized = hot;
  penalized.sampling.presence_penalty = 0.5f;
  penalized.counts = {{3, 1}, {9, 2}};
  penalized.count_input = true;
  EXPECT_TRUE(llama_forward::draws_on_device({greedy, penalized}));
  EXPECT_TRUE(penalized_draw(penalized));
  EXPECT_FALSE(penalized_draw(hot));
  presample_row unsorted = hot;
  unsorted.sampling.logit_bias = {{9, 1.0f}, {3, -1.0f}};
  EXPECT_FALSE(llama_forward::draws_on_device({unsorted}));
  penalized.counts = {{9, 2}, {3, 1}};
  EXPECT_FALSE(llama_forward::draws_on_device({penalized}));
}

}  // namespace
}  // namespace troupe
