// The instance actor on the real stories15M model: continuous batching
// gives every sequence the tokens it gets alone (also with chunked
// prefill), the prefix cache skips shared pages, preemption (recompute and
// swap) is invisible in the outputs, and cancel at any point leaves every
// page free or reusable.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "actors/device.hpp"
#include "actors/instance.hpp"
#include "actors/relay.hpp"
#include "messages/actors.hpp"
#include "runtime/engine/kv_blob.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/text/tokenizer.hpp"

namespace troupe {
namespace {

struct outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  finish_reason finish = finish_reason::none;
  int final_batches = 0;
  int preemptions = 0;
  int32_t cached_tokens = 0;
  std::string error;
};

using results = std::map<uint64_t, outcome>;

struct instance_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<const model_file> model;
  std::unique_ptr<tokenizer> tok;
  std::vector<int32_t> story;  // the tokens prompts are cut from, BOS not included
  bool step_overlap = true;    // for the instances it spawns
  bool pipeline = true;        // for the devices it spawns (engine_options::pipeline)
  int stages = 1;              // pipeline-parallel stages of the devices it spawns
  int pipeline_window = 64;    // their layer migration's window (steps)
  int32_t max_seqs = 32;       // the most sequences a step of its instances holds

  instance_fixture() {
    register_message_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    auto r = resolve_model("stories15m");
    model = model_file::open(r.model_path, r.tokenizer_path);
    tok = tokenizer::create(model->vocab());
    std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/../shared/golden/ppl_stories.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    story = tok->encode(ss.str(), false, false);
  }

  device_actor device(int n_pages = 0) {
    engine_options eo;
    eo.n_pages = n_pages;
    eo.max_batch_tokens = 128;
    eo.queue_steps = pipeline;
    eo.pipeline_stages = stages;
    eo.pipeline_window = pipeline_window;
    return spawn_device(*sys, model, eo);
  }

  instance_actor instance(device_actor dev, int32_t max_batch_tokens, int32_t chunk,
                          preempt_mode mode = preempt_mode::recompute, bool caching = true,
                          int32_t draft_tokens = 0) {
    instance_options o;
    o.draft_tokens = draft_tokens;
    o.limits.max_batch_tokens = max_batch_tokens;
    o.limits.max_seqs = std::min<int32_t>(max_seqs, max_batch_tokens);
    o.limits.chunk_size = chunk;
    o.preemption = mode;
    o.prefix_caching = caching;
    o.eog_tokens = tok->end_of_generation_ids();
    o.step_overlap = step_overlap;
    return spawn_instance(*sys, std::move(dev), o);
  }

  // BOS, then `len - 1` story tokens from `offset`.
  std::vector<int32_t> prompt(size_t offset, size_t len) {
    std::vector<int32_t> p{tok->bos()};
    for (size_t i = 0; p.size() < len; ++i) p.push_back(story[(offset + i) % story.size()]);
    return p;
  }

  static sequence_request request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
    sequence_request r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Ways for a test to act while a run goes on (send aborts).
  struct hooks {
    std::function<void(caf::scoped_actor&, uint64_t)> enqueued;
    std::function<void(caf::scoped_actor&, const token_batch&, const results&)> batch;
    std::function<void(caf::scoped_actor&, uint64_t)> preempted;
  };

  // Enqueues every request, then collects token batches until each has
  // its last one.
  results run(instance_actor inst, std::vector<sequence_request> reqs, const hooks& on = {}) {
    caf::scoped_actor self{*sys};
    auto sink = caf::actor_cast<token_sink_actor>(self.ptr());
    results out;
    for (auto& r : reqs) {
      r.sink = sink;
      out[r.id];
      self->request(inst, caf::infinite, enqueue_atom::value, r)
          .receive([](int32_t) {},
                   [&](caf::error& e) { ADD_FAILURE() << "enqueue: " << sys->render(e); });
      if (on.enqueued) on.enqueued(self, r.id);
    }
    size_t open = reqs.size();
    bool timed_out = false;
    while (open > 0 && !timed_out) {
      self->receive(
          [&](tokens_atom, const token_batch& b) {
            auto& o = out[b.id];
            EXPECT_EQ(o.final_batches, 0) << "batch after the last one, request " << b.id;
            o.tokens.insert(o.tokens.end(), b.tokens.begin(), b.tokens.end());
            o.logprobs.insert(o.logprobs.end(), b.logprobs.begin(), b.logprobs.end());
            if (b.cached_tokens > 0) o.cached_tokens = b.cached_tokens;
            if (!b.error.empty()) o.error = b.error;
            if (b.finish != finish_reason::none) {
              o.finish = b.finish;
              ++o.final_batches;
              --open;
            }
            if (on.batch) on.batch(self, b, out);
          },
          [&](preempted_atom, uint64_t id, bool) {
            ++out[id].preemptions;
            if (on.preempted) on.preempted(self, id);
          },
          caf::after(std::chrono::seconds(120)) >> [&] { timed_out = true; });
    }
    EXPECT_FALSE(timed_out) << open << " requests never finished";
    return out;
  }

  instance_stats stats(instance_actor inst) {
    caf::scoped_actor self{*sys};
    instance_stats out;
    self->request(inst, caf::infinite, stats_atom::value)
        .receive([&](instance_stats& s) { out = std::move(s); },
                 [&](caf::error& e) { ADD_FAILURE() << sys->render(e); });
    return out;
  }

  // Each request run by itself on an instance with a large arena and no
  // prefix cache: the reference every batched run must reproduce.
  std::map<uint64_t, std::vector<int32_t>> alone(const std::vector<sequence_request>& reqs) {
    auto inst = instance(device(), 128, 128, preempt_mode::recompute, false);
    std::map<uint64_t, std::vector<int32_t>> out;
    for (const auto& r : reqs) out[r.id] = run(inst, {r}).at(r.id).tokens;
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
    return out;
  }

