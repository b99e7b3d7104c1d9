// The decode roofline's two halves: the weight bytes a decode step reads
// (runtime/model/decode_bytes) and the read bandwidth (bench/memory_bandwidth).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "bench/memory_bandwidth.hpp"
#include "runtime/model/decode_bytes.hpp"
#include "runtime/model/model_registry.hpp"
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
