// Model loading: tensor types, GGUF and llama2.c readers, the model registry.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "runtime/model/gguf_reader.hpp"
#include "runtime/model/llama2c_reader.hpp"
#include "runtime/model/model_file.hpp"
#include "runtime/model/model_registry.hpp"
#include "tests/unit/gguf_fixture.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using testing::gguf_writer;
using testing::make_tiny_llama;
using testing::tiny_llama_options;

const char* k_sp = "\xE2\x96\x81";  // U+2581

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The message of the model_error f throws, checked to be one line.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const model_error& e) {
    EXPECT_FALSE(contains(e.what(), "\n")) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no model_error thrown";
  return "";
}

// Opens `path` expecting a model_error of the form "<path>: <problem>".
std::string open_error(const std::string& path, const std::string& tok = "") {
  const auto msg = error_of([&] { model_file::open(path, tok); });
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  return msg;
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("troupe_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    testing::write_file(file(name), bytes);
    return file(name);
  }
  fs::path dir_;
};

// ---------------------------------------------------------------- tensor types

TEST(TensorType, TraitsAndNames) {
  EXPECT_EQ(traits_of(tensor_type::q4_0).block_bytes, 18u);
  EXPECT_EQ(traits_of(tensor_type::q4_1).block_bytes, 20u);
  EXPECT_EQ(traits_of(tensor_type::q8_0).block_bytes, 34u);
  EXPECT_EQ(traits_of(tensor_type::q8_0).block_elems, 32u);
  EXPECT_EQ(traits_of(tensor_type::f16).block_bytes, 2u);
  ASSERT_TRUE(traits_of(3u).has_value());
  EXPECT_EQ(traits_of(3u)->name, "Q4_1");
  EXPECT_FALSE(traits_of(13u).has_value());  // Q5_K
  EXPECT_EQ(traits_of(12u)->block_elems, 256u);
  EXPECT_EQ(traits_of(tensor_type::q6_k).block_bytes, 210u);
  EXPECT_EQ(gguf_type_name(12), "Q4_K");
  EXPECT_EQ(gguf_type_name(14), "Q6_K");
  EXPECT_EQ(gguf_type_name(30), "BF16");
  EXPECT_EQ(gguf_type_name(4), "unknown");
  EXPECT_EQ(gguf_type_name(1000), "unknown");
  EXPECT_EQ(row_bytes(tensor_type::q4_1, 576), 18u * 20u);
  EXPECT_EQ(row_bytes(tensor_type::f32, 7), 28u);
  EXPECT_THROW(row_bytes(tensor_type::q4_0, 33), std::invalid_argument);
}

TEST(TensorType, HalfKnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // rounds to infinity
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie: even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie: even
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);             // tie: even
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(half_to_float(0xFC00)) && half_to_float(0xFC00) < 0);
  EXPECT_TRUE(std::isnan(half_to_float(0x7E00)));
}

TEST(TensorType, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    const uint16_t back = float_to_half(f);
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(half_to_float(back))) << h;
    else
      ASSERT_EQ(back, h) << "half " << h << " -> " << f;
  }
}

TEST(TensorType, DequantizeQ4_0) {
  std::vector<uint8_t> blk;
  testing::put<uint16_t>(blk, 0x3800);  // d = 0.5
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  float out[32];
  dequantize_row(tensor_type::q4_0, blk.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(out[16 + j], (15 - j - 8) * 0.5f) << j;
  }
}

TEST(TensorType, DequantizeQ4_1) {
  std::vector<uint8_t> blk;
  testing::put<uint16_t>(blk, 0x3400);  // d = 0.25
  testing::put<uint16_t>(blk, 0xBC00);  // m = -1
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<uint8_t>(((j * 7) & 15) | (j << 4)));
  float out[32];
  dequantize_row(tensor_type::q4_1, blk.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], ((j * 7) & 15) * 0.25f - 1.0f) << j;
    EXPECT_EQ(out[16 + j], j * 0.25f - 1.0f) << j;
  }
}

TEST(TensorType, DequantizeQ8_0TwoBlocks) {
  std::vector<uint8_t> row;
  for (uint16_t d : {uint16_t{0x4000}, uint16_t{0xB800}}) {  // 2.0, -0.5
    testing::put<uint16_t>(row, d);
    for (int j = 0; j < 32; ++j) row.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  }
  float out[64];
  dequantize_row(tensor_type::q8_0, row.data(), out, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], (j - 16) * 2.0f);
    EXPECT_EQ(out[32 + j], (j - 16) * -0.5f);
  }
}

