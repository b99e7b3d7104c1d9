// Pipelined steps (engine_options::pipeline): a step submitted behind the
// one running, its tokens the device's greedy draws of that step
// (device_draw_token), gives the logits and tokens of the same greedy
// decode run step by step with the host drawing, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#include "runtime/device/llama_forward.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/model/model_registry.hpp"

namespace troupe {
namespace {

struct pipeline_fixture {
  std::shared_ptr<const model_file> model;
  engine_options eo;

  pipeline_fixture() {
    auto r = resolve_model("stories15m");
    model = model_file::open(r.model_path, r.tokenizer_path);
    eo.max_batch_tokens = 64;
    eo.n_pages = 64;
  }
};

// Two sequences decoding side by side, each one row per step; their pages
// are apart in the arena.
struct two_seqs {
  int32_t length[2] = {0, 0};
  std::vector<int32_t> pages[2];

  two_seqs() {
    for (int p = 0; p < 16; ++p) {
      pages[0].push_back(p);
      pages[1].push_back(32 + p);
    }
  }
  // A step of both sequences' tokens (one each), presample rows in reverse
  // order (sequence 1's draw first), so that draw index and row differ.
  forward_batch step(int32_t tok0, int32_t tok1) {
    forward_batch b;
    const int32_t toks[2] = {tok0, tok1};
    for (int s = 0; s < 2; ++s) {
      b.tokens.push_back(toks[s]);
      b.positions.push_back(length[s]);
      b.seqs.push_back({s, 1, pages[s]});
      b.logit_rows.push_back(s);
      ++length[s];
    }
    for (int s = 1; s >= 0; --s) b.presample.push_back({s, sampling_params{}, length[s]});
    return b;
  }
};

int32_t host_greedy(const forward_result& r, int row) {
  sampler greedy(sampling_params{});
  return greedy.sample_at(
      {r.logits.data() + static_cast<size_t>(row) * r.n_vocab, static_cast<size_t>(r.n_vocab)}, 0);
}

TEST(Pipeline, DeviceDrawsChainAGreedyDecodeAsTheHostDoes) {
  pipeline_fixture f;
  const int steps = 24;
  const int32_t first[2] = {1, 1};

  // Step by step: the host draws each token from the logits it read.
  std::vector<std::vector<float>> want_logits;
  std::vector<int32_t> want_tokens;
  {
    llama_forward engine(f.model, f.eo);
    two_seqs s;
    int32_t t0 = first[0], t1 = first[1];
    for (int k = 0; k < steps; ++k) {
      auto r = engine.run(s.step(t0, t1));
      want_logits.push_back(r.logits);
      t0 = host_greedy(r, 0);
      t1 = host_greedy(r, 1);
      want_tokens.push_back(t0);
      want_tokens.push_back(t1);
    }
  }

  // Pipelined: step k+1 is submitted before step k is collected, naming
  // step k's draws (draw 0 is sequence 1's, draw 1 sequence 0's).
  llama_forward engine(f.model, f.eo);
  two_seqs s;
  std::vector<forward_result> got;
  engine.submit(s.step(first[0], first[1]), true);
  for (int k = 1; k < steps; ++k) {
    engine.submit(s.step(device_draw_token(1), device_draw_token(0)), true);
    EXPECT_EQ(engine.in_flight(), 2u);
    got.push_back(engine.collect());
  }
  got.push_back(engine.collect());
  EXPECT_EQ(engine.in_flight(), 0u);
  ASSERT_EQ(got.size(), static_cast<size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    EXPECT_EQ(got[k].logits, want_logits[k]);  // bit for bit
    ASSERT_EQ(got[k].drawn.size(), 2u);
    EXPECT_EQ(got[k].drawn[1], want_tokens[2 * k]);
    EXPECT_EQ(got[k].drawn[0], want_tokens[2 * k + 1]);
  }
}

TEST(Pipeline, TokensNamingDrawsTheLastStepDidNotMakeAreRefused) {
  pipeline_fixture f;
  llama_forward engine(f.model, f.eo);
  two_seqs s;
  // The last step drew on the host (or not at all): no device draw exists.
  engine.run(s.step(1, 1));
  EXPECT_THROW(engine.submit(s.step(device_draw_token(0), 1), true), std::invalid_argument);
  // One device draw per row of the last step: draw 2 does not exist.
  engine.submit(s.step(1, 1), true);
  EXPECT_THROW(engine.submit(s.step(device_draw_token(2), 1), true), std::invalid_argument);
  // Device draws for a row whose penalty counts are not sorted by token.
  auto hot = s.step(device_draw_token(0), device_draw_token(1));
  hot.presample[0].sampling.temperature = 0.7f;
  hot.presample[0].sampling.repetition_penalty = 1.2f;
  hot.presample[0].counts = {{9, 1}, {3, 2}};
  EXPECT_THROW(engine.submit(hot, true), std::invalid_argument);
  // What was refused was not submitted; the step in flight still answers.
  EXPECT_EQ(engine.in_flight(), 1u);
  EXPECT_EQ(engine.collect().drawn.size(), 2u);
  EXPECT_THROW(engine.collect(), std::logic_error);
}

}  // namespace
}  // namespace troupe