  static void expect_pages_released(const instance_stats& st) {
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.waiting, 0);
    EXPECT_EQ(st.swap_bytes, 0u);
    EXPECT_EQ(st.kv.sequences, 0);
    EXPECT_EQ(st.kv.mapped, 0);
    EXPECT_EQ(st.kv.allocated, 0);
    EXPECT_EQ(st.kv.free + st.kv.reusable, st.kv.total);
    EXPECT_EQ(st.kv_check, "");
  }
};

// 32 prompts of 1 to ~150 tokens.
std::vector<sequence_request> mixed_requests(instance_fixture& f, int n, int32_t max_tokens,
                                             uint32_t seed, int max_len = 150) {
  std::mt19937 rng(seed);
  std::vector<sequence_request> reqs;
  for (int i = 0; i < n; ++i) {
    const size_t len = 1 + rng() % max_len;
    reqs.push_back(
        instance_fixture::request(100 + i, f.prompt(rng() % f.story.size(), len), max_tokens));
  }
  return reqs;
}

void expect_same(const results& got, const std::map<uint64_t, std::vector<int32_t>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, tokens] : want) {
    const auto& o = got.at(id);
    EXPECT_EQ(o.tokens, tokens) << "request " << id;
    EXPECT_EQ(o.final_batches, 1) << "request " << id;
  }
}

TEST(Instance, BatchedRequestsMatchTheirRunsAlone) {
  instance_fixture f;
  auto reqs = mixed_requests(f, 32, 16, 1);
  reqs[3].sampling.logprobs = true;
  auto want = f.alone(reqs);
  for (const auto& [id, tokens] : want) ASSERT_EQ(tokens.size(), 16u) << id;

  auto dev = f.device();
  // Whole prompts up to 128 rows; then chunks of 8, so most prompts take
  // several steps, next to the decodes of the others.
  for (int32_t chunk : {128, 8}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto inst = f.instance(dev, chunk == 128 ? 256 : 64, chunk);
    auto got = f.run(inst, reqs);
    expect_same(got, want);
    for (const auto& [id, o] : got) EXPECT_EQ(o.finish, finish_reason::max_tokens);
    EXPECT_EQ(got.at(103).logprobs.size(), 16u);
    for (float lp : got.at(103).logprobs) EXPECT_LE(lp, 0.0f);
    EXPECT_TRUE(got.at(104).logprobs.empty());
    auto st = f.stats(inst);
    EXPECT_EQ(st.finished, 32u);
    // Every token is computed once: prompts (less what the prefix cache
    // had), and all generated tokens but the last.  (A prompt's one-token
    // remainder is planned as a decode row.)
    uint64_t prompt_tokens = 0;
    for (const auto& r : reqs) prompt_tokens += r.prompt.size();
    EXPECT_EQ(st.prefill_tokens + st.decode_tokens + st.cached_tokens, prompt_tokens + 32u * 15);
    EXPECT_GE(st.decode_tokens, 32u * 15);
    EXPECT_LT(st.steps, 32u * 16) << "sequences were not batched";
    f.expect_pages_released(st);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }
}

// Seeded sampled requests, more of them in one step than one launch of
// the device's sampler draws (32: llama_forward_draws.cpp), each with its
// own truncations: every one draws on the device what it draws alone.
TEST(Instance, ManySampledRequestsInOneStepDrawWhatTheyDrawAlone) {
  instance_fixture f;
  f.max_seqs = 48;
  auto reqs = mixed_requests(f, 40, 12, 9, 40);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto& s = reqs[i].sampling;
    s.temperature = 0.6f + 0.1f * static_cast<float>(i % 8);
    s.seed = 500 + i;
    if (i % 3 == 1) s.top_p = 0.9f;
    if (i % 4 == 2) s.top_k = 30;
    if (i % 5 == 3) s.min_p = 0.05f;
  }
  auto want = f.alone(reqs);
  auto inst = f.instance(f.device(), 128, 128);
  auto got = f.run(inst, reqs);
  expect_same(got, want);
  const auto st = f.stats(inst);
  EXPECT_GT(st.overlapped_steps, 0u);
  f.expect_pages_released(st);
  caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
}

TEST(Instance, SharedPrefixIsComputedOnce) {
  instance_fixture f;
  const auto prefix = f.prompt(0, 100);  // 6 full pages of 16
  auto first = prefix, second = prefix;
  for (int i = 0; i < 12; ++i) first.push_back(f.story[200 + i]);
  for (int i = 0; i < 20; ++i) second.push_back(f.story[300 + i]);
  auto want = f.alone({instance_fixture::request(2, second, 16)});

  auto inst = f.instance(f.device(), 64, 32);
  auto r1 = f.run(inst, {instance_fixture::request(1, first, 16)});
  EXPECT_EQ(r1.at(1).cached_tokens, 0);
  const auto before = f.stats(inst);
  auto r2 = f.run(inst, {instance_fixture::request(2, second, 16)});
  const auto after = f.stats(inst);

  EXPECT_EQ(r2.at(2).tokens, want.at(2));
  EXPECT_EQ(r2.at(2).cached_tokens, 96);
  EXPECT_EQ(after.cached_tokens - before.cached_tokens, 96u);
  // Only the suffix is prefilled: the 120-token prompt minus 6 cached pages.
  EXPECT_EQ(after.prefill_tokens - before.prefill_tokens, second.size() - 96);
  EXPECT_EQ(after.decode_tokens - before.decode_tokens, 15u);
  EXPECT_GE(after.kv.prefix_hit_tokens, 96u);
  f.expect_pages_released(after);
}

