#include "runtime/model/tensor_type.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

// Block layouts, identical to ggml's.
struct block_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct block_q8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];   // the fifth bit of each value, value j at bit j
  uint8_t qs[16];  // low nibbles: values 0..15, high nibbles: 16..31
};
struct block_q5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];   // the fifth bit of each value, value j at bit j
  uint8_t qs[16];  // low nibbles: values 0..15, high nibbles: 16..31
};
struct block_iq4_nl {
  uint16_t d;
  uint8_t qs[16];  // indices into k_iq4nl_values, nibbles as Q4_0's
};
// K-quants: 256 values per super-block (ggml's QK_K).
struct block_q4_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // eight 6-bit scales and eight 6-bit mins, packed
  uint8_t qs[128];     // per 64 values: low nibbles the first 32, high the next
};
struct block_q2_k {
  uint8_t scales[16];  // per 16 values: low nibble the scale, high the min
  uint8_t qs[64];      // 2-bit quants, four per byte (see dequantize_row)
  uint16_t d;
  uint16_t dmin;
};
struct block_q3_k {
  uint8_t hmask[32];   // the third bit of each value
  uint8_t qs[64];      // the low two bits, four per byte
  uint8_t scales[12];  // sixteen 6-bit scales (offset by 32), packed
  uint16_t d;
};
struct block_q5_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // as Q4_K's
  uint8_t qh[32];      // the fifth bit of each value
  uint8_t qs[128];     // low nibbles as Q4_K's
};
struct block_q6_k {
  uint8_t ql[128];    // low four bits
  uint8_t qh[64];     // high two bits
  int8_t scales[16];  // one per 16 values
  uint16_t d;
};
// IQ4_NL's non-linear quant values (ggml's kvalues_iq4nl).
constexpr int8_t k_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};
static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_iq4_nl) == 18);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q2_k) == 84);
static_assert(sizeof(block_q3_k) == 110);
static_assert(sizeof(block_q5_k) == 176);
static_assert(sizeof(block_q4_k) == 144);
static_assert(sizeof(block_q6_k) == 210);

// Sub-block j's 6-bit scale and min of a Q4_K block (ggml's
// get_scale_min_k4).
void q4_k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

constexpr type_traits k_f32{"F32", 1, 4};
constexpr type_traits k_f16{"F16", 1, 2};
constexpr type_traits k_q4_0{"Q4_0", 32, sizeof(block_q4_0)};
constexpr type_traits k_q4_1{"Q4_1", 32, sizeof(block_q4_1)};
constexpr type_traits k_q8_0{"Q8_0", 32, sizeof(block_q8_0)};
constexpr type_traits k_q5_0{"Q5_0", 32, sizeof(block_q5_0)};
constexpr type_traits k_iq4_nl{"IQ4_NL", 32, sizeof(block_iq4_nl)};
constexpr type_traits k_q5_1{"Q5_1", 32, sizeof(block_q5_1)};
constexpr type_traits k_q2_k{"Q2_K", 256, sizeof(block_q2_k)};
constexpr type_traits k_q3_k{"Q3_K", 256, sizeof(block_q3_k)};
constexpr type_traits k_q5_k{"Q5_K", 256, sizeof(block_q5_k)};
constexpr type_traits k_bf16{"BF16", 1, 2};
constexpr type_traits k_q4_k{"Q4_K", 256, sizeof(block_q4_k)};
constexpr type_traits k_q6_k{"Q6_K", 256, sizeof(block_q6_k)};
// The device's K-quant super-blocks: eight 28-byte blocks (packed six-bit
// quants, integer scale and offset factors) and the floats d and dm.
constexpr type_traits k_ku6{"KU6", 256, 8 * 28 + 2 * sizeof(float)};
// F32 in panels of 16 rows: a value 4 bytes, as F32.
constexpr type_traits k_f32p{"F32P", 1, 4};
// Q4_1 in panels of 16 rows: a block's 16 bytes of quants, its scale and
// min as floats.
constexpr type_traits k_q4_1p{"Q4_1P", 32, 16 + 2 * sizeof(float)};
// Q8_0 in panels of 16 rows: a block's 32 bytes of quants and its scale as
// a float.
constexpr type_traits k_q8_0p{"Q8_0P", 32, 32 + sizeof(float)};

// ggml's type numbering; empty names are numbers ggml retired.
constexpr std::array<std::string_view, 40> k_gguf_names = {
    "F32",   "F16",        "Q4_0",       "Q4_1",       "",         "",         "Q5_0",
    "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
    "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
    "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
    "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
    "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
};

void check_multiple(tensor_type t, int64_t n) {
  const auto& tr = traits_of(t);
  if (n < 0 || n % static_cast<int64_t>(tr.block_elems) != 0)
    throw std::invalid_argument("row of " + std::to_string(n) +
                                " values is not a multiple of the " + std::string(tr.name) +
                                " block size");
}

}  // namespace

std::optional<type_traits> traits_of(uint32_t gguf_type) {
  switch (gguf_type) {
    case static_cast<uint32_t>(tensor_type::f32):
      return k_f32;
    case static_cast<uint32_t>(tensor_type::f16):
      return k_f16;
    case static_cast<uint32_t>(tensor_type::q4_0):
      return k_q4_0;
    case static_cast<uint32_t>(tensor_type::q4_1):
      return k_q4_1;
    case static_cast<uint32_t>(tensor_type::q8_0):
      return k_q8_0;
    case static_cast<uint32_t>(tensor_type::q5_0):
      return k_q5_0;
    case static_cast<uint32_t>(tensor_type::iq4_nl):
      return k_iq4_nl;
    case static_cast<uint32_t>(tensor_type::q4_k):
      return k_q4_k;
    case static_cast<uint32_t>(tensor_type::q6_k):
      return k_q6_k;
    case static_cast<uint32_t>(tensor_type::q5_1):
      return k_q5_1;
    case static_cast<uint32_t>(tensor_type::q2_k):
      return k_q2_k;
    case static_cast<uint32_t>(tensor_type::q3_k):
      return k_q3_k;
    case static_cast<uint32_t>(tensor_type::q5_k):
      return k_q5_k;
    case static_cast<uint32_t>(tensor_type::bf16):
      return k_bf16;
    default:
      return std::nullopt;
  }
}

const type_traits& traits_of(tensor_type t) {
  switch (t) {
    case tensor_type::f32:
      return k_f32;
    case tensor_type::f16:
      return k_f16;
    case tensor_type::q4_0:
      return k_q4_0;
    case tensor_type::q4_1:
      return k_q4_1;
    case tensor_type::q8_0:
      return k_q8_0;
    case tensor_type::q5_0:
      return k_q5_0;
    case tensor_type::iq4_nl:
      return k_iq4_nl;
    case tensor_type::q4_k:
      return k_q4_k;
    case tensor_type::q6_k:
      return k_q6_k;
    case tensor_type::q5_1:
      return k_q5_1;
    case tensor_type::q2_k:
      return k_q2_k;
    case tensor_type::q3_k:
      return k_q3_k;
    case tensor_type::q5_k:
      return k_q5_k;
    case tensor_type::bf16:
      return k_bf16;
    case tensor_type::ku6:
      return k_ku6;
    case tensor_type::f32p:
      return k_f32p;
    case tensor_type::q4_1p:
      return k_q4_1p;
    case tensor_type::q8_0p:
      return k_q8_0p;
  }
  throw std::invalid_argument("unknown tensor_type " + std::to_string(static_cast<uint32_t>(t)));
}

size_t row_bytes(tensor_type t, int64_t n) {
  check_multiple(t, n);
  const auto& tr = traits_of(t);
  return static_cast<size_t>(n) / tr.block_elems * tr.block_bytes;
}

std::string_view gguf_type_name(uint32_t gguf_type) {
  if (gguf_type < k_gguf_names.size() && !k_gguf_names[gguf_type].empty())
    return k_gguf_names[gguf_type];
  return "unknown";
}

// The two conversions below are ggml's portable ones (from the FP16 library),
// so results match ggml bit for bit, NaN and subnormals included.
float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;

  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = std::bit_cast<float>((two_w >> 4) + exp_offset) * exp_scale;

  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | magic_mask) - magic_bias;

  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? std::bit_cast<uint32_t>(denormalized)
                                          : std::bit_cast<uint32_t>(normalized));
  return std::bit_cast<float>(result);
}

uint16_t float_to_half(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;

  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;

  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

void dequantize_row(tensor_type t, const void* src, float* dst, int64_t n) {
  check_multiple(t, n);
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (t) {
    case tensor_type::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case tensor_type::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = half_to_float(h);
      }
      return;
    case tensor_type::q4_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        block_q4_0 blk;
        std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
        const float d = half_to_float(blk.d);
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = static_cast<float>((blk.qs[j] & 0x0F) - 8) * d;
          y[j + 16] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
        }
      }
      return;
    case tensor_type::q4_1:
      for (int64_t b = 0; b < n / 32; ++b) {
        block_q4_1 blk;
        std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
        const float d = half_to_float(blk.d);
        const float m = half_to_float(blk.m);
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = static_cast<float>(blk.qs[j] & 0x0F) * d + m;
          y[j + 16] = static_cast<float>(blk.qs[j] >> 4) * d + m;
        }
      }
      return;
    case tensor_type::q8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        block_q8_0 blk;
        std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
        const float d = half_to_float(blk.d);
        float* y = dst + b * 32;
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(blk.qs[j]) * d;
      }
      return;
    case tensor_type::q5_0:
    case tensor_type::iq4_nl:
      for (int64_t b = 0; b < n / 32; ++b) {
        uint16_t d;
        int8_t q[32];
        widen_block_to_q8_0(t, src, b, d, q);
        const float scale = half_to_float(d);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<float>(q[j]) * scale;
      }
      return;
    case tensor_type::q2_k:
    case tensor_type::q3_k:
    case tensor_type::q4_k:
    case tensor_type::q5_k:
    case tensor_type::q6_k:
      // s u + m with one rounding is ggml's float (split_k_quant says why).
      for (int64_t b = 0; b < n / 256; ++b) {
        uint8_t u[256];
        float sc[16], m[16];
        split_k_quant(t, src, b, u, sc, m);
        for (int i = 0; i < 256; ++i)
          dst[b * 256 + i] = std::fma(sc[i / 16], static_cast<float>(u[i]), m[i / 16]);
      }
      return;
    case tensor_type::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      }
      return;
    case tensor_type::q5_1:
      for (int64_t b = 0; b < n / 32; ++b) {
        float d, m;
        uint8_t u[32];
        split_q5_1(bytes, b, d, m, u);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<float>(u[j]) * d + m;
      }
      return;
    case tensor_type::ku6:
    case tensor_type::f32p:
    case tensor_type::q4_1p:
    case tensor_type::q8_0p:
      break;  // device layouts, never a file's
  }
  throw std::invalid_argument("dequantize_row: unknown tensor_type");
}