// Q5_0 (ggml's layout: the half scale, 32 fifth bits, 16 bytes of
// nibbles) and IQ4_NL (the scale, 16 bytes of indices into its table),
// written by hand: their values, and the same as Q8_0 blocks.
TEST(TensorType, DequantizeQ5_0AndIq4NlAsQ8_0Blocks) {
  std::vector<uint8_t> q5;
  testing::put<uint16_t>(q5, uint16_t{0x4000});  // d = 2
  // Value j: low nibble j % 16, fifth bit set for the odd values, so the
  // quants are (j % 16) + 16 * (j odd) - 16.
  testing::put<uint32_t>(q5, 0xAAAAAAAAu);
  for (int j = 0; j < 16; ++j) q5.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  ASSERT_EQ(q5.size(), traits_of(tensor_type::q5_0).block_bytes);
  float out[32];
  dequantize_row(tensor_type::q5_0, q5.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j + 16 * (j & 1) - 16)) << j;
    EXPECT_EQ(out[16 + j], 2.0f * ((15 - j) + 16 * (j & 1) - 16)) << j;
  }
  std::vector<uint8_t> nl;
  testing::put<uint16_t>(nl, uint16_t{0xB800});  // d = -0.5
  for (int j = 0; j < 16; ++j) nl.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  dequantize_row(tensor_type::iq4_nl, nl.data(), out, 32);
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], -0.5f * table[j]);
    EXPECT_EQ(out[16 + j], -0.5f * table[15 - j]);
  }
  // An asymmetric fifth-bit mask: bit j and bit j + 16 differ, so values
  // j and j + 16 must each take their own bit (ggml's layout).
  q5.clear();
  testing::put<uint16_t>(q5, uint16_t{0x3C00});  // d = 1
  testing::put<uint32_t>(q5, 0x0000FFFFu);       // bits 0..15 set: values 0..15 only
  for (int j = 0; j < 16; ++j) q5.push_back(0x00);
  dequantize_row(tensor_type::q5_0, q5.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.0f) << j;         // 16 - 16
    EXPECT_EQ(out[16 + j], -16.0f) << j;  // 0 - 16
  }
  uint16_t d = 0;
  int8_t q[32];
  widen_block_to_q8_0(tensor_type::iq4_nl, nl.data(), 0, d, q);
  EXPECT_EQ(d, 0xB800);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[31], -127);
  EXPECT_TRUE(widens_to_q8_0(tensor_type::q5_0));
  EXPECT_FALSE(widens_to_q8_0(tensor_type::q4_0));
  EXPECT_THROW(widen_block_to_q8_0(tensor_type::q4_0, nl.data(), 0, d, q), std::invalid_argument);
}