// 12 requests of up to 90 tokens in an arena of 16 pages (256 tokens):
// sequences are preempted and resumed; offline ones yield first.  Some
// sample with a seed instead of greedily: their RNG survives preemption.
void preemption_run(preempt_mode mode) {
  instance_fixture f;
  auto reqs = mixed_requests(f, 12, 20, 3, 70);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 3 == 0) reqs[i].cls = seq_class::offline;
    if (i % 4 == 1) {
      reqs[i].sampling.temperature = 0.8f;
      reqs[i].sampling.seed = 42 + i;
    }
  }
  auto want = f.alone(reqs);
  auto inst = f.instance(f.device(16), 64, 32, mode);
  auto got = f.run(inst, reqs);
  expect_same(got, want);
  auto st = f.stats(inst);
  if (mode == preempt_mode::swap) {
    EXPECT_GT(st.preempted_swap, 0u);
  } else {
    EXPECT_GT(st.preempted_recompute, 0u);
    EXPECT_EQ(st.preempted_swap, 0u);
  }
  int notices = 0;
  for (const auto& [id, o] : got) notices += o.preemptions;
  EXPECT_EQ(uint64_t(notices), st.preempted_recompute + st.preempted_swap);
  f.expect_pages_released(st);
}

TEST(Instance, PreemptionByRecomputeKeepsOutputs) {
  preemption_run(preempt_mode::recompute);
}

TEST(Instance, PreemptionBySwapKeepsOutputs) {
  preemption_run(preempt_mode::swap);
}

// Step overlap (runtime/engine/step_overlap.hpp): the next step is sent while one
// runs, the tokens it samples drawn on the device.  No output changes,
// whether a sequence's token is drawn ahead (greedy, seeded sampling with
// any truncation, logprobs, penalties) or waits for the result (drafts) in
// the same batch, also under preemption in a small arena, and whether the
// device enqueues a step behind the one running, drawing greedy and seeded
// sampled tokens itself (pipeline), or not.  Off, no step is sent while another runs.
TEST(Instance, StepOverlapKeepsEveryOutput) {
  instance_fixture f;
  auto reqs = mixed_requests(f, 12, 24, 31, 60);
  reqs[1].sampling.temperature = 0.8f;
  reqs[1].sampling.top_p = 0.9f;
  reqs[1].sampling.seed = 11;
  reqs[2].sampling.temperature = 1.0f;
  reqs[2].sampling.top_k = 20;
  reqs[2].sampling.min_p = 0.05f;
  reqs[2].sampling.seed = 5;
  reqs[3].sampling.n_logprobs = 3;
  reqs[4].sampling.repetition_penalty = 1.3f;
  // Penalties with sampling, a whole-sequence window and a logit_bias.
  reqs[8].sampling.temperature = 0.9f;
  reqs[8].sampling.seed = 21;
  reqs[8].sampling.presence_penalty = 0.8f;
  reqs[8].sampling.frequency_penalty = 0.5f;
  reqs[8].sampling.penalty_last_n = 8;
  reqs[9].sampling.frequency_penalty = 1.5f;
  reqs[9].sampling.penalty_last_n = -1;
  reqs[9].sampling.logit_bias = {{13, 2.0f}, {200, -1.0f}};
  reqs[5].draft_tokens = 3;
  reqs[6].max_tokens = 1;
  reqs[7].cls = seq_class::offline;
  f.step_overlap = false;
  auto want = f.alone(reqs);
  auto dev = f.device();
  {
    auto inst = f.instance(dev, 64, 32);
    expect_same(f.run(inst, reqs), want);
    EXPECT_EQ(f.stats(inst).overlapped_steps, 0u);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }
  f.step_overlap = true;
  for (int pages : {0, 12}) {
    SCOPED_TRACE(pages ? "12-page arena (preemption)" : "large arena");
    auto inst = f.instance(pages ? f.device(pages) : dev, 64, 32);
    auto got = f.run(inst, reqs);
    expect_same(got, want);
    EXPECT_EQ(got.at(103).logprobs.size(), 24u);
    if (!pages) {
      // Without the sequence that waits for its results, steps are
      // planned ahead.
      std::vector<sequence_request> drawn;
      for (const auto& r : reqs)
        if (r.id != 105) drawn.push_back(r);
      auto again = f.run(inst, drawn);
      for (const auto& r : drawn) EXPECT_EQ(again.at(r.id).tokens, want.at(r.id)) << r.id;
    }
    const auto st = f.stats(inst);
    EXPECT_GT(st.overlapped_steps, 0u);
    if (pages) {
      EXPECT_GT(st.preempted_recompute, 0u);
    }
    f.expect_pages_released(st);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }
  // A device that runs each step only after the last one's result reached
  // the host (no pipelined steps, every token drawn on the host): the same.
  f.pipeline = false;
  {
    auto inst = f.instance(f.device(), 64, 32);
    expect_same(f.run(inst, reqs), want);
    EXPECT_GT(f.stats(inst).overlapped_steps, 0u);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }
  // Alone, a sequence with penalties lets steps be planned ahead (its
  // window's counts go with the step; the device counts the token it drew
  // the step before), and draws what it draws without overlap.
  auto inst = f.instance(dev, 64, 32);
  auto got = f.run(inst, {reqs[4], reqs[8]});
  EXPECT_EQ(got.at(104).tokens, want.at(104));
  EXPECT_EQ(got.at(108).tokens, want.at(108));
  EXPECT_GT(f.stats(inst).overlapped_steps, 0u);
  // A penalty that changes what is drawn: the same greedy request without
  // it draws otherwise (else this test could not fail).
  auto plain = reqs[9];
  plain.sampling.frequency_penalty = 0.0f;
  plain.sampling.logit_bias.clear();
  EXPECT_NE(f.alone({plain}).at(109), want.at(109));
}

