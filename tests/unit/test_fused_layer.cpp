// Fused layers (kernels/layer.cl, engine_options::fuse_layers): a layer run
// as one launch, and a whole step run as one launch (fuse_step), give the
// logits of the separate launches, bit for bit, for every weight type,
// token tile, attention mode and KV type, on real models and on tiny
// random ones.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "runtime/device/llama_forward.hpp"
#include "runtime/model/model_registry.hpp"
#include "tests/unit/gguf_fixture.hpp"

namespace troupe {
namespace {

// Steps that use every tile: a prefill of two sequences (37 and 5 rows:
// the wide tile, its tail), both decoding (2 rows: the 4-token tile), then
// one decoding alone (1 row) for a few steps.
std::vector<forward_batch> steps(int n_vocab, int page_size) {
  auto token = [&](int i) { return 3 + (i * 7919) % (n_vocab - 3); };
  const int len_a = 37, len_b = 5;
  auto pages = [&](int first, int n) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(first + i);
    return p;
  };
  // Room for 64 positions each: A in pages [0, 64/ps), B after it.
  const int per_seq = (64 + page_size - 1) / page_size;
  const auto pa = pages(0, per_seq), pb = pages(per_seq, per_seq);
  std::vector<forward_batch> out;
  forward_batch prefill;
  for (int i = 0; i < len_a; ++i) {
    prefill.tokens.push_back(token(i));
    prefill.positions.push_back(i);
  }
  for (int i = 0; i < len_b; ++i) {
    prefill.tokens.push_back(token(100 + i));
    prefill.positions.push_back(i);
  }
  prefill.seqs = {{0, len_a, pa}, {len_a, len_b, pb}};
  prefill.logit_rows = {len_a - 1, len_a + len_b - 1};
  out.push_back(prefill);
  forward_batch both;
  both.tokens = {token(50), token(51)};
  both.positions = {len_a, len_b};
  both.seqs = {{0, 1, pa}, {1, 1, pb}};
  both.logit_rows = {0, 1};
  out.push_back(both);
  for (int s = 0; s < 4; ++s) {
    forward_batch one;
    one.tokens = {token(60 + s)};
    one.positions = {len_a + 1 + s};
    one.seqs = {{0, 1, pa}};
    one.logit_rows = {0};
    out.push_back(one);
  }
  return out;
}

struct variant {
  const char* name;
  bool flash_attention;
  bool kv_f16;
};

const std::vector<variant> k_variants = {
    {"two-pass attention, half KV", false, true},
    {"flash attention, half KV", true, true},
    {"float KV", false, false},
};

// One sequence's prefill past a window of 512 positions (Gemma 3's local
// layers), then two decode steps, in pages after those steps() uses.
std::vector<forward_batch> window_steps(int n_vocab, int page_size) {
  auto token = [&](int i) { return 3 + (i * 104729) % (n_vocab - 3); };
  const int len = 530;
  std::vector<int32_t> pages;
  const int first = 2 * ((64 + page_size - 1) / page_size);
  for (int i = 0; i < (len + 2 + page_size - 1) / page_size; ++i) pages.push_back(first + i);
  std::vector<forward_batch> out;
  // Chunks of 500 and 30 rows (the scratch holds 512).
  for (const auto& [from, to] : {std::pair{0, 500}, std::pair{500, len}}) {
    forward_batch prefill;
    for (int i = from; i < to; ++i) {
      prefill.tokens.push_back(token(i));
      prefill.positions.push_back(i);
    }
    prefill.seqs = {{0, to - from, pages}};
    prefill.logit_rows = {to - from - 1};
    out.push_back(prefill);
  }
  for (int s = 0; s < 2; ++s) {
    forward_batch one;
    one.tokens = {token(len + s)};
    one.positions = {len + s};
    one.seqs = {{0, 1, pages}};
    one.logit_rows = {0};
    out.push_back(one);
  }
  return out;
}

// Runs the steps apart, with fused layers and as whole steps; every logit
// must be equal.  expect_fused: whether a whole step runs too.
// fused_layers: how many layers every variant fuses (-1: all where
// expect_fused, unchecked otherwise).  long_window: window_steps too.
void expect_same_logits(const std::shared_ptr<const model_file>& model, bool expect_fused,
                        const std::vector<variant>& variants = k_variants, int fused_layers = -1,
                        bool long_window = false) {
  if (fused_layers < 0 && expect_fused) fused_layers = model->hparams().n_layer;
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    engine_options o;
    o.n_pages = 64;
    o.flash_attention = v.flash_attention;
    o.kv_f16 = v.kv_f16;
    o.fuse_layers = false;
    llama_forward apart(model, o);
    o.fuse_layers = true;
    o.fuse_step = false;
    llama_forward layers(model, o);
    o.fuse_step = true;
    llama_forward whole(model, o);
    EXPECT_EQ(apart.fused_layers(), 0);
    EXPECT_FALSE(apart.fused_step());
    EXPECT_FALSE(layers.fused_step());
    EXPECT_EQ(whole.fused_step(), expect_fused);
    if (fused_layers >= 0) {
      EXPECT_EQ(layers.fused_layers(), fused_layers);
    }
    int step = 0;
    auto batches = steps(model->hparams().n_vocab, o.page_size);
    if (long_window)
      for (auto& b : window_steps(model->hparams().n_vocab, o.page_size))
        batches.push_back(std::move(b));
    for (const auto& b : batches) {
      SCOPED_TRACE("step " + std::to_string(step++) + " (" + std::to_string(b.tokens.size()) +
                   " rows)");
      const auto a = apart.run(b);
      for (llama_forward* f : {&layers, &whole}) {
        SCOPED_TRACE(f == &layers ? "fused layers" : "whole step");
        const auto r = f->run(b);
        ASSERT_EQ(a.logits.size(), r.logits.size());
        size_t differ = 0;
        for (size_t i = 0; i < a.logits.size(); ++i)
          differ += std::memcmp(&a.logits[i], &r.logits[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "of " << a.logits.size() << " logits";
      }
    }
  }
}

std::shared_ptr<const model_file> open_named(const std::string& name) {
  const auto r = resolve_model(name);
  return model_file::open(r.model_path, r.tokenizer_path);
}

TEST(FusedLayer, Stories15mF32MatchesSeparateLaunches) {
  expect_same_logits(open_named("stories15m"), true);
}

TEST(FusedLayer, SmolLM2Q4_1MatchesSeparateLaunches) {
  expect_same_logits(open_named("smollm2-135m-instruct"), true);
}

// Gemma 3 270M Q4_K_M: QK-norm, sandwich norms, GELU from the table,
// local layers with their own window and RoPE base, Q8_0 QKV and gate/up
// beside K-quant Wo and down: every layer one launch (layer_gemma_*), no
// whole step; a sequence past the 512-token window too.  (Its attention
// scale is 1/sqrt(head_dim), so the file's own scale, which the fused
// layers now take as the launches apart do, is not tested apart.)
TEST(FusedLayer, Gemma3MatchesSeparateLaunches) {
  const auto model = open_named("gemma3-270m");
  ASSERT_EQ(model->hparams().sliding_window, 512);
  expect_same_logits(model, false, k_variants, model->hparams().n_layer, true);
}

// Tiny random models written to a folder of this process's own, removed
// whatever the test's outcome.
class FusedLayerTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe-fused-layer-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::shared_ptr<const model_file> write(const testing::tiny_llama_options& opts,
                                          const std::string& name) const {
    const auto path = (dir_ / (name + ".gguf")).string();
    testing::make_tiny_llama(opts).write(path);
    return model_file::open(path);
  }
  // A tiny model whose head size (32) and FFN width are whole blocks of
  // type t (the quantized types' condition for a fused layer).
  static testing::tiny_llama_options whole_blocks(tensor_type t, int n_ff) {
    testing::tiny_llama_options opts;
    opts.n_embd = 128;
    opts.n_head = 4;
    opts.n_head_kv = 2;
    opts.n_ff = n_ff;
    opts.matrix_type = t;
    return opts;
  }
  std::filesystem::path dir_;
};

// Every weight type layer.cl has, on a tiny random model whose head size
// and FFN width are whole blocks (the quantized types' condition).
TEST_F(FusedLayerTiny, EveryWeightTypeMatchesSeparateLaunches) {
  for (tensor_type t :
       {tensor_type::f32, tensor_type::f16, tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0,
        tensor_type::q5_0, tensor_type::iq4_nl, tensor_type::q5_1, tensor_type::bf16}) {
    SCOPED_TRACE(std::string(traits_of(t).name));
    const auto opts = whole_blocks(t, 96);
    // One attention mode here (each KV type is a program build of its
    // own); the real models above take all three.
    expect_same_logits(write(opts, "tiny-" + std::string(traits_of(t).name)), true,
                       {k_variants.front()});
  }
}

// llama-quantize's K-quant files of a model whose rows are no whole
// super-blocks (SmolLM2's 576): Q5_0 or Q8_0 (Q4_K_M, Q6_K) or Q5_1
// (Q5_K_M) everywhere but ffn_down, which is Q6_K (held as KU6) or Q4_K
// (held as Q4_1), both with Q8_K inputs; layer.cl's _kd kernels quantize h
// per 256 values in a phase of their own.  Layers of both downs in one
// model: the whole step reads each layer's format from the arena's table.
TEST_F(FusedLayerTiny, KQuantDownBesideQ8_0MatchesSeparateLaunches) {
  for (tensor_type t : {tensor_type::q8_0, tensor_type::q5_0, tensor_type::q5_1}) {
    SCOPED_TRACE(std::string(traits_of(t).name));
    auto opts = whole_blocks(t, 512);  // two Q8_K blocks a row of h
    opts.n_layer = 3;
    opts.down_types = {tensor_type::q6_k, tensor_type::q4_k};
    expect_same_logits(write(opts, "tiny-kdown-" + std::string(traits_of(t).name)), true,
                       {k_variants.front()});
  }
}

// SmolLM2's Q5_K_M: Q5_1 layers, some with a Q8_0 (or Q5_0) attn_v,
// held as Q5_1 QKVs (upload_qkv), beside K-quant downs: every layer fused,
// the whole step across both kinds.
TEST_F(FusedLayerTiny, Q8_0VBesideQ5_1QKMatchesSeparateLaunches) {
  auto opts = whole_blocks(tensor_type::q5_1, 512);
  opts.n_layer = 3;
  opts.v_types = {tensor_type::q8_0, tensor_type::q5_1, tensor_type::q5_0};
  opts.down_types = {tensor_type::q6_k, tensor_type::q4_k};
  expect_same_logits(write(opts, "tiny-q5_1-v8"), true, {k_variants.front()});
}

// SmolLM2's Q4_K_M: Q5_0 layers (packed on the device), some with a Q8_0
// attn_v, every QKV's V held as Q8_0 beside packed q and k rows
// (upload_qkv), beside K-quant downs: every layer fused, the whole step
// across both kinds.
TEST_F(FusedLayerTiny, Q8_0VBesideQ5_0QKMatchesSeparateLaunches) {
  auto opts = whole_blocks(tensor_type::q5_0, 512);
  opts.n_layer = 3;
  opts.v_types = {tensor_type::q8_0, tensor_type::q5_0, tensor_type::q8_0};
  opts.down_types = {tensor_type::q6_k, tensor_type::q4_k};
  expect_same_logits(write(opts, "tiny-q5_0-v8"), true, {k_variants.front()});
}

// A QKV bias (Qwen2's) is added in the fused layer and the whole step as
// in the separate QKV kernel: the step reads it from the arena.
TEST_F(FusedLayerTiny, QkvBiasMatchesSeparateLaunches) {
  auto opts = whole_blocks(tensor_type::q8_0, 96);
  opts.qkv_bias = true;
  expect_same_logits(write(opts, "tiny-bias"), true, {k_variants.front()});
}

// A layer that cannot be fused (head size not a whole block, for the
// quantized types) runs apart, with the same results as ever.
TEST_F(FusedLayerTiny, AQuantizedModelWithPartBlockHeadsRunsApart) {
  testing::tiny_llama_options opts;  // head size 16
  opts.matrix_type = tensor_type::q4_0;
  const auto model = write(opts, "tiny-hd16");
  engine_options o;
  o.n_pages = 64;
  llama_forward f(model, o);
  EXPECT_EQ(f.fused_layers(), 0);
  expect_same_logits(model, false, {k_variants.front()});
}

}  // namespace
}  // namespace troupe