// Q4_K and Q6_K: the first two super-blocks of two tensors of the Gemma 3
// 270M Q4_K_M file (blk.0.attn_output, blk.0.ffn_down), against the values
// gguf-py's dequantize (llama.cpp's October 2026 tree) gives them, exactly.
std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(TensorType, DequantizeKQuantsAsLlamaCppDoes) {
  const auto q4k = from_hex(
      "240b6416f2f1f0f0e6a8f5f47c5327ff84ea423b3509e4386a07a54f825056b36229fcc5363980dd"
      "2f79e1b474181700bc63778b92785bdecb7679f72a9c05896d9a89b9787eb85937aed5e586e760cb"
      "046872e4a9f07575688a6727355ca86a44e653854a626421062d4c6916685f643a5b58a590899994"
      "6634630c59945695362881f636316063c9730ba889be45a5ad09cd14f5f2bceefbeefffe9c9f8d20"
      "a56b13c0d569b7eb9a046596389a3a4a9705a48786cb2065729c5f427c62ff2885666277688c9d66"
      "4817ca85bc23885c01c7b0f744a47f6df8b87b57b8b78a6cf4947e282759fbbaad9490238789027a"
      "275769529c2f7766551087b5d86f785bad3b882c78ff8b80d506635a8479a67c49f54c28049c3928"
      "87ca5c3b59d94c1b");
  const auto q6k = from_hex(
      "da277d901132d47259b9570599d2679ae7a3bb95474b76d10ab1b4d99f755174a382b5e0c4103309"
      "42d44535e784e60fa6d231850201026c014498ae09ae0bc50d847656eda22085e900d34fff622b29"
      "546bd9ffcb62f2c211c0004ef4d84d8e7306c135d2f61bf1450946b112731b3973b1f41919e43f56"
      "991efc84da1fb917a578a35938235d9697566e4555ae1a65a9aa525ada19d8c642987a6198d5ad65"
      "4adb39d94e166401e906755de4ae64da69a159d8d9afdad96a16889944d6e4663baab498995a65bd"
      "5357706838805252f780b0a66e1ef9b9519082dd3b96016c35ec139db027e027b95c1e73436a9996"
      "ee105cdc055d82514cb2bae1b90770f575fafeec4beef16cd67dd5cb014a30ec088a96a8d651c1b6"
      "14f6d01abf8fc6deede072d033b4c38070e079e41115031967afec1f3962fa3a76e16ee6041daa0d"
      "373802f0626283036b685a7d4e319b33b5e5e96dce85564994559961842669a85b26722a269672a5"
      "a47744a22fe5a6959674e39199bd2dd26e63a805942905a2579fb672796ada16fa15d76624b15d8d"
      "95a4b551af59a8a6b775bd80515d6ab85e5ce880");
  ASSERT_EQ(q4k.size(), 2 * traits_of(tensor_type::q4_k).block_bytes);
  ASSERT_EQ(q6k.size(), 2 * traits_of(tensor_type::q6_k).block_bytes);
  const int at[] = {0, 1, 15, 16, 31, 32, 63, 64, 100, 127, 128, 200, 255, 256, 300, 511};
  const float q4k_want[] = {-0x1.015p-6, 0x1.96e4p-5,   -0x1.b3d4p-6, -0x1.332cp-5,
                            -0x1.e5bp-5, 0x1.791p-6,    -0x1.ff4p-5,  0x1.5ed8p-5,
                            0x1.aa4p-7,  0x1.6bap-5,    -0x1.1288p-5, -0x1.8fbp-8,
                            0x1.3f6ep-5, -0x1.7cf18p-6, -0x1.c9a9p-6, -0x1.9bf8p-5};
  const float q6k_want[] = {0x1.558ep-8,  0x1.63c94p-6, 0x1.558ep-8,   -0x1.7565p-7,
                            -0x1.f1dcp-7, -0x1.dca2p-7, -0x1.13f2p-6,  0x1.42fb4p-6,
                            0x1.e73fp-6,  -0x1.0294p-8, -0x1.04444p-6, -0x1.7a38p-7,
                            0x1.28b08p-6, -0x1.0fep-6,  0.0f,          -0x1.23dp-6};
  std::vector<float> out(512);
  double sum = 0, sum_abs = 0;
  dequantize_row(tensor_type::q4_k, q4k.data(), out.data(), 512);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[at[i]], q4k_want[i]) << "Q4_K value " << at[i];
  for (float v : out) sum += v, sum_abs += std::fabs(v);
  EXPECT_NEAR(sum, 1.3030155897140503, 1e-6);
  EXPECT_NEAR(sum_abs, 16.355730175971985, 1e-6);
  sum = sum_abs = 0;
  dequantize_row(tensor_type::q6_k, q6k.data(), out.data(), 512);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[at[i]], q6k_want[i]) << "Q6_K value " << at[i];
  for (float v : out) sum += v, sum_abs += std::fabs(v);
  EXPECT_NEAR(sum, 0.22768813371658325, 1e-6);
  EXPECT_NEAR(sum_abs, 7.6227505803108215, 1e-6);
  // Q4_K as eight Q4_1 blocks per super-block gives the same values.
  float d[8], m[8];
  uint8_t qs[8][16];
  split_q4_k_to_q4_1(q4k.data(), 1, d, m, qs);
  dequantize_row(tensor_type::q4_k, q4k.data(), out.data(), 512);
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(d[j] * static_cast<float>(qs[j][i] & 0x0F) + m[j], out[256 + j * 32 + i]);
      EXPECT_EQ(d[j] * static_cast<float>(qs[j][i] >> 4) + m[j], out[256 + j * 32 + 16 + i]);
    }
}

TEST(TensorType, DequantizeF16AndF32) {
  const uint16_t h[4] = {0x3C00, 0xC000, 0x3555, 0x0000};
  float out[4];
  dequantize_row(tensor_type::f16, h, out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.333251953125f);
  EXPECT_EQ(out[3], 0.0f);
  const float f[3] = {1.5f, -3.25f, 7.0f};
  dequantize_row(tensor_type::f32, f, out, 3);
  EXPECT_EQ(out[1], -3.25f);
  EXPECT_THROW(dequantize_row(tensor_type::q4_1, f, out, 16), std::invalid_argument);
}

// ---------------------------------------------------------------- GGUF

using GgufReader = TempDir;

TEST_F(GgufReader, TinyLlamaEveryType) {
  for (auto t : {tensor_type::f32, tensor_type::f16, tensor_type::q4_0, tensor_type::q4_1,
                 tensor_type::q8_0, tensor_type::q5_0, tensor_type::iq4_nl}) {
    tiny_llama_options o;
    o.matrix_type = t;
    o.embd_type = t;
    const gguf_writer w = make_tiny_llama(o);
    const auto path = write("tiny.gguf", w.bytes());
    const auto m = model_file::open(path);
    EXPECT_EQ(m->format(), "gguf");
    const auto& h = m->hparams();
    EXPECT_EQ(h.arch, "llama");
    EXPECT_EQ(h.n_vocab, 80);
    EXPECT_EQ(h.n_embd, 64);
    EXPECT_EQ(h.n_ff, 96);
    EXPECT_EQ(h.n_layer, 2);
    EXPECT_EQ(h.n_head, 4);
    EXPECT_EQ(h.n_head_kv, 2);
    EXPECT_EQ(h.head_dim, 16);
    EXPECT_EQ(h.rope_dims, 16);
    EXPECT_EQ(h.n_ctx_train, 128);
    EXPECT_EQ(h.rope_theta, 500000.0f);
    EXPECT_EQ(h.rms_eps, 1e-6f);
    EXPECT_EQ(h.rope, rope_layout::normal);
    EXPECT_TRUE(h.tied_embeddings);
    EXPECT_EQ(m->tensors().size(), w.tensors.size());
    for (const auto& wt : w.tensors) {  // every tensor's bytes are where the writer put them
      const auto& v = m->tensor(wt.name);
      EXPECT_EQ(static_cast<uint32_t>(v.type), wt.type) << wt.name;
      EXPECT_EQ(v.shape, wt.shape) << wt.name;
      ASSERT_EQ(v.bytes, wt.data.size()) << wt.name;
      EXPECT_EQ(std::memcmp(v.data, wt.data.data(), v.bytes), 0) << wt.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 32, 0u) << wt.name;
    }
    EXPECT_EQ(m->tensor("blk.0.ffn_down.weight").rows(), 64);
    EXPECT_EQ(m->tensor("blk.0.ffn_down.weight").row_len(), 96);
    EXPECT_EQ(m->fingerprint().size(), 16u);
  }
}

TEST_F(GgufReader, VocabAndMetadata) {
  const auto path = write("tiny.gguf", make_tiny_llama().bytes());
  const auto g = gguf_file::open(path);
  EXPECT_EQ(g->version(), 3u);
  ASSERT_NE(g->find_kv("general.name"), nullptr);
  EXPECT_EQ(g->find_kv("general.name")->str, "tiny test model");
  EXPECT_EQ(g->find_kv("tokenizer.ggml.tokens")->count, 80u);
  const auto& v = g->vocab();
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.tokens[5], std::string(k_sp) + "t5");
  EXPECT_EQ(v.scores[5], -5.0f);
  EXPECT_EQ(v.kinds[0], token_kind::unknown);
  EXPECT_EQ(v.kinds[1], token_kind::control);
  EXPECT_EQ(v.kinds[9], token_kind::normal);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  EXPECT_TRUE(v.add_bos);           // llama default
  EXPECT_TRUE(v.add_space_prefix);  // llama default
  EXPECT_EQ(v.chat_template, "{{ messages }}");
}

TEST_F(GgufReader, DefaultsVersion2AlignmentUntiedQwen) {
  tiny_llama_options o;
  o.tied = false;
  o.arch = "qwen2";
  o.n_head_kv = 4;  // the default when the key is absent
  gguf_writer w = make_tiny_llama(o);
  w.version = 2;
  w.alignment = 64;
  w.erase("qwen2.attention.head_count_kv");
  w.erase("qwen2.rope.freq_base");
  const auto m = model_file::open(write("q.gguf", w.bytes()));
  const auto& h = m->hparams();
  EXPECT_EQ(h.n_head_kv, 4);
  EXPECT_EQ(h.rope_theta, 10000.0f);
  EXPECT_EQ(h.rope, rope_layout::neox);
  EXPECT_FALSE(h.tied_embeddings);
  const auto* g = dynamic_cast<const gguf_file*>(m.get());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->version(), 2u);
  EXPECT_EQ(g->alignment(), 64u);
  EXPECT_EQ(g->data_offset() % 64, 0u);
  const auto& out = m->tensor("output.weight");
  EXPECT_EQ(std::memcmp(out.data, w.find_tensor("output.weight")->data.data(), out.bytes), 0);
}

TEST_F(GgufReader, FingerprintDiffersBetweenModels) {
  tiny_llama_options o;
  const auto a = model_file::open(write("a.gguf", make_tiny_llama(o).bytes()));
  const auto a2 = model_file::open(write("a2.gguf", make_tiny_llama(o).bytes()));
  o.seed = 99;
  const auto b = model_file::open(write("b.gguf", make_tiny_llama(o).bytes()));
  EXPECT_EQ(a->fingerprint(), a2->fingerprint());
  EXPECT_NE(a->fingerprint(), b->fingerprint());
}

TEST_F(GgufReader, TruncatedAtManyPoints) {
  std::vector<size_t> info_at;
  const auto full = make_tiny_llama().bytes(&info_at);
  const std::vector<size_t> cuts = {0,
                                    3,
                                    6,
                                    12,
                                    20,
                                    30,
                                    200,
                                    info_at[0] - 2,
                                    info_at[3] + 5,
                                    info_at.back() + 20,
                                    full.size() - 400,
                                    full.size() - 1};
  for (size_t cut : cuts) {
    const auto path = write("cut.gguf", {full.begin(), full.begin() + static_cast<long>(cut)});
    const auto msg = open_error(path);
    EXPECT_TRUE(contains(msg, "truncated") || contains(msg, "past the end") ||
                contains(msg, "too short"))
        << "cut " << cut << ": " << msg;
  }
}

TEST_F(GgufReader, BadHeaders) {
  auto bytes = make_tiny_llama().bytes();
  auto bad = bytes;
  bad[3] = 'X';
  EXPECT_TRUE(contains(open_error(write("m.gguf", bad)), "magic 'GGUX'"));
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    bad = bytes;
    testing::patch<uint32_t>(bad, testing::k_gguf_version_at, v);
    const auto msg = open_error(write("v.gguf", bad));
    EXPECT_TRUE(contains(msg, "version")) << msg;
  }
  bad = bytes;
  testing::patch<uint64_t>(bad, testing::k_gguf_tensor_count_at, uint64_t{1} << 40);
  auto msg = open_error(write("c.gguf", bad));
  EXPECT_TRUE(contains(msg, "tensor count 1099511627776")) << msg;
  bad = bytes;
  testing::patch<uint64_t>(bad, testing::k_gguf_kv_count_at, ~uint64_t{0});
  msg = open_error(write("k.gguf", bad));
  EXPECT_TRUE(contains(msg, "metadata count")) << msg;
  bad = bytes;
  testing::patch<uint64_t>(bad, testing::k_gguf_first_key_at, uint64_t{1} << 50);
  msg = open_error(write("s.gguf", bad));
  EXPECT_TRUE(contains(msg, "past the end of the file")) << msg;
}

TEST_F(GgufReader, UnsupportedTensorTypeIsNamed) {
  gguf_writer w = make_tiny_llama();
  auto* t = w.find_tensor("blk.0.ffn_down.weight");
  t->type = 13;  // Q5_K
  auto msg = open_error(write("k.gguf", w.bytes()));
  EXPECT_TRUE(contains(msg, "tensor 'blk.0.ffn_down.weight' has type Q5_K")) << msg;
  // A K-quant troupe runs, on rows that are not whole super-blocks.
  t->type = 12;  // Q4_K
  msg = open_error(write("k.gguf", w.bytes()));
  EXPECT_TRUE(contains(msg, "has rows of 96 values, not a multiple of the Q4_K block size 256"))
      << msg;
  t->type = 77;
  msg = open_error(write("k.gguf", w.bytes()));
  EXPECT_TRUE(contains(msg, "type number 77")) << msg;
}

// Each case damages a valid file one way; the error must say how.
struct damage {
  std::function<void(gguf_writer&)> apply;
  std::string expected;
};