// Speculative decoding (n-gram drafts verified in one step) changes no
// output: greedy, sampled with a seed, with logprobs, batched, and with
// preemption in a small arena.  On text that repeats itself drafts are
// accepted and a sequence takes fewer steps; a request that asks for no
// drafts gets none.
TEST(Instance, SpeculativeDecodingKeepsEveryOutput) {
  instance_fixture f;
  auto reqs = mixed_requests(f, 8, 40, 21, 60);
  // A passage, the passage again, and its start: the model goes on copying.
  for (int i : {0, 1, 2}) {
    const auto p = f.prompt(37 * i, 40);
    std::vector<int32_t> rep(p);
    rep.insert(rep.end(), p.begin() + 1, p.end());
    rep.insert(rep.end(), p.begin() + 1, p.begin() + 10);
    reqs[i].prompt = rep;
  }
  reqs[3].sampling.temperature = 0.8f;
  reqs[3].sampling.seed = 7;
  reqs[4].sampling.logprobs = true;
  auto want = f.alone(reqs);
  for (int pages : {0, 20}) {
    SCOPED_TRACE(pages ? "20-page arena (preemption)" : "large arena");
    auto inst = f.instance(f.device(pages), 64, 32, preempt_mode::recompute, true, 4);
    auto got = f.run(inst, reqs);
    expect_same(got, want);
    EXPECT_EQ(got.at(104).logprobs.size(), 40u);
    const auto st = f.stats(inst);
    EXPECT_GT(st.draft_tokens, 0u);
    EXPECT_GT(st.accepted_tokens, 0u);
    EXPECT_LE(st.accepted_tokens, st.draft_tokens);
    if (pages) {
      EXPECT_GT(st.preempted_recompute, 0u);
    }
    f.expect_pages_released(st);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }

  // One repetitive request alone: fewer steps with drafts than without.
  auto plain = f.instance(f.device(), 64, 32);
  auto drafting = f.instance(f.device(), 64, 32, preempt_mode::recompute, true, 4);
  const auto plain_got = f.run(plain, {reqs[0]});
  const auto spec_got = f.run(drafting, {reqs[0]});
  EXPECT_EQ(spec_got.at(reqs[0].id).tokens, plain_got.at(reqs[0].id).tokens);
  const auto plain_st = f.stats(plain), spec_st = f.stats(drafting);
  EXPECT_LT(spec_st.steps, plain_st.steps);
  // (Deterministic: greedy; 11 of 50 at the time of writing.)
  EXPECT_GE(spec_st.accepted_tokens, 8u) << "the copy was not predicted";

  // draft_tokens 0 on the request overrides the instance's default.
  auto off = reqs[5];
  off.draft_tokens = 0;
  const auto before = f.stats(drafting);
  EXPECT_EQ(f.run(drafting, {off}).at(off.id).tokens, want.at(off.id));
  EXPECT_EQ(f.stats(drafting).draft_tokens, before.draft_tokens);
  for (auto& a : {plain, drafting}) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

// Requests cancelled right after enqueue, after a random number of tokens,
// or when preempted; the rest finish unchanged, every cancelled one gets
// exactly one last batch, and afterwards no page is held.
void cancel_run(preempt_mode mode) {
  instance_fixture f;
  auto reqs = mixed_requests(f, 16, 20, 5, 70);
  auto want = f.alone(reqs);
  std::mt19937 rng(11);
  std::map<uint64_t, int> cancel_at;  // -1 never, 0 at once, k after k tokens, 99 when preempted
  for (size_t i = 0; i < reqs.size(); ++i)
    cancel_at[reqs[i].id] = i % 4 == 0   ? -1
                            : i % 4 == 1 ? 0
                            : i % 4 == 2 ? 99
                                         : 1 + int(rng() % 18);
  auto inst = f.instance(f.device(16), 64, 32, mode);
  caf::anon_send(inst, abort_atom::value, uint64_t(7));  // unknown: ignored
  instance_fixture::hooks on;
  on.enqueued = [&](caf::scoped_actor& self, uint64_t id) {
    if (cancel_at.at(id) == 0) self->send(inst, abort_atom::value, id);
  };
  on.batch = [&](caf::scoped_actor& self, const token_batch& b, const results& out) {
    const int at = cancel_at.at(b.id);
    if (b.finish == finish_reason::none && at > 0 && at != 99 &&
        int(out.at(b.id).tokens.size()) == at) {
      self->send(inst, abort_atom::value, b.id);
      self->send(inst, abort_atom::value, b.id);  // twice: the second is ignored
    }
  };
  on.preempted = [&](caf::scoped_actor& self, uint64_t id) {
    if (cancel_at.at(id) == 99) self->send(inst, abort_atom::value, id);
  };
  auto got = f.run(inst, reqs, on);
  int cancelled = 0;
  for (const auto& [id, o] : got) {
    EXPECT_EQ(o.final_batches, 1) << "request " << id;
    const auto& ref = want.at(id);
    if (o.finish == finish_reason::aborted) {
      ++cancelled;
      ASSERT_LE(o.tokens.size(), ref.size());
      EXPECT_TRUE(std::equal(o.tokens.begin(), o.tokens.end(), ref.begin())) << "request " << id;
    } else {
      EXPECT_EQ(o.tokens, ref) << "request " << id;
      EXPECT_NE(cancel_at.at(id), 0) << "request " << id;
    }
  }
  EXPECT_GT(cancelled, 0);
  auto st = f.stats(inst);
  EXPECT_EQ(st.aborted, uint64_t(cancelled));
  EXPECT_EQ(st.finished + st.aborted, reqs.size());
  f.expect_pages_released(st);

  // The released pages serve new requests, which again match.
  std::vector<sequence_request> again(reqs.begin(), reqs.begin() + 6);
  expect_same(f.run(inst, again), [&] {
    std::map<uint64_t, std::vector<int32_t>> w;
    for (const auto& r : again) w[r.id] = want.at(r.id);
    return w;
  }());
  f.expect_pages_released(f.stats(inst));
}

TEST(Instance, CancelAtAnyPointReleasesEverythingRecompute) {
  cancel_run(preempt_mode::recompute);
}

TEST(Instance, CancelAtAnyPointReleasesEverythingSwap) {
  cancel_run(preempt_mode::swap);
}

TEST(Instance, RefusesBadRequests) {
  instance_fixture f;
  auto inst = f.instance(f.device(), 64, 32);
  caf::scoped_actor self{*f.sys};
  auto sink = caf::actor_cast<token_sink_actor>(self.ptr());
  auto refused = [&](sequence_request r, bool with_sink = true) {
    if (with_sink) r.sink = sink;
    bool err = false;
    self->request(inst, caf::infinite, enqueue_atom::value, r)
        .receive([](int32_t) {}, [&](caf::error&) { err = true; });
    return err;
  };
  EXPECT_TRUE(refused(instance_fixture::request(1, {}, 4)));
  EXPECT_TRUE(refused(instance_fixture::request(1, f.prompt(0, 300), 4)));  // context is 256
  EXPECT_TRUE(refused(instance_fixture::request(1, {1, 99999}, 4)));
  EXPECT_TRUE(refused(instance_fixture::request(1, {1, 2}, 0)));
  EXPECT_TRUE(refused(instance_fixture::request(1, {1, 2}, 4), false));
  auto bad = instance_fixture::request(1, {1, 2}, 4);
  bad.sampling.top_p = 0.0f;
  EXPECT_TRUE(refused(bad));

  // Stop tokens and the context length end a sequence.
  auto stop_on = instance_fixture::request(2, f.prompt(0, 20), 50);
  auto ref = f.run(inst, {stop_on}).at(2).tokens;
  ASSERT_EQ(ref.size(), 50u);
  stop_on.stop_tokens = {ref[4]};
  auto got = f.run(inst, {stop_on}).at(2);
  EXPECT_EQ(got.finish, finish_reason::stop_token);
  EXPECT_EQ(got.tokens.back(), ref[4]);
  EXPECT_LE(got.tokens.size(), 5u);
  auto long_one = instance_fixture::request(3, f.prompt(0, 250), 50);
  got = f.run(inst, {long_one}).at(3);
  EXPECT_EQ(got.finish, finish_reason::context);
  EXPECT_EQ(got.tokens.size(), 6u);  // 250 + 6 = 256 positions
  f.expect_pages_released(f.stats(inst));
}

// The device's page messages, which swap and copy-on-write rely on.
void page_round_trip(int stages) {
  instance_fixture f;
  f.stages = stages;
  auto dev = f.device(8);
  caf::scoped_actor self{*f.sys};
  device_info info;
  self->request(dev, caf::infinite, info_atom::value)
      .receive([&](device_info& i) { info = i; }, [](caf::error&) {});
  ASSERT_GT(info.kv_bytes_per_page, 0u);
  const size_t per = info.kv_bytes_per_page;
  std::vector<uint8_t> data(2 * per);
  std::mt19937 rng(3);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  // Replies with a page count (write, copy): true unless an error came back.
  auto ok = [&](auto... args) {
    bool fine = false;
    self->request(dev, caf::infinite, args...)
        .receive([&](int32_t) { fine = true; }, [](caf::error&) {});
    return fine;
  };
  auto read = [&](std::vector<int32_t> pages, std::vector<uint8_t>& out) {
    bool fine = false;
    self->request(dev, caf::infinite, read_pages_atom::value, std::move(pages))
        .receive(
            [&](std::vector<uint8_t>& d) {
              out = std::move(d);
              fine = true;
            },
            [](caf::error&) {});
    return fine;
  };
  ASSERT_TRUE(ok(write_pages_atom::value, std::vector<int32_t>{3, 5}, data));
  std::vector<uint8_t> back;
  ASSERT_TRUE(read({5, 3}, back));
  ASSERT_EQ(back.size(), 2 * per);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + per, data.begin() + per));
  EXPECT_TRUE(std::equal(back.begin() + per, back.end(), data.begin()));
  ASSERT_TRUE(ok(copy_pages_atom::value, std::vector<int32_t>{5}, std::vector<int32_t>{6}));
  ASSERT_TRUE(read({6}, back));
  EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin() + per));
  // Runs of consecutive pages go as one strided transfer per layer: pages
  // 0-2 and 7 written at once, read back in another order and in parts.
  std::vector<uint8_t> four(4 * per);
  for (size_t i = 0; i < four.size(); ++i) four[i] = static_cast<uint8_t>((i * 7 + i / per) & 0xff);
  ASSERT_TRUE(ok(write_pages_atom::value, std::vector<int32_t>{0, 1, 2, 7}, four));
  auto page = [&](const std::vector<uint8_t>& v, size_t i) {
    return std::vector<uint8_t>(v.begin() + std::ptrdiff_t(i * per),
                                v.begin() + std::ptrdiff_t((i + 1) * per));
  };
  ASSERT_TRUE(read({7, 0, 1, 2}, back));
  ASSERT_EQ(back.size(), 4 * per);
  EXPECT_EQ(page(back, 0), page(four, 3));
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(page(back, i), page(four, i - 1)) << i;
  ASSERT_TRUE(read({1, 2}, back));
  EXPECT_EQ(page(back, 0), page(four, 1));
  EXPECT_EQ(page(back, 1), page(four, 2));
  // Misuse is an error reply, not a dead device.
  EXPECT_FALSE(read({8}, back));
  EXPECT_FALSE(ok(write_pages_atom::value, std::vector<int32_t>{1}, data));
  EXPECT_FALSE(ok(copy_pages_atom::value, std::vector<int32_t>{1, 2}, std::vector<int32_t>{3}));
  EXPECT_TRUE(read({0}, back));
}

