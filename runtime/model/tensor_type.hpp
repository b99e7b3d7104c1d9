#pragma once
// Tensor element types, numbered as GGUF numbers them, with their block
// geometry.  Quantized types store rows as blocks of `block_elems` values.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe {

enum class tensor_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  iq4_nl = 20,
  bf16 = 30,
  // Not a GGUF type: K-quant weights as the device holds them
  // (device_weights, kernels/common.cl): each value an unsigned six-bit u
  // (packed) with integer scale and offset factors per 16 values and two
  // floats per 256, value = s u + m (7.25 bits a value).
  ku6 = 0x10000,
  // Not a GGUF type: F32 weights in panels of 16 rows, each panel column
  // by column (device_weights, kernels/matmul_panels.cl).
  f32p = 0x10001,
  // Not a GGUF type: Q4_1 weights in panels of 16 rows, each block's
  // quants interleaved by four bytes a row, then its 16 scales and 16 mins
  // as floats (device_weights, kernels/matmul_panels.cl).
  q4_1p = 0x10002,
  // Not a GGUF type: Q8_0 weights in panels of 16 rows, each block's
  // quants plus 128 interleaved by four bytes a row, then its 16 scales as
  // floats (device_weights, kernels/matmul_panels.cl).
  q8_0p = 0x10003,
};

struct type_traits {
  std::string_view name;
  size_t block_elems;  // values per block
  size_t block_bytes;  // bytes per block
};

// Traits of a supported type; nullopt for a GGUF type number troupe cannot run.
std::optional<type_traits> traits_of(uint32_t gguf_type);
const type_traits& traits_of(tensor_type t);

// Bytes of a row of n values (n must be a multiple of the block size).
size_t row_bytes(tensor_type t, int64_t n);

// Name of any GGUF type number, including ones troupe does not run ("Q4_K").
std::string_view gguf_type_name(uint32_t gguf_type);

// IEEE half <-> float, bit-exact with ggml's conversions.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// Dequantize one row of n values (reference path, used by tests and loaders).
void dequantize_row(tensor_type t, const void* src, float* dst, int64_t n);

// Q5_0 and IQ4_NL blocks are Q8_0 blocks with fewer distinct quants: the
// same 32 values times the same half scale, the quants within int8 (Q5_0:
// q - 16; IQ4_NL: its non-linear table's entries).  llama.cpp computes
// both against Q8_0 activations exactly as Q8_0 weights, so a device that
// holds them as Q8_0 gives llama.cpp's numerics (IQ4_NL always; Q5_0
// beside Q8_0 in one matrix, or in a QK-norm model's QKV: the device
// holds Q5_0 packed otherwise, its kernels rebuilding these quants).
bool widens_to_q8_0(tensor_type t);
// Block `b` of such a row: its half scale's bits and its 32 quants.
void widen_block_to_q8_0(tensor_type t, const void* row, int64_t b, uint16_t& d, int8_t q[32]);

// A Q4_K super-block (256 values) is eight Q4_1 blocks: sub-block j's
// values are d*sc_j*q - dmin*m_j with 6-bit sc_j and m_j, so as Q4_1 its
// scale is d*sc_j and its min -dmin*m_j, both exact in float (an 11-bit
// half times a 6-bit integer).  Super-block `sb` of a row as eight such
// blocks: scales, mins and quants in Q4_1's nibble order (low nibbles
// values 0..15, high 16..31).
void split_q4_k_to_q4_1(const void* row, int64_t sb, float d[8], float m[8], uint8_t qs[8][16]);

// Block `b` of a Q5_1 row as its scale d, min m and 32 five-bit quants u
// (the high bits joined to the nibbles), value j = d * u[j] + m.  A
// QKV's V rows are held so (a byte per value; other Q5_1 rows packed):
// llama.cpp's Q5_1 x Q8_1 dot product is Q4_1's with these u.
void split_q5_1(const void* row, int64_t b, float& d, float& m, uint8_t u[32]);

// Q2_K, Q3_K, Q4_K, Q5_K or Q6_K: 256-value super-blocks, products
// against Q8_K activations in llama.cpp.
bool is_k_quant(tensor_type t);

// Such a super-block as 256 unsigned quants u (at most 63) with a scale s
// and an offset m per 16 values: value i is s[i / 16] * u[i] + m[i / 16]
// with one rounding (fma), which is the float ggml's dequantize_row_*
// give (a zero may differ in sign; dequantize_row reads K-quants so), since s * u is exact in float
// (an 11-bit half times a scale of at most 8 bits times u).  u is the file's quant made
// non-negative: Q6_K's q (value d sc (q - 32): m = -32 s), Q3_K's q + 4
// (m = -4 s), Q2_K's, Q4_K's and Q5_K's q (m = -dmin min).
void split_k_quant(tensor_type t, const void* row, int64_t sb, uint8_t u[256], float s[16],
                   float m[16]);

// The same super-block's s and m as the file factors them: s[g] = d *
// sc[g] and m[g] = dm * mn[g] (one float product each, of the half d or
// dmin, or a power-of-two multiple of d, and a small integer: Q6_K's
// m = (-32 d) sc, Q3_K's (-4 d) (sc - 32), the others' (-dmin) min), so a
// device holding d, dm and the integers rebuilds split_k_quant's floats
// bit for bit: split_k_quant computes them from these factors.
void k_quant_factors(tensor_type t, const void* row, int64_t sb, float& d, float& dm, int8_t sc[16],
                     int8_t mn[16]);

// Only the super-block's quants u, as split_k_quant gives them.
void k_quant_quants(tensor_type t, const void* row, int64_t sb, uint8_t u[256]);

}  // namespace troupe