void split_q5_1(const void* row, int64_t b, float& d, float& m, uint8_t u[32]) {
  block_q5_1 blk;
  std::memcpy(&blk, static_cast<const uint8_t*>(row) + b * sizeof(blk), sizeof(blk));
  d = half_to_float(blk.d);
  m = half_to_float(blk.m);
  uint32_t qh;
  std::memcpy(&qh, blk.qh, 4);
  for (int j = 0; j < 16; ++j) {
    u[j] = static_cast<uint8_t>((blk.qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
    u[j + 16] = static_cast<uint8_t>((blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
}

void split_q4_k_to_q4_1(const void* row, int64_t sb, float d[8], float m[8], uint8_t qs[8][16]) {
  block_q4_k blk;
  std::memcpy(&blk, static_cast<const uint8_t*>(row) + sb * sizeof(blk), sizeof(blk));
  const float dd = half_to_float(blk.d), dmin = half_to_float(blk.dmin);
  for (int j = 0; j < 8; ++j) {
    int sc = 0, mn = 0;
    q4_k_scale_min(j, blk.scales, sc, mn);
    d[j] = dd * static_cast<float>(sc);
    m[j] = -(dmin * static_cast<float>(mn));
    // Sub-block j sits in the low (even j) or high (odd j) nibbles of the
    // 32 bytes of its pair.
    const uint8_t* q = blk.qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int i = 0; i < 16; ++i)
      qs[j][i] =
          static_cast<uint8_t>(((q[i] >> shift) & 0x0F) | (((q[i + 16] >> shift) & 0x0F) << 4));
  }
}

bool widens_to_q8_0(tensor_type t) {
  return t == tensor_type::q5_0 || t == tensor_type::iq4_nl;
}

void widen_block_to_q8_0(tensor_type t, const void* row, int64_t b, uint16_t& d, int8_t q[32]) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  if (t == tensor_type::q5_0) {
    block_q5_0 blk;
    std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    d = blk.d;
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>(((blk.qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16);
      q[j + 16] = static_cast<int8_t>(((blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
    }
    return;
  }
  if (t == tensor_type::iq4_nl) {
    block_iq4_nl blk;
    std::memcpy(&blk, bytes + b * sizeof(blk), sizeof(blk));
    d = blk.d;
    for (int j = 0; j < 16; ++j) {
      q[j] = k_iq4nl_values[blk.qs[j] & 0x0F];
      q[j + 16] = k_iq4nl_values[blk.qs[j] >> 4];
    }
    return;
  }
  throw std::invalid_argument(std::string(traits_of(t).name) + " does not widen to Q8_0");
}

bool is_k_quant(tensor_type t) {
  switch (t) {
    case tensor_type::q2_k:
    case tensor_type::q3_k:
    case tensor_type::q4_k:
    case tensor_type::q5_k:
    case tensor_type::q6_k:
      return true;
    default:
      return false;
  }
}

void split_k_quant(tensor_type t, const void* row, int64_t sb, uint8_t u[256], float s[16],
                   float m[16]) {
  float d = 0, dm = 0;
  int8_t sc[16], mn[16];
  k_quant_factors(t, row, sb, d, dm, sc, mn);
  for (int g = 0; g < 16; ++g) {
    s[g] = d * static_cast<float>(sc[g]);
    m[g] = dm * static_cast<float>(mn[g]);
  }
  k_quant_quants(t, row, sb, u);
}

void k_quant_quants(tensor_type t, const void* row, int64_t sb, uint8_t u[256]) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  switch (t) {
    // The quants of 128 values share 32 bytes (Q2_K, Q3_K: two bits a value,
    // the shift picking the group of 32; Q4_K, Q5_K, Q6_K: low, then high
    // nibbles), with a bit plane of the high bits (Q3_K, Q5_K) or two
    // (Q6_K's qh); ggml's dequantize_row_* read them so.
    case tensor_type::q2_k: {  // group g of 16: q
      block_q2_k blk;
      std::memcpy(&blk, bytes + sb * sizeof(blk), sizeof(blk));
      for (int g = 0; g < 16; ++g) {
        const uint8_t* q = blk.qs + (g / 8) * 32 + (g % 2) * 16;
        const int shift = ((g / 2) % 4) * 2;
        for (int l = 0; l < 16; ++l) u[g * 16 + l] = static_cast<uint8_t>((q[l] >> shift) & 3);
      }
      return;
    }
    case tensor_type::q3_k: {  // (q - 4 or q) + 4: the two bits and the hmask bit
      block_q3_k blk;
      std::memcpy(&blk, bytes + sb * sizeof(blk), sizeof(blk));
      for (int g = 0; g < 16; ++g) {
        const uint8_t* q = blk.qs + (g / 8) * 32 + (g % 2) * 16;
        const uint8_t* hm = blk.hmask + (g % 2) * 16;
        const int shift = ((g / 2) % 4) * 2;
        const uint8_t bit = static_cast<uint8_t>(1u << (g / 2));
        for (int l = 0; l < 16; ++l)
          u[g * 16 + l] = static_cast<uint8_t>(((q[l] >> shift) & 3) + ((hm[l] & bit) ? 4 : 0));
      }
      return;
    }
    case tensor_type::q4_k:
    case tensor_type::q5_k: {  // sub-block j of 32: a nibble, and Q5_K's qh bit j
      const bool five = t == tensor_type::q5_k;
      block_q5_k blk5{};
      block_q4_k blk4{};
      if (five)
        std::memcpy(&blk5, bytes + sb * sizeof(blk5), sizeof(blk5));
      else
        std::memcpy(&blk4, bytes + sb * sizeof(blk4), sizeof(blk4));
      for (int j = 0; j < 8; ++j) {
        const uint8_t* ql = (five ? blk5.qs : blk4.qs) + (j / 2) * 32;
        const int shift = (j % 2) * 4;
        const uint8_t bit = static_cast<uint8_t>(1u << j);
        for (int l = 0; l < 32; ++l)
          u[j * 32 + l] = static_cast<uint8_t>(((ql[l] >> shift) & 0xF) |
                                               ((five && (blk5.qh[l] & bit)) ? 16 : 0));
      }
      return;
    }
    case tensor_type::q6_k: {  // four runs of 32 per 128
      block_q6_k blk;
      std::memcpy(&blk, bytes + sb * sizeof(blk), sizeof(blk));
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = blk.ql + half * 64;
        const uint8_t* qh = blk.qh + half * 32;
        uint8_t* y = u + half * 128;
        for (int l = 0; l < 32; ++l) {
          y[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
          y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
          y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
          y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
      }
      return;
    }
    default:
      throw std::invalid_argument("k_quant_quants: " + std::string(traits_of(t).name) +
                                  " is not a K-quant");
  }
}

void k_quant_factors(tensor_type t, const void* row, int64_t sb, float& d, float& dm, int8_t sc[16],
                     int8_t mn[16]) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  switch (t) {
    case tensor_type::q2_k: {
      block_q2_k blk;
      std::memcpy(&blk, bytes + sb * sizeof(blk), sizeof(blk));
      d = half_to_float(blk.d);
      dm = -half_to_float(blk.dmin);
      for (int g = 0; g < 16; ++g) {
        sc[g] = static_cast<int8_t>(blk.scales[g] & 0xF);
        mn[g] = static_cast<int8_t>(blk.scales[g] >> 4);
      }
      return;
    }
    case tensor_type::q3_k: {
      block_q3_k blk;
      std::memcpy(&blk, bytes + sb * sizeof(blk), sizeof(blk));
      d = half_to_float(blk.d);
      dm = -4.0f * d;
      // Scale g: its low four bits in byte g % 8 (low nibble for g < 8,
      // high for the rest), its top two in byte 8 + g % 4 at bits 2 (g / 4).
      const uint8_t* s = blk.scales;
      for (int g = 0; g < 16; ++g) {
        const int low = g < 8 ? s[g] & 0xF : s[g - 8] >> 4;
        const int high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = mn[g] = static_cast<int8_t>((low | (high << 4)) - 32);
      }
      return;
    }
    case tensor_type::q4_k:
    case tensor_type::q5_k: {  // the same header: d, dmin, twelve bytes of scales
      block_q4_k blk;
      std::memcpy(&blk, bytes + sb * traits_of(t).block_bytes, sizeof(blk));
      d = half_to_float(blk.d);
      dm = -half_to_float(blk.dmin);
      for (int j = 0; j < 8; ++j) {
        int s = 0, m = 0;
        q4_k_scale_min(j, blk.scales, s, m);
        sc[2 * j] = sc[2 * j + 1] = static_cast<int8_t>(s);
        mn[2 * j] = mn[2 * j + 1] = static_cast<int8_t>(m);
      }
      return;
    }
    case tensor_type::q6_k: {
      block_q6_k blk;
      std::memcpy(&blk, bytes + sb * sizeof(blk), sizeof(blk));
      d = half_to_float(blk.d);
      dm = -32.0f * d;
      for (int g = 0; g < 16; ++g) sc[g] = mn[g] = blk.scales[g];
      return;
    }
    default:
      throw std::invalid_argument("k_quant_factors: " + std::string(traits_of(t).name) +
                                  " is not a K-quant");
  }
}

}  // namespace troupe