TEST(DevicePages, ReadWriteCopyRoundTrip) {
  page_round_trip(1);
}

// A pipelined device (actors/pipeline.hpp) gathers each page from its
// stages' parts and scatters writes to them: the same round trips.
TEST(DevicePages, ReadWriteCopyRoundTripThroughPipelineStages) {
  page_round_trip(2);
  page_round_trip(3);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Runs `r` on `from`; once `after` tokens have come, exports it, imports
// it into `to` with the tokens streamed so far, and collects the rest.
// Returns every token the sink saw, in order.
std::vector<int32_t> run_migrating(instance_fixture& f, instance_actor from, instance_actor to,
                                   sequence_request r, size_t after) {
  caf::scoped_actor self{*f.sys};
  r.sink = caf::actor_cast<token_sink_actor>(self.ptr());
  self->request(from, caf::infinite, enqueue_atom::value, r)
      .receive([](int32_t) {}, [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  std::vector<int32_t> got;
  bool moved = false, done = false;
  auto take = [&](const token_batch& b) {
    EXPECT_FALSE(done) << "a batch after the last one";
    got.insert(got.end(), b.tokens.begin(), b.tokens.end());
    done = done || b.finish != finish_reason::none;
  };
  while (!done) {
    self->receive(
        [&](tokens_atom, const token_batch& b) {
          take(b);
          if (moved || done || got.size() < after) return;
          moved = true;
          std::vector<uint8_t> blob;
          self->request(from, caf::infinite, export_atom::value, r.id)
              .receive([&](std::vector<uint8_t>& x) { blob = std::move(x); },
                       [&](caf::error& e) { ADD_FAILURE() << "export: " << f.sys->render(e); });
          // Batches sent before the reply are in the mailbox already.
          bool more = true;
          while (more)
            self->receive([&](tokens_atom, const token_batch& b2) { take(b2); },
                          caf::after(std::chrono::milliseconds(0)) >> [&] { more = false; });
          if (done) return;
          sequence_request resumed = r;
          resumed.generated = got;
          self->request(to, caf::infinite, import_atom::value, resumed, blob)
              .receive([&](int32_t n_kv) { EXPECT_GT(n_kv, 0); },
                       [&](caf::error& e) { ADD_FAILURE() << "import: " << f.sys->render(e); });
        },
        [](preempted_atom, uint64_t, bool) {},
        caf::after(std::chrono::seconds(120)) >>
            [&] {
              ADD_FAILURE() << "no batch in 120 s";
              done = true;
            });
  }
  EXPECT_TRUE(moved);
  return got;
}

// Issue 10's export and import: a sequence taken out of one instance
// mid-stream continues on another with the tokens it would have had;
// seeded sampling too (the RNG state travels); the source's pages return.
TEST(Instance, ExportedMidStreamItContinuesIdenticallyElsewhere) {
  instance_fixture f;
  auto a = f.instance(f.device(), 64, 32);
  auto b = f.instance(f.device(), 64, 32);
  auto greedy = instance_fixture::request(1, f.prompt(10, 40), 48);
  auto sampled = instance_fixture::request(2, f.prompt(200, 25), 48);
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 7;
  const auto want = f.alone({greedy, sampled});
  for (auto r : {greedy, sampled}) {
    EXPECT_EQ(run_migrating(f, a, b, r, 9), want.at(r.id)) << "request " << r.id << ", A to B";
    EXPECT_EQ(run_migrating(f, b, a, r, 30), want.at(r.id)) << "request " << r.id << ", B to A";
  }
  const auto sa = f.stats(a), sb = f.stats(b);
  EXPECT_EQ(sa.exported, 2u);
  EXPECT_EQ(sa.imported, 2u);
  EXPECT_EQ(sb.exported, 2u);
  instance_fixture::expect_pages_released(sa);
  instance_fixture::expect_pages_released(sb);
  for (auto i : {a, b}) caf::anon_send_exit(i, caf::exit_reason::user_shutdown);
}

// Pipeline parallelism (issue 35): an instance on a pipelined device (two
// stages, a step's sequences through them in micro-batches) gives every
// request the tokens of one device, with chunked prefill beside decodes,
// under swap preemption in a small arena (pages gathered from and
// scattered to the stages), and moved mid-stream between a pipelined
// instance and one on a single device both ways (the same page layout).
TEST(Instance, APipelinedInstanceServesAsOneDevice) {
  instance_fixture f;
  auto reqs = mixed_requests(f, 16, 16, 35, 90);
  for (size_t i = 0; i < reqs.size(); i += 4) {
    reqs[i].sampling.temperature = 0.8f;
    reqs[i].sampling.seed = 9 + i;
  }
  const auto want = f.alone(reqs);
  auto single = f.instance(f.device(), 64, 32);
  f.stages = 2;
  {
    // Short windows: layers move off the last stage (the classifier's)
    // while the requests stream, their pages' KV with them.
    // The new stages load beside the old ones, so the move may land after
    // the requests end: it is waited for (bounded), and the requests run
    // again, their prompts' pages cached from before the move.
    f.pipeline_window = 8;
    auto dev = f.device();
    auto inst = f.instance(dev, 64, 16);
    expect_same(f.run(inst, reqs), want);
    f.expect_pages_released(f.stats(inst));
    caf::scoped_actor self{*f.sys};
    uint64_t moves = 0;
    for (int i = 0; i < 200 && moves == 0; ++i) {
      self->request(dev, caf::infinite, info_atom::value)
          .receive([&](device_info& d) { moves = d.layer_moves; },
                   [](caf::error&) { ADD_FAILURE(); });
      if (moves == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_GT(moves, 0u);
    const auto before = f.stats(inst);
    expect_same(f.run(inst, reqs), want);
    const auto after = f.stats(inst);
    EXPECT_GT(after.cached_tokens, before.cached_tokens);
    f.expect_pages_released(after);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
    f.pipeline_window = 64;
  }
  {
    auto inst = f.instance(f.device(16), 64, 32, preempt_mode::swap);
    expect_same(f.run(inst, reqs), want);
    const auto st = f.stats(inst);
    EXPECT_GT(st.preempted_swap, 0u);
    f.expect_pages_released(st);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }
  {
    // KV-head migration: two of stage 1's KV heads attend on stage 0 (their
    // pages there) while the requests stream under swap preemption, so
    // swapped-in pages reach the helper's copy of the group too.
    auto dev = f.device(16);
    auto inst = f.instance(dev, 64, 32, preempt_mode::swap);
    caf::scoped_actor self{*f.sys};
    self->request(dev, caf::infinite, move_heads_atom::value, 1, 0, 2)
        .receive([](std::string&) {}, [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
    expect_same(f.run(inst, reqs), want);
    const auto st = f.stats(inst);
    EXPECT_GT(st.preempted_swap, 0u);
    f.expect_pages_released(st);
    caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
  }
  auto piped = f.instance(f.device(), 64, 32);
  const auto& r = reqs[1];
  EXPECT_EQ(run_migrating(f, piped, single, r, 5), want.at(r.id)) << "pipelined to one device";
  EXPECT_EQ(run_migrating(f, single, piped, r, 9), want.at(r.id)) << "one device to pipelined";
  instance_fixture::expect_pages_released(f.stats(piped));
  for (auto i : {single, piped}) caf::anon_send_exit(i, caf::exit_reason::user_shutdown);
}

// A blob for another geometry (an f32 KV arena), or damaged, is refused
// with the reason, and nothing is admitted.
TEST(Instance, ABlobThatDoesNotFitIsRefusedByName) {
  instance_fixture f;
  auto a = f.instance(f.device(), 64, 32);
  engine_options eo;
  eo.max_batch_tokens = 128;
  eo.kv_f16 = false;
  instance_options io;
  io.eog_tokens = f.tok->end_of_generation_ids();
  auto f32 = spawn_instance(*f.sys, spawn_device(*f.sys, f.model, eo), io);
  caf::scoped_actor self{*f.sys};
  auto r = instance_fixture::request(5, f.prompt(0, 30), 40);
  r.sink = caf::actor_cast<token_sink_actor>(self.ptr());
  self->request(a, caf::infinite, enqueue_atom::value, r)
      .receive([](int32_t) {}, [](caf::error&) {});
  // Wait for a few tokens, then export.
  size_t seen = 0;
  while (seen < 3)
    self->receive([&](tokens_atom, const token_batch& b) { seen += b.tokens.size(); });
  std::vector<uint8_t> blob;
  self->request(a, caf::infinite, export_atom::value, r.id)
      .receive([&](std::vector<uint8_t>& x) { blob = std::move(x); },
               [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  auto refused = [&](instance_actor to, const std::vector<uint8_t>& bytes) {
    std::string why;
    self->request(to, caf::infinite, import_atom::value, r, bytes)
        .receive([&](int32_t) { ADD_FAILURE() << "imported"; },
                 [&](caf::error& e) { why = f.sys->render(e); });
    return why;
  };
  EXPECT_NE(refused(f32, blob).find("dtype: the blob has 'f16', this instance 'f32'"),
            std::string::npos)
      << refused(f32, blob);
  auto other = decode_kv_blob(blob);
  other.geometry.model_fingerprint = "another-model";
  EXPECT_NE(refused(a, encode_kv_blob(other)).find("model fingerprint"), std::string::npos);
  std::vector<uint8_t> damaged(blob.begin(), blob.begin() + blob.size() / 3);
  EXPECT_NE(refused(a, damaged).find("KV blob"), std::string::npos) << refused(a, damaged);
  EXPECT_EQ(f.stats(f32).imported, 0u);
  // The same blob sent in chunks (exportto) to the f32 arena: refused at
  // its first chunk, named; an export of a sequence the instance does
  // not hold is refused at once (not left unanswered).
  r.id = 6;
  self->request(a, caf::infinite, enqueue_atom::value, r)
      .receive([](int32_t) {}, [](caf::error&) {});
  seen = 0;
  while (seen < 3)
    self->receive([&](tokens_atom, const token_batch& b) { seen += b.tokens.size(); });
  self->request(a, std::chrono::seconds(30), export_to_atom::value, uint64_t{6},
                caf::actor_cast<kv_receiver_actor>(f32))
      .receive(
          [&](uint64_t transfer, uint64_t bytes) {
            EXPECT_EQ(transfer, 0u) << "the f32 arena took an f16 blob";
            EXPECT_GT(bytes, 0u);
          },
          [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  std::string why;
  self->request(a, std::chrono::seconds(30), export_to_atom::value, uint64_t{999},
                caf::actor_cast<kv_receiver_actor>(f32))
      .receive([&](uint64_t, uint64_t) { ADD_FAILURE() << "exported an unknown sequence"; },
               [&](caf::error& e) { why = f.sys->render(e); });
  EXPECT_NE(why.find("export"), std::string::npos) << why;
  EXPECT_EQ(why.find("timeout"), std::string::npos) << why;
  for (auto i : {a, f32}) caf::anon_send_exit(i, caf::exit_reason::user_shutdown);
}

// Faults a real device does not produce on demand, injected between the
// instance and a real device: the logits row of one position comes back
// holding a NaN (a numerically broken pass, or a malformed reply from a
// remote node), or every page write fails.
struct fault_plan {
  int32_t nan_at_position = -1;
  bool fail_writes = false;
};

device_actor faulty_device(caf::actor_system& sys, device_actor real, fault_plan plan) {
  return sys.spawn([real, plan](device_actor::pointer self) -> device_actor::behavior_type {
    return {
        [=](forward_atom a, forward_batch& b) -> caf::result<forward_result> {
          std::vector<size_t> poisoned;  // logits rows of the poisoned position
          for (size_t i = 0; i < b.logit_rows.size(); ++i)
            if (b.positions[b.logit_rows[i]] == plan.nan_at_position) poisoned.push_back(i);
          // A broken pass's NaN is in what the device draws from too (step
          // overlap): it refuses those draws.
          std::vector<size_t> refused;
          for (size_t k = 0; k < b.presample.size(); ++k)
            for (size_t i : poisoned)
              if (b.presample[k].logit_index == static_cast<int32_t>(i)) refused.push_back(k);
          auto rp = self->make_response_promise<forward_result>();
          self->request(real, caf::infinite, a, std::move(b))
              .then(
                  [rp, poisoned, refused](forward_result& r) mutable {
                    for (size_t i : poisoned) r.logits[i * r.n_vocab + 7] = std::nanf("");
                    for (size_t k : refused) r.drawn.at(k) = -1;
                    rp.deliver(std::move(r));
                  },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
          return rp;
        },
        [](step_done_atom, uint64_t) {},  // the real device's own note
        [=](info_atom a) { return relay<device_info>(self, real, caf::infinite, a); },
        [=](read_pages_atom a, std::vector<int32_t>& p) {
          return relay<std::vector<uint8_t>>(self, real, caf::infinite, a, std::move(p));
        },
        [=](write_pages_atom a, std::vector<int32_t>& p,
            std::vector<uint8_t>& d) -> caf::result<int32_t> {
          if (plan.fail_writes) return caf::make_error(caf::sec::runtime_error, "injected fault");
          return relay<int32_t>(self, real, caf::infinite, a, std::move(p), std::move(d));
        },
        [=](copy_pages_atom a, std::vector<int32_t>& src, std::vector<int32_t>& dst) {
          return relay<int32_t>(self, real, caf::infinite, a, std::move(src), std::move(dst));
        },
        [=](expert_stats_atom a) { return relay<expert_stats>(self, real, caf::infinite, a); },
        [=](expert_prepare_atom a, expert_plan& p) {
          return relay<uint64_t>(self, real, caf::infinite, a, std::move(p));
        },
        [=](expert_commit_atom a, uint64_t e) {
          return relay<uint64_t>(self, real, caf::infinite, a, e);
        },
        [=](expert_abort_atom a, uint64_t e) {
          return relay<uint64_t>(self, real, caf::infinite, a, e);
        },
        [=](move_layers_atom a, int32_t from, int32_t to, int32_t n) {
          return relay<std::string>(self, real, caf::infinite, a, from, to, n);
        },
        [=](move_heads_atom a, int32_t from, int32_t to, int32_t n) {
          return relay<std::string>(self, real, caf::infinite, a, from, to, n);
        },
        [=](head_guest_atom a, head_op& op) {
          return relay<head_answer>(self, real, caf::infinite, a, std::move(op));
        },
        [=](head_route_atom a, caf::actor helper, int32_t lo, int32_t hi) {
          return relay<int32_t>(self, real, caf::infinite, a, std::move(helper), lo, hi);
        },
    };
  });
}

// Issue 10, item 9: an exception in one sequence's bookkeeping (here the
// sampler refusing a NaN logit) ends that sequence with an error; the
// instance and its other sequences go on untouched.
TEST(Instance, AnExceptionInOneSequenceEndsOnlyThatSequence) {
  instance_fixture f;
  fault_plan plan;
  plan.nan_at_position = 20;
  auto inst = f.instance(faulty_device(*f.sys, f.device(), plan), 64, 32);
  // `hit` samples at position 20 (prompt 6, then decodes); `spared` never
  // does (its prompt's last row is 24).
  auto hit = instance_fixture::request(1, f.prompt(0, 6), 30);
  auto spared = instance_fixture::request(2, f.prompt(300, 25), 20);
  auto after = instance_fixture::request(3, f.prompt(600, 25), 10);
  const auto want = f.alone({spared, after});
  auto got = f.run(inst, {hit, spared});
  EXPECT_EQ(got.at(1).finish, finish_reason::error);
  EXPECT_NE(got.at(1).error.find("NaN"), std::string::npos) << got.at(1).error;
  EXPECT_EQ(got.at(1).tokens.size(), 15u) << "the tokens of positions 5 to 19";
  EXPECT_EQ(got.at(2).tokens, want.at(2));
  EXPECT_EQ(f.run(inst, {after}).at(3).tokens, want.at(3)) << "the instance serves on";
  instance_fixture::expect_pages_released(f.stats(inst));
  caf::anon_send_exit(inst, caf::exit_reason::user_shutdown);
}

// Item 9: a failed page write (an imported sequence's KV copied into the
// arena) fails that sequence, not the others, and leaves the page pool
// consistent.  (Copy-on-write copies, whose failure is handled the same
// way, do not arise on the instance's path: a prefix match maps full pages
// only.)
TEST(Instance, AFailedPageWriteFailsThatSequenceOnly) {
  instance_fixture f;
  fault_plan plan;
  plan.fail_writes = true;
  auto src = f.instance(f.device(), 64, 32);
  auto inst = f.instance(faulty_device(*f.sys, f.device(), plan), 64, 32);
  auto moved = instance_fixture::request(1, f.prompt(0, 30), 40);
  auto other = instance_fixture::request(2, f.prompt(500, 40), 12);
  const auto want = f.alone({other});

  caf::scoped_actor self{*f.sys};
  moved.sink = caf::actor_cast<token_sink_actor>(self.ptr());
  self->request(src, caf::infinite, enqueue_atom::value, moved)
      .receive([](int32_t) {}, [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  while (moved.generated.size() < 5)
    self->receive([&](tokens_atom, const token_batch& b) {
      moved.generated.insert(moved.generated.end(), b.tokens.begin(), b.tokens.end());
    });
  std::vector<uint8_t> blob;
  self->request(src, caf::infinite, export_atom::value, moved.id)
      .receive([&](std::vector<uint8_t>& x) { blob = std::move(x); },
               [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  // Tokens the source sent before it exported the sequence may still wait
  // in the mailbox (the reply came after them): the request moves with them.
  for (bool more = true; more;)
    self->receive(
        [&](tokens_atom, const token_batch& b) {
          moved.generated.insert(moved.generated.end(), b.tokens.begin(), b.tokens.end());
        },
        caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
  self->request(inst, caf::infinite, import_atom::value, moved, blob)
      .receive([](int32_t n_kv) { EXPECT_GT(n_kv, 0); },
               [&](caf::error& e) { ADD_FAILURE() << f.sys->render(e); });
  EXPECT_EQ(f.run(inst, {other}).at(2).tokens, want.at(2));
  token_batch last;
  self->receive([&](tokens_atom, token_batch& b) { last = std::move(b); },
                caf::after(std::chrono::seconds(30)) >> [] { ADD_FAILURE() << "no last batch"; });
  EXPECT_EQ(last.finish, finish_reason::error);
  EXPECT_NE(last.error.find("injected fault"), std::string::npos) << last.error;
  EXPECT_TRUE(last.tokens.empty());
  instance_fixture::expect_pages_released(f.stats(inst));
  for (auto i : {src, inst}) caf::anon_send_exit(i, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe
