// The two rooflines' halves: the weight bytes a decode step reads
// (runtime/model/decode_bytes) and the read bandwidth (bench/memory_bandwidth);
// the operations a prompt token costs (runtime/model/prefill_flops) and the
// F32 peak (bench/compute_peak).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "bench/compute_peak.hpp"
#include "bench/memory_bandwidth.hpp"
#include "runtime/model/decode_bytes.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/model/prefill_flops.hpp"
#include "tests/unit/gguf_fixture.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

double all_tensor_bytes(const model_file& m) {
  double b = 0;
  for (const auto& [name, t] : m.tensors()) b += static_cast<double>(t.bytes);
  return b;
}

std::shared_ptr<model_file> write_and_open(const troupe::testing::tiny_llama_options& o) {
  const auto path =
      (fs::temp_directory_path() / ("troupe_decode_bytes_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  troupe::testing::write_file(path, troupe::testing::make_tiny_llama(o).bytes());
  auto m = model_file::open(path);
  fs::remove(path);  // the mapping keeps the bytes
  return m;
}

}  // namespace

TEST(DecodeBytes, TiedEmbeddingsCountOnceAsTheClassifier) {
  troupe::testing::tiny_llama_options o;
  o.tied = true;
  const auto m = write_and_open(o);
  EXPECT_EQ(decode_weight_bytes(*m), all_tensor_bytes(*m));
}

TEST(DecodeBytes, ASeparateClassifierLeavesTheEmbeddingTableOut) {
  troupe::testing::tiny_llama_options o;
  o.tied = false;
  const auto m = write_and_open(o);
  const double embd = static_cast<double>(m->tensor("token_embd.weight").bytes);
  EXPECT_GT(embd, 0);
  EXPECT_EQ(decode_weight_bytes(*m), all_tensor_bytes(*m) - embd);
}

TEST(DecodeBytes, Stories15mReadsItsParametersAsF32) {
  const auto path = model_dir() + "/stories15M.bin";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run `bash tools/setup.sh models`";
  const auto m = model_file::open(path);
  // dim 288, hidden 768, 6 layers, 32000 tokens, tied: the llama2.c
  // architecture's parameter count, four bytes each.
  const double d = 288, ff = 768, layers = 6, vocab = 32000;
  const double params = layers * (4 * d * d + 3 * d * ff + 2 * d) + d + vocab * d;
  EXPECT_EQ(decode_weight_bytes(*m), 4 * params);
}

TEST(DecodeBytes, ExpertsCountByTheShareATokenIsRoutedTo) {
  const auto path = model_dir() + "/moe/moe-4x2-f32.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run `bash tools/setup.sh fixtures`";
  const auto m = model_file::open(path);
  ASSERT_EQ(m->hparams().n_expert, 4);
  ASSERT_EQ(m->hparams().n_expert_used, 2);
  double experts = 0;
  for (const auto& [name, t] : m->tensors())
    if (name.find("_exps.") != std::string::npos) experts += static_cast<double>(t.bytes);
  ASSERT_GT(experts, 0);
  double expect = all_tensor_bytes(*m) - experts / 2;
  if (!m->hparams().tied_embeddings)
    expect -= static_cast<double>(m->tensor("token_embd.weight").bytes);
  EXPECT_EQ(decode_weight_bytes(*m), expect);
}

TEST(MemoryBandwidth, MeasuresAPositiveRateAndRefusesBadOptions) {
  bandwidth_options o;
  o.threads = 2;
  o.bytes = size_t(8) << 20;
  o.passes = 2;
  const double bw = read_bandwidth(o);
  EXPECT_TRUE(std::isfinite(bw));
  EXPECT_GT(bw, 1e8);  // any machine reads more than 100 MB/s
  o.threads = 0;
  EXPECT_THROW(read_bandwidth(o), std::invalid_argument);
  o.threads = 1;
  o.bytes = 1000;
  EXPECT_THROW(read_bandwidth(o), std::invalid_argument);
  o.bytes = size_t(1) << 62;  // past any machine's memory: refused, not allocated
  EXPECT_THROW(read_bandwidth(o), std::invalid_argument);
  o.bytes = size_t(1) << 20;
  o.passes = 0;
  EXPECT_THROW(read_bandwidth(o), std::invalid_argument);
}

TEST(PrefillFlops, Stories15mCostsItsLayerMatricesAndAttentionOverTheMeanPosition) {
  const auto path = model_dir() + "/stories15M.bin";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run `bash tools/setup.sh models`";
  const auto m = model_file::open(path);
  // dim 288, hidden 768, 6 layers of 6 heads of 48: the layers' matrices
  // two operations a weight; attention 4 x 288 a position, a token of a
  // 512-token prompt seeing 256.5 positions on average.
  const double d = 288, ff = 768, layers = 6;
  const double matrices = 2 * layers * (4 * d * d + 3 * d * ff);
  EXPECT_DOUBLE_EQ(prefill_flops_per_token(*m, 512), matrices + layers * 4 * d * 256.5);
  EXPECT_DOUBLE_EQ(prefill_flops_per_token(*m, 1), matrices + layers * 4 * d);
  EXPECT_THROW(prefill_flops_per_token(*m, 0), std::invalid_argument);
}

TEST(PrefillFlops, AWindowedLayerSeesAtMostItsWindow) {
  const auto path = model_dir() + "/gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run `bash tools/setup.sh gemma3`";
  const auto m = model_file::open(path);
  const auto& h = m->hparams();
  ASSERT_GT(h.sliding_window, 0);
  ASSERT_LT(h.sliding_window, 4096);
  // Past the window the windowed layers stop growing: going from a prompt
  // of 2 windows to 4 adds attention on the full layers only.
  int full = 0;
  for (int l = 0; l < h.n_layer; ++l) full += h.swa_layers[static_cast<size_t>(l)] ? 0 : 1;
  ASSERT_GT(full, 0);
  ASSERT_LT(full, h.n_layer);
  const int w = h.sliding_window;
  const double grow = prefill_flops_per_token(*m, 4 * w) - prefill_flops_per_token(*m, 2 * w);
  // A windowed layer's mean over a prompt of p >= w: w - (w^2 - w) / 2p;
  // a full layer's grows by w exactly.
  auto windowed_mean = [w](double p) { return w - (double(w) * w - w) / (2 * p); };
  const double per_position = 4.0 * h.n_head * h.head_dim;
  EXPECT_NEAR(grow,
              per_position * (full * double(w) +
                              (h.n_layer - full) * (windowed_mean(4 * w) - windowed_mean(2 * w))),
              1e-6 * grow);
}

TEST(ComputePeak, MeasuresAPositiveRateAndRefusesBadOptions) {
  compute_options o;
  o.threads = 1;
  o.seconds = 0.02;
  o.passes = 2;
  const auto peak = f32_fma_peak(o);
  EXPECT_TRUE(std::isfinite(peak.flops));
  EXPECT_GT(peak.flops, 1e8);  // any machine multiplies-adds faster than that
  EXPECT_FALSE(peak.isa.empty());
  o.threads = 0;
  EXPECT_THROW(f32_fma_peak(o), std::invalid_argument);
  o.threads = 1;
  o.seconds = 0;
  EXPECT_THROW(f32_fma_peak(o), std::invalid_argument);
  o.seconds = 0.02;
  o.passes = 0;
  EXPECT_THROW(f32_fma_peak(o), std::invalid_argument);
}

TEST(PrefillFlops, OnlyFloatLayerWeightsAreBoundByTheF32Peak) {
  const auto stories = model_dir() + "/stories15M.bin";
  const auto smollm2 = model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(stories) || !fs::exists(smollm2))
    GTEST_SKIP() << "models missing; run `bash tools/setup.sh models`";
  EXPECT_TRUE(float_layer_weights(*model_file::open(stories)));
  EXPECT_FALSE(float_layer_weights(*model_file::open(smollm2)));
}