TEST_F(GgufReader, BadTensorInfos) {
  using W = gguf_writer;
  const std::vector<damage> cases = {
      {[](W& w) { w.find_tensor("output_norm.weight")->offset = 1u << 30; },
       "'output_norm.weight' data ends past the end of the file"},
      {[](W& w) { w.find_tensor("output_norm.weight")->offset = 4; }, "not a multiple of 32"},
      {[](W& w) {
         w.find_tensor("blk.1.attn_k.weight")->shape = {64, 48};
       },
       "'blk.1.attn_k.weight' has shape [64, 48], expected [64, 32]"},
      {[](W& w) { w.find_tensor("blk.1.attn_k.weight")->shape = {64, 2, 2, 2, 2, 2}; },
       "6 dimensions"},
      {[](W& w) {
         w.find_tensor("blk.0.attn_q.weight")->shape = {48, 64};
       },
       "block size"},
      {[](W& w) { w.erase_tensor("blk.1.ffn_up.weight"); }, "missing tensor 'blk.1.ffn_up.weight'"},
  };
  for (const auto& c : cases) {
    gguf_writer w = make_tiny_llama();
    c.apply(w);
    const auto msg = open_error(write("bad.gguf", w.bytes()));
    EXPECT_TRUE(contains(msg, c.expected)) << msg;
  }
}

TEST_F(GgufReader, BadMetadata) {
  using W = gguf_writer;
  std::vector<damage> cases = {
      {[](W& w) { w.set_str("llama.block_count", "two"); }, "'llama.block_count' has type string"},
      {[](W& w) { w.set_u32("llama.attention.head_count_kv", 3); }, "KV head count"},
      {[](W& w) { w.set_str("general.architecture", "mamba"); }, "'mamba'"},
      {[](W& w) { w.set_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(80, 9)); },
       "token type 9"},
      {[](W& w) {
         w.set_f32_array("tokenizer.ggml.scores", {1.0f, 2.0f});
       },
       "tokenizer.ggml.scores has 2 entries"},
      {[](W& w) {  // an array that claims 2^60 u32 elements
         w.kvs.insert(w.kvs.begin(), {"x", 9, {}});
         testing::put<uint32_t>(w.kvs[0].payload, 4);
         testing::put<uint64_t>(w.kvs[0].payload, uint64_t{1} << 60);
       },
       "metadata value 'x' claims"},
  };
  for (const std::string key :
       {"llama.embedding_length", "llama.block_count", "llama.attention.layer_norm_rms_epsilon",
        "general.architecture", "tokenizer.ggml.tokens", "tokenizer.ggml.model"})
    cases.push_back({[key](W& w) { w.erase(key); }, "missing metadata key '" + key + "'"});
  for (const auto& c : cases) {
    gguf_writer w = make_tiny_llama();
    c.apply(w);
    const auto msg = open_error(write("bad.gguf", w.bytes()));
    EXPECT_TRUE(contains(msg, c.expected)) << msg;
  }
}

// ---------------------------------------------------------------- llama2.c

using Llama2cReader = TempDir;

