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
  EXPECT_EQ(traits_of(13u)->block_bytes, 176u);  // Q5_K
  EXPECT_EQ(traits_of(30u)->name, "BF16");
  EXPECT_FALSE(traits_of(23u).has_value());  // IQ4_XS
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

// A K-quant row split for the device (split_k_quant): every value, s u + m
// with one rounding, is dequantize_row's (which reads K-quants through the
// split, so the gguf-py values the callers check anchor both), and u fits
// in 6 bits, as the kernels' vpmaddubsw needs.  (Its scales and offsets are
// k_quant_factors' products, as KU6 holds them, by construction.)
void expect_ku6_split_exact(tensor_type t, const std::vector<uint8_t>& bytes,
                            const std::vector<float>& want) {
  const auto name = traits_of(t).name;
  int bad = 0;
  for (size_t sb = 0; sb < want.size() / 256; ++sb) {
    uint8_t u[256];
    float sc[16], m[16];
    split_k_quant(t, bytes.data(), static_cast<int64_t>(sb), u, sc, m);
    for (int i = 0; i < 256; ++i) {
      EXPECT_LT(u[i], 64) << name;
      bad += std::fma(sc[i / 16], static_cast<float>(u[i]), m[i / 16]) != want[sb * 256 + i];
    }
  }
  EXPECT_EQ(bad, 0) << name << ": values unlike dequantize_row's";
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
  expect_ku6_split_exact(tensor_type::q4_k, q4k, out);
  sum = sum_abs = 0;
  dequantize_row(tensor_type::q6_k, q6k.data(), out.data(), 512);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[at[i]], q6k_want[i]) << "Q6_K value " << at[i];
  for (float v : out) sum += v, sum_abs += std::fabs(v);
  EXPECT_NEAR(sum, 0.22768813371658325, 1e-6);
  EXPECT_NEAR(sum_abs, 7.6227505803108215, 1e-6);
  expect_ku6_split_exact(tensor_type::q6_k, q6k, out);
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