TEST_F(Llama2cReader, TinyCheckpoint) {
  testing::tiny_llama2c t;
  const auto path = write("m.bin", t.model);
  write("tokenizer.bin", t.tokenizer);
  const auto m = model_file::open(path);
  EXPECT_EQ(m->format(), "llama2c");
  const auto& h = m->hparams();
  EXPECT_EQ(h.n_embd, 8);
  EXPECT_EQ(h.n_ff, 16);
  EXPECT_EQ(h.n_layer, 2);
  EXPECT_EQ(h.n_head_kv, 1);
  EXPECT_EQ(h.head_dim, 4);
  EXPECT_EQ(h.n_vocab, 300);
  EXPECT_EQ(h.n_ctx_train, 4);
  EXPECT_TRUE(h.tied_embeddings);
  EXPECT_EQ(m->find_tensor("output.weight"), nullptr);
  // Offsets follow the llama2.c order; floats count up from 0 after the header.
  auto first = [&](const std::string& name) {
    return *reinterpret_cast<const float*>(m->tensor(name).data);
  };
  const float embd = 300 * 8, norm = 2 * 8, wq = 2 * 64, wk = 2 * 8 * 4;
  EXPECT_EQ(first("token_embd.weight"), 0.0f);
  EXPECT_EQ(first("blk.1.attn_norm.weight"), embd + 8);
  EXPECT_EQ(first("blk.0.attn_q.weight"), embd + norm);
  EXPECT_EQ(first("blk.0.attn_k.weight"), embd + norm + wq);
  EXPECT_EQ(first("blk.1.attn_v.weight"), embd + norm + wq + wk + 32);
  EXPECT_EQ(m->tensor("blk.0.attn_k.weight").shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(m->tensor("blk.0.ffn_down.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(m->tensor("blk.0.ffn_gate.weight").shape, (std::vector<int64_t>{8, 16}));
  const auto& v = m->vocab();
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.kinds[1], token_kind::control);
  EXPECT_EQ(v.tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(v.tokens[3 + 0xE9], "<0xE9>");
  EXPECT_EQ(v.kinds[3 + 0xE9], token_kind::byte);
  EXPECT_EQ(v.tokens[260], std::string(k_sp) + "w260");
  EXPECT_EQ(v.scores[260], -260.0f);
  EXPECT_TRUE(v.add_bos && v.add_space_prefix);

  const auto unshared =
      model_file::open(write("u.bin", testing::tiny_llama2c(false).model), file("tokenizer.bin"));
  EXPECT_FALSE(unshared->hparams().tied_embeddings);
  EXPECT_EQ(unshared->tensor("output.weight").shape, (std::vector<int64_t>{8, 300}));
}

TEST_F(Llama2cReader, BadFiles) {
  testing::tiny_llama2c t;
  auto bytes = t.model;
  bytes.resize(bytes.size() - 4);
  write("tokenizer.bin", t.tokenizer);
  auto msg = open_error(write("short.bin", bytes));
  EXPECT_TRUE(contains(msg, "implies")) << msg;
  bytes = t.model;
  bytes.insert(bytes.end(), 8, 0);
  msg = open_error(write("long.bin", bytes));
  EXPECT_TRUE(contains(msg, "implies")) << msg;

  const auto good = write("m.bin", t.model);
  msg = open_error(good, file("nope.bin"));
  EXPECT_TRUE(contains(msg, "no tokenizer")) << msg;
  auto tok = t.tokenizer;
  tok.resize(tok.size() - 3);
  write("tokenizer.bin", tok);
  msg = error_of([&] { model_file::open(good); });
  EXPECT_EQ(msg.rfind(file("tokenizer.bin") + ": ", 0), 0u) << msg;
  msg = open_error(write("junk.bin", std::vector<uint8_t>(100, 0xFF)));
  EXPECT_TRUE(contains(msg, "not a GGUF file")) << msg;
}

// ---------------------------------------------------------------- model files

using ModelFile = TempDir;

TEST_F(ModelFile, UnopenableFiles) {
  EXPECT_TRUE(contains(open_error(file("missing.gguf")), "cannot open"));
  EXPECT_TRUE(contains(open_error(dir_.string()), "not a regular file"));
  EXPECT_TRUE(contains(open_error(write("empty.gguf", {})), "too short"));
  const auto path = write("tiny.gguf", make_tiny_llama().bytes());
  const auto m = model_file::open(path);
  EXPECT_EQ(m->find_tensor("nope"), nullptr);
  EXPECT_EQ(error_of([&] { m->tensor("nope"); }), path + ": missing tensor 'nope'");
}

// ---------------------------------------------------------------- real models

TEST(RealModel, SmolLM2) {
  const auto path = model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run `bash tools/setup.sh models`";
  const auto m = model_file::open(path);
  const auto& h = m->hparams();
  EXPECT_EQ(h.n_layer, 30);
  EXPECT_EQ(h.n_embd, 576);
  EXPECT_EQ(h.n_head, 9);
  EXPECT_EQ(h.n_head_kv, 3);
  EXPECT_EQ(h.head_dim, 64);
  EXPECT_EQ(h.rope_dims, 64);
  EXPECT_EQ(h.n_ff, 1536);
  EXPECT_EQ(h.n_vocab, 49152);
  EXPECT_EQ(h.n_ctx_train, 8192);
  EXPECT_EQ(h.rope_theta, 100000.0f);
  EXPECT_TRUE(h.tied_embeddings);
  EXPECT_EQ(m->tensors().size(), 272u);
  EXPECT_EQ(m->tensor("token_embd.weight").type, tensor_type::q8_0);
  EXPECT_EQ(m->tensor("blk.29.ffn_down.weight").type, tensor_type::q4_1);
  EXPECT_EQ(m->tensor("blk.0.attn_norm.weight").type, tensor_type::f32);
  const auto& v = m->vocab();
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "smollm");
  EXPECT_EQ(v.merges.size(), 48900u);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_FALSE(v.add_bos);
  EXPECT_TRUE(contains(v.chat_template, "<|im_start|>"));
  // Rows dequantize to finite, non-trivial values.
  const auto& e = m->tensor("token_embd.weight");
  std::vector<float> row(576);
  dequantize_row(e.type, e.data + 1000 * row_bytes(e.type, 576), row.data(), 576);
  double sum = 0;
  for (float x : row) {
    ASSERT_TRUE(std::isfinite(x));
    sum += std::fabs(x);
  }
  EXPECT_GT(sum, 1.0);
}

TEST(RealModel, Stories15M) {
  const auto path = model_dir() + "/stories15M.bin";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing; run `bash tools/setup.sh models`";
  const auto m = model_file::open(path);
  const auto& h = m->hparams();
  EXPECT_EQ(h.n_embd, 288);
  EXPECT_EQ(h.n_layer, 6);
  EXPECT_EQ(h.n_head, 6);
  EXPECT_EQ(h.n_head_kv, 6);
  EXPECT_EQ(h.n_ff, 768);
  EXPECT_EQ(h.n_vocab, 32000);
  EXPECT_EQ(h.n_ctx_train, 256);
  EXPECT_TRUE(h.tied_embeddings);
  EXPECT_EQ(m->tensor("token_embd.weight").data, m->mapping()->data() + 28);
  const auto& v = m->vocab();
  EXPECT_EQ(v.kinds[1], token_kind::control);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(v.kinds[3 + 0x41], token_kind::byte);
  EXPECT_EQ(v.tokens[3 + 0xFF], "<0xFF>");
  EXPECT_EQ(v.tokens[260], std::string(k_sp) + "t");
  EXPECT_EQ(v.tokens[259], std::string(k_sp) + k_sp);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
}

// ---------------------------------------------------------------- registry

class ModelRegistry : public TempDir {
 protected:
  void SetUp() override {
    TempDir::SetUp();
    if (const char* d = std::getenv("TROUPE_MODEL_DIR")) saved_ = d;
    ::setenv("TROUPE_MODEL_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (saved_)
      ::setenv("TROUPE_MODEL_DIR", saved_->c_str(), 1);
    else
      ::unsetenv("TROUPE_MODEL_DIR");
    TempDir::TearDown();
  }
  std::optional<std::string> saved_;
};

TEST_F(ModelRegistry, ResolvesNamesAndPaths) {
  EXPECT_EQ(known_model_names(),
            (std::vector<std::string>{"smollm2-135m-instruct", "stories15m", "gemma3-270m",
                                      "moe-4x2-f32", "moe-8x2-q", "moe-8x2-skew",
                                      "qwen2moe-4x2-shared", "qwen3-dense"}));
  auto msg = error_of([] { resolve_model("stories15m"); });
  EXPECT_TRUE(contains(msg, "bash tools/setup.sh models") && contains(msg, "stories15M.bin"))
      << msg;
  write("stories15M.bin", {1});
  write("tokenizer.bin", {1});
  write("SmolLM2-135M-Instruct.Q4_1.gguf", {1});
  const auto s = resolve_model("Stories15M");
  EXPECT_EQ(s.name, "stories15m");
  EXPECT_EQ(s.model_path, file("stories15M.bin"));
  EXPECT_EQ(s.tokenizer_path, file("tokenizer.bin"));
  const auto g = resolve_model("smollm2-135m-instruct");
  EXPECT_EQ(g.model_path, file("SmolLM2-135M-Instruct.Q4_1.gguf"));
  EXPECT_EQ(g.tokenizer_path, "");
  const auto p = resolve_model(file("stories15M.bin"));
  EXPECT_EQ(p.name, "stories15m");
  EXPECT_EQ(p.tokenizer_path, file("tokenizer.bin"));
  const auto other = resolve_model(write("mine.gguf", {1}));
  EXPECT_EQ(other.name, "mine");
  msg = error_of([] { resolve_model("llama-70b"); });
  EXPECT_EQ(msg.rfind("llama-70b: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "smollm2-135m-instruct") && contains(msg, "stories15m")) << msg;
  EXPECT_TRUE(contains(msg, "bash tools/setup.sh models")) << msg;
}

}  // namespace
}  // namespace troupe