// Q2_K, Q3_K, Q5_K, Q5_1 and BF16: 512 values of random blocks (sane
// scales) against gguf-py's dequantize, which is llama.cpp's reference, at
// sixteen places and in sum.
TEST(TensorType, DequantizeTheOtherKQuantsQ5_1AndBf16AsLlamaCppDoes) {
  struct sample {
    tensor_type type;
    std::vector<uint8_t> bytes;
    float want[16];
    double sum, sum_abs;
  };
  const sample samples[] = {
      {tensor_type::q2_k,
       from_hex("171002e1a2899271379d496185a38891d382b3d42e7d79e854fec94cad7f1641d26fc8878d5eba96"
                "476491408581ef5bb4735fed8cb3a1c1a5a2b4dad3e7058bf8e2bb6099cebb33c61e46acd9791f84"
                "fb10d317fa5ff73d9a19d38105b9b00c44a0840ebd38e81cb939e6db3bf6c057cb1ef51ebaa2f303"
                "c5b8d2f18693cac5ef698d27b07abbcd37fe4c93a4ea4505ee040820e264b38697f5e1b37df9956e"
                "d9c34326be13c717"),
       {0x1.63c4000000000p-7f, 0x1.b0a0000000000p-8f, 0x1.3370000000000p-9f,
        -0x1.f4c0000000000p-10f, -0x1.f4c0000000000p-10f, 0.0f, -0x1.a23c000000000p-6f,
        -0x1.250c000000000p-6f, -0x1.19ac000000000p-6f, -0x1.a23c000000000p-7f,
        -0x1.7790000000000p-8f, -0x1.2d88000000000p-7f, -0x1.05c0000000000p-6f,
        -0x1.37cc000000000p-6f, -0x1.f3b8000000000p-7f, 0.0f},
       -2.906869411468506,
       6.207652568817139},
      {tensor_type::q3_k,
       from_hex("042083a995de4d67c7e7fc1aa7d8a535598c5374db314940bb228e41cff75e3ffe510e311ebb09ce"
                "5bc6707c063e4ad48db834aad1daf1ce650136aaca642d4491d8c947cd45b84bd437ae36ba73a689"
                "d37691f32c6c3bb6ed0e7ccba9ace7b44ddbf35b5b62a9d7a4c70045f414d0c346047b0a2c92b383"
                "480919aae11e55b1fa2e461a2205a9c3b4110a0a59104c311538391253a05efa313f4381d084d489"
                "0d553677e4b7aba259e8c7364851d7ab6b4c386ca29e41b56de17e8e45385c165c20a773708e8613"
                "d3ee37ba99d9a64cb2f987ff26d1ef2186ce5512"),
       {0x1.7870000000000p-5f, 0x1.1a54000000000p-4f, -0.0f, 0x1.0b78000000000p-5f, 0.0f,
        0x1.1f48000000000p-5f, -0x1.8c40000000000p-8f, -0x1.2930000000000p-6f,
        0x1.c7b0000000000p-4f, -0x1.64a0000000000p-7f, -0x1.db80000000000p-7f,
        0x1.8c40000000000p-8f, 0x1.db80000000000p-8f, -0x1.169c000000000p-4f,
        -0x1.9540000000000p-8f, -0x1.6f42000000000p-6f},
       0.8207664489746094,
       15.35910415649414},
      {tensor_type::q5_k,
       from_hex("6114531297f89fc4060836674c23480afcb466326e9036750cf481bf2fd4c1b5ec189666c80e0d8a"
                "85b428da83bfafebb7cbaeb561d5729512b2e376d5702284cddc04933b4da2ec27f2b0ff6e7edae2"
                "a28f55b8bfcb4c06ca63cf6c923ea2c3fd341c6571ac48a81e1801da907d237afee926a1c4f1289d"
                "2596c7b19bf1fc45bdd50929c52c7643b5fa9171717094ef6c655704e422e7b918da38890b4ad6b5"
                "081421056e760f0d3e028ca6465174345d10c4179787b661be9a1c139d020fa2c503112a0bfc9941"
                "18afdb6aceeb199c2062377d38c632a5d2094c4032a2789d9e34a39fd6763e380e896a9bafcb4549"
                "89960637b9ae9c9a6727e76153ea948d6aaa94ee1dcee7eb1b33b67e6301103669e98fd042604251"
                "753ed4aeb273471d05ddf4a60f978376b1282ae280e3082da1a0090b1a00b97cf7ef1a8ddedd5562"
                "debb36e51a5a1eca4790e08c10df235f6f7d1b04a3e85f1f8b2b7ff0a956e3b8"),
       {0x1.5704000000000p-3f, 0x1.1039000000000p-2f, 0x1.f2d4c00000000p-2f, 0x1.4294800000000p-2f,
        0x1.c079400000000p-2f, 0x1.4e03800000000p-1f, 0x1.ca34400000000p+0f, 0x1.1c15a00000000p-1f,
        0x1.5d99800000000p-4f, 0x1.1789800000000p-4f, 0x1.6878200000000p+0f, 0x1.5b26800000000p-2f,
        0x1.2a6f600000000p+0f, 0x1.ffee800000000p-3f, 0x1.864e000000000p-5f, 0x1.eb4f800000000p-3f},
       212.7051420211792,
       216.5157346725464},
      {tensor_type::q5_1,
       from_hex("ae2024ade383d6bc262db1d5a71e2ca6bbee7e2095977e37d4147bac633c0a58ba2f98b53b316e6e"
                "9153cb238f60fa74421db0ac23f00a1a4398dd5c1e8dcad7cd1eb593cd2d9ce4c41f51ac5d65ec9b"
                "fc17e04c43ef6a6c7c60ef4c8eeef1a77f192aad1bf7f9ce60be7ef51d890e45f93eee7085bd1fbf"
                "4420a1ad76c6cbd763d2797e9e1ba257a99fa5a654fbc4a5c21e5baa73517033f8683c531afab9ff"
                "ba1267c9d2230b5b851b50a487f7ee865d28bbedf9a9a703e41ca955efe34270321f57a4ad72bb3f"
                "4d10ee02a57a61e89deb288dd077e765de1b83a62afeca5f3c8cf5645598036b4e533ee4fc723bdf"
                "cd1df2a6cfd13d1337c2e6cedb49e523f99d87e9ca6dfd130f201facdf82669893ebbe0a93cc9909"
                "ad58999365bd9f7a941e8aa3e7eae66528ff03f3c99aae35c80278df1d871871c21774a065cc8457"
                "947f82ac0367912e18c46634f00333d93d1b54a6a4914e8f84609dc85353c73a01669a86aa1fe8d1"
                "6c19be9703ebb541b464a10974465ade6a2640718cab6b23"),
       {0x1.eea0000000000p-4f, 0x1.7a58000000000p-3f, 0x1.0a08000000000p-3f, -0x1.fc40000000000p-5f,
        0x1.7e50000000000p-4f, -0x1.4270000000000p-5f, -0x1.f9e8000000000p-5f,
        0x1.8e60000000000p-6f, 0x1.39f0000000000p-4f, 0x1.09b0000000000p-3f, -0x1.3540000000000p-5f,
        0x1.f370000000000p-4f, 0x1.14e6000000000p-4f, 0x1.7e9c000000000p-3f, 0x1.5060000000000p-4f,
        0x1.be40000000000p-9f},
       22.640832901000977,
       32.1376895904541},
      {tensor_type::bf16,
       from_hex("5cbe15bf453f20bfc33fa8bd93bf21bf983fe4be1f3fc3bff93e4f3f0c3f543f6dbfcbbf9fbf643f"
                "eb3e5c3ffbbe5e3fbbbff53e74bfb3be3b3f733f97bd88beb73f8f3f14bfc53ee2bd873f0e3f093f"
                "4d3ed8be993f053f0bc086bec13e1ebf4cbf04bfeb3e55bff33eba3f863f8b3fc6bda43f0a3e7d3f"
                "81bfad3fedbe133e943fe43db7be59bd983f9a3f433f05bf9bbe3f3f553f1dbf1abf473f953f2d3e"
                "8bbfd43ffb3d0b3f03c024bff3bdbe3e52bfbcbfcbbfb0bea33e8c3ed8bf2fbfb1bd7d3f0d3f833e"
                "d4bf893fbdbd543e2bbf56beb0bed2be62bf283f613f0abf55bf52bf9fbeb23f15bee53fa1bf8bbf"
                "49bf5cbf9e3eda3f3cbfa73ea63f17404e3e773fa73fc53d0f3fafbe5ebf14bf923faa3f833e98bf"
                "9d3f6b3cbf3ff23d8ebf84be22bfcb3f0dc00fbf91befebfe43e223f5d3f593f8dbd743fd3be6c3d"
                "7a3ecc3d083f1ebfbfbd0dbfc13dab3e36bfba3ff83f143f023e14bf06be34be383f083d3c3f193f"
                "ddbea1bf8fbf80bf9c3c9a3f5dbf303ffdbda53f10408c3fc63e0e3fac3f65be33bf6f3ed33f20bf"
                "953f6e3f19be36bfc5bf8abf663e493f10bf02bf36bf1d40a7bfb5bf8b3f86bf823f4abf853fb13f"
                "debeaa3876bf633f97be6cbfe43ec03e1bbdd7be753f24bf5abf78be043fc5be20bf82bf4cbf2bbf"
                "fb3fe4bfefbe543d64bf99bf093fad3f8a3f973be7be253fd3bf59bfb93fd53e1a3e4abec7be59bf"
                "113ffe3e023f1cc0a23f593fc73f10bf0bc0a6bf63bf004041bfefbe7e3f643f773feebeee3fcd3e"
                "58bfd13eb4bf9fbf2ebf97bffebe26bff1be5fbf8e3f7fbf08bf69bf18bfa5bf06408bbe513fbabe"
                "a6bf03bf2ebf9dbfdd3dce3f473e853fa63ff6bff43fa7bfec3f693e1d3f0e40883fcabfe3bf96bf"
                "833fab3e6a3fe33e9d3f83bfeabf2abf503f81bf15c00bbf2e3fd43eb0be03bf07c03cbdee3f07bf"
                "cb3fa4bfedbe0abfbcbdefbf8c3fd9be11c0063fa53cb2bf74be313f153f763e41bf513e9b3f0740"
                "163f483f723f8bbee1bf16bf6ebe283ec7bd5ebf3abfe9be90bf8fbf02c035bf8bbe86bf30bfb3be"
                "c5bf8dbfb0bf83bccbbfe0be1fc0a43fd83d9dbfedbec03f88bee9bfb9be4bbf643ebcbdebbfd03c"
                "473f9d3f483edd3faa3f2a3fb93f26c0953faf3f30be403f38bf70be7abe8ebf93beebbf5bbecf3f"
                "e83fbcbdd53fae3eabbf2fbff3bda3bd173f42bfeebe7c3fb73dbe3ec1bd2b3f3a3f4bbf8f3f28bf"
                "ad3e9dbe283f8d3e123f0e3eeabd4e3e66bc54bfc7bf063fa33f77bf003f1cbf363e5f3fb63e78be"
                "f8bf5ebe23bd9b3f35bff5bd323e9d3f9abf4d3ff4bd30bfb1bf7cbf4d3f09bf77bfd9bea63f763f"
                "4c3f743f413fd8be8ebf9b3f0bbee53df3befb3ea93fd3be123e613d273f5fbc1f3d17bf163d36bf"
                "3c3f03bed13f2bbf81bf693f223fadbf254026be8e3fc4be"),
       {-0x1.b800000000000p-3f, -0x1.2a00000000000p-1f, 0x1.a800000000000p-1f,
        -0x1.da00000000000p-1f, -0x1.1000000000000p-2f, 0x1.6e00000000000p+0f,
        0x1.2600000000000p-3f, 0x1.2800000000000p+0f, -0x1.a800000000000p+0f, 0x1.2e00000000000p+1f,
        0x1.9c00000000000p-3f, 0x1.2a00000000000p+0f, 0x1.aa00000000000p-2f, 0x1.3400000000000p-3f,
        -0x1.4c00000000000p+0f, -0x1.8800000000000p-2f},
       -3.1507062911987305,
       410.65874195098877},

  };
  const int at[] = {0, 1, 15, 16, 31, 32, 63, 64, 100, 127, 128, 200, 255, 256, 300, 511};
  std::vector<float> out(512);
  for (const auto& smp : samples) {
    const auto name = traits_of(smp.type).name;
    ASSERT_EQ(smp.bytes.size(), row_bytes(smp.type, 512)) << name;
    dequantize_row(smp.type, smp.bytes.data(), out.data(), 512);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[at[i]], smp.want[i]) << name << " value " << at[i];
    double sum = 0, sum_abs = 0;
    for (float v : out) sum += v, sum_abs += std::fabs(v);
    EXPECT_NEAR(sum, smp.sum, 1e-5) << name;
    EXPECT_NEAR(sum_abs, smp.sum_abs, 1e-5) << name;
    if (is_k_quant(smp.type)) expect_ku6_split_exact(smp.type, smp.bytes, out);
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
  for (auto t :
       {tensor_type::f32, tensor_type::f16, tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0,
        tensor_type::q5_0, tensor_type::iq4_nl, tensor_type::q5_1, tensor_type::bf16}) {
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
  t->type = 23;  // IQ4_XS
  auto msg = open_error(write("k.gguf", w.bytes()));
  EXPECT_TRUE(contains(msg, "tensor 'blk.0.ffn_down.weight' has type IQ4_XS")) << msg;
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

// Llama 3's RoPE scaling as llama.cpp reads it: rope_freqs factors (one per
// rotated pair), the linear factor under "linear" or "none", the old key
// name; YaRN, attention factors, bad factors and a misshapen rope_freqs are
// refused by name.
TEST_F(GgufReader, RopeScaling) {
  {
    gguf_writer w = make_tiny_llama();
    std::vector<float> ff(8);  // head_dim 16: 8 pairs
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + static_cast<float>(i);
    std::vector<uint8_t> bytes(ff.size() * sizeof(float));
    std::memcpy(bytes.data(), ff.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", 0, {8}, bytes);
    w.set_str("llama.rope.scaling.type", "linear");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
    const auto m = model_file::open(write("r.gguf", w.bytes()));
    EXPECT_EQ(m->hparams().rope_freq_factors, ff);
    EXPECT_EQ(m->hparams().rope_freq_scale, 0.25f);
  }
  {
    gguf_writer w = make_tiny_llama();
    w.set_f32("llama.rope.scale_linear", 2.0f);  // the old key, no type: linear
    EXPECT_EQ(model_file::open(write("r.gguf", w.bytes()))->hparams().rope_freq_scale, 0.5f);
  }
  {
    gguf_writer w = make_tiny_llama();
    w.set_str("llama.rope.scaling.type", "none");
    w.set_f32("llama.rope.scaling.factor", 8.0f);  // "none" wins, as in llama.cpp
    const auto m = model_file::open(write("r.gguf", w.bytes()));
    EXPECT_EQ(m->hparams().rope_freq_scale, 1.0f);
    EXPECT_TRUE(m->hparams().rope_freq_factors.empty());
  }
  using W = gguf_writer;
  const std::vector<damage> cases = {
      {[](W& w) { w.set_str("llama.rope.scaling.type", "yarn"); }, "RoPE scaling 'yarn'"},
      {[](W& w) { w.set_f32("llama.rope.scaling.factor", -2.0f); },
       "'llama.rope.scaling.factor' is -2"},
      {[](W& w) { w.set_f32("llama.rope.scaling.attn_factor", 0.5f); },
       "'llama.rope.scaling.attn_factor'"},
      {[](W& w) { w.add_tensor("rope_freqs.weight", 0, {4}, std::vector<uint8_t>(16, 0)); },
       "'rope_freqs.weight' must be F32 of 8 values"},
      {[](W& w) { w.add_tensor("rope_freqs.weight", 0, {8}, std::vector<uint8_t>(32, 0)); },
       "'rope_freqs.weight' value 0 is 0"},
  };
  for (const auto& c : cases) {
    gguf_writer w = make_tiny_llama();
    c.apply(w);
    const auto msg = open_error(write("bad.gguf", w.bytes()));
    EXPECT_TRUE(contains(msg, c.expected)) << msg;
  }
}

// Qwen 3's MoE layout needs experts; its experts' width has its own key.
TEST_F(GgufReader, Qwen3MoeNeedsExperts) {
  tiny_llama_options o;
  o.arch = "qwen3moe";
  const auto msg = open_error(write("q.gguf", make_tiny_llama(o).bytes()));
  EXPECT_TRUE(contains(msg, "a qwen3moe file needs 'qwen3moe.expert_count' > 0")) << msg;
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
            (std::vector<std::string>{
                "smollm2-135m-instruct", "stories15m", "gemma3-270m", "moe-4x2-f32", "moe-8x2-q",
                "moe-8x2-skew", "qwen2moe-4x2-shared", "qwen3-dense", "qwen3moe-4x2", "llama3-rope",
                "kq-dense", "kq-dense2", "kq-moe", "gemma3-softcap30"}));
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
