// Helpers shared by every kernel file (embedded first, see cmake/embed_kernels.cmake).
// Quantized weights live on the device in their file's type or one holding
// exactly its values (runtime/device/device_weights), split into
// structure-of-arrays form at upload so blocks load with aligned vector reads:
//   f32, f16, bf16: the file's values, row after row
//   q4_0: quants uchar[rows][blocks][16], d float[rows][blocks]
//   q4_1: quants as q4_0, d and m float[rows][blocks]
//   q8_0: quants char[rows][blocks][32], d float[rows][blocks]
//   q5_0: quants as q4_0 (the low four bits), d as q8_0, the fifth bits
//     uint[rows][blocks] in m (bit i: value i's), as the file packs them;
//     a QKV's V rows (matmul.cl's QKV kernels) as q8_0 at q8_0's places
//     (block k's quants at 32 k: its q and k rows' blocks leave a gap)
//   q5_1: 20 bytes a block in quants, uchar[rows][blocks][20]: the low four
//     bits as q4_1's 16 bytes, then the 32 fifth bits (uint, bit i value
//     i's), as the file packs them; d and m as q4_1.  A QKV's V rows
//     (matmul.cl's QKV kernels; Q5_1, or Q8_0 beside Q5_1 q and k, a Q5_K_M
//     file's attn_v) as five or eight bits a byte, char[32] at 32 k for
//     block k (after the q and k rows' blocks, a gap), Q8_0's signed
//     quants with m = 0: value d q + 0, and d dx sum(q qx) + 0 s in the Q
//     products, Q8_0's own values and sums
//   ku6 (K-quants, runtime/model/tensor_type.hpp): 28 bytes a block,
//     uchar[rows][blocks][28]: the six-bit u packed (the low four bits as
//     q4_1's 16 bytes, then two uints of the top two bits: ku6_u below
//     says where), then the char scale factors sc of values 0-15 and
//     16-31 and their offset factors mn; d float2[rows][blocks / 8] (per
//     super-block of 256: d, dm); value = s u + m with s = d sc, m = dm mn
//     (ku6_sm), split_k_quant's floats bit for bit
// The quants are the file's bits (a QKV's V rows: a byte a value); the half
// scales are widened to float at upload (exactly), because converting a half costs a dozen instructions
// per block on a device without cl_khr_fp16.
// A block holds 32 values; for 4-bit types the low nibbles of the 16 bytes
// are values 0..15 and the high nibbles values 16..31 (ggml's order).

#define QK 32

// Forced inlining: a helper's private arrays are registers of its caller
// only once inlined (PoCL keeps large functions called twice out of line,
// and their arrays go through memory).
#define INLINE inline __attribute__((always_inline))

inline float hsum16(float16 v) {
  float8 a = v.lo + v.hi;
  float4 b = a.lo + a.hi;
  float2 c = b.lo + b.hi;
  return c.x + c.y;
}

// hsum16 of a tile's TT accumulators at once, each sum's additions paired
// exactly as hsum16 pairs them (so bit for bit its results): lanes i and
// i + 8, then i and i + 4, i and i + 2, 0 and 1, with the accumulators'
// halves packed side by side, so that 8 sums take about half the
// instructions of 8 hsum16 (measured on stories15M's 288-wide rows, where
// the sums are a third of a tile's work).
INLINE void hsum16_tile(const float16* a, float* s, const int TT) {
  if (TT == 8 || TT == 4) {
    float8 w[8];
    _Pragma("unroll") for (int j = 0; j < TT; ++j) w[j] = a[j].lo + a[j].hi;
    float8 p[4];
    _Pragma("unroll") for (int k = 0; k < TT / 2; ++k) p[k] =
        (float8)(w[2 * k].lo, w[2 * k + 1].lo) + (float8)(w[2 * k].hi, w[2 * k + 1].hi);
    float8 q[2];
    _Pragma("unroll") for (int m = 0; m < TT / 4; ++m) q[m] =
        (float8)(p[2 * m].s01, p[2 * m].s45, p[2 * m + 1].s01, p[2 * m + 1].s45) +
        (float8)(p[2 * m].s23, p[2 * m].s67, p[2 * m + 1].s23, p[2 * m + 1].s67);
    if (TT == 8) {
      const float8 r = (float8)(q[0].even, q[1].even) + (float8)(q[0].odd, q[1].odd);
      s[0] = r.s0, s[1] = r.s1, s[2] = r.s2, s[3] = r.s3;
      s[4] = r.s4, s[5] = r.s5, s[6] = r.s6, s[7] = r.s7;
    } else {
      const float4 r = q[0].even + q[0].odd;
      s[0] = r.s0, s[1] = r.s1, s[2] = r.s2, s[3] = r.s3;
    }
  } else {
    _Pragma("unroll") for (int j = 0; j < TT; ++j) s[j] = hsum16(a[j]);
  }
}

// A hint to bring the cache line at p in (prefetcht0; never faults, so
// an address past a buffer's end is harmless).
#if defined(TROUPE_AVX512) || defined(TROUPE_AVX2)
#define PREFETCH(p) __asm__ volatile("prefetcht0 (%0)" ::"r"((ulong)(p)))
#else
#define PREFETCH(p)
#endif

// Float -> half bits, rounded to nearest even as vstore_half rounds:
// PoCL's vstore_half is a software routine with branches.  With F16C
// (every AVX2 and AVX-512 host; inline assembly for the reason dpbusd
// below gives) one vcvtps2ph, which rounds as IEEE does, subnormal halves
// included.  (PoCL's event profile showed the QKV kernel's stores as most
// of its time; wall-clock A/B in one run showed no change in pp512.)
#if defined(TROUPE_AVX512) || defined(TROUPE_AVX2)
inline ushort float_to_half_bits(float f) {
  const float4 v = (float4)(f);
  ushort8 h;
  __asm__("vcvtps2ph $0, %1, %0" : "=x"(h) : "x"(v));
  return h.s0;
}
#define STORE_HALF(v, i, p) (((__global ushort*)(p))[i] = float_to_half_bits(v))
#else
#define STORE_HALF(v, i, p) vstore_half(v, i, p)
#endif

// exp(x) by the same arithmetic in every width (float, float4, float8):
// the gated FFN takes SiLU over a tile's sums in vectors (silu_mul_tile),
// and a token's result must not depend on its tile, while PoCL's vector
// exp and its scalar one round differently.  x = n ln 2 + r with |r| <=
// ln 2 / 2 (ln 2 in two parts, Cody and Waite, so r is exact to a few
// ulps), e^r by its Taylor series to r^7 (truncation 5e-9, under half an
// ulp), times 2^n built in the exponent bits.  x is clamped to [-87, 88],
// where 2^n stays a normal float.  For SiLU that changes nothing a model
// meets: past 87, 1 + e^-x is 1 to a float; below -88 a gate x gets x
// e^-88 (about 6e-39 x) instead of x e^x, both 0 for any sane x.
#define TROUPE_EXP_POLY(FT, IT)                                    \
  INLINE FT exp_poly_##FT(FT x) {                                  \
    x = clamp(x, -87.0f, 88.0f);                                   \
    const FT n = rint(x * 1.44269504088896341f);                   \
    FT r = fma(n, (FT)(-0.693359375f), x);                         \
    r = fma(n, (FT)(2.12194440e-4f), r);                           \
    FT p = (FT)(1.0f / 5040.0f);                                   \
    p = fma(p, r, (FT)(1.0f / 720.0f));                            \
    p = fma(p, r, (FT)(1.0f / 120.0f));                            \
    p = fma(p, r, (FT)(1.0f / 24.0f));                             \
    p = fma(p, r, (FT)(1.0f / 6.0f));                              \
    p = fma(p, r, (FT)(0.5f));                                     \
    p = fma(p, r, (FT)(1.0f));                                     \
    p = fma(p, r, (FT)(1.0f));                                     \
    return p * as_##FT((convert_##IT(n) + (IT)(127)) << (IT)(23)); \
  }                                                                \
  INLINE FT silu_##FT(FT x) {                                      \
    return x / ((FT)(1.0f) + exp_poly_##FT(-x));                   \
  }
TROUPE_EXP_POLY(float, int)
TROUPE_EXP_POLY(float4, int4)
TROUPE_EXP_POLY(float8, int8)

// g[j] = silu(g[j]) * u[j] for a tile's TT sums, eight or four at a time
// in vectors: one vector exp instead of TT scalar ones, which were a
// quarter of the gated FFN's time in a 32-row decode step (SmolLM2, whose
// dot products are only 576 long).  TT is a constant where this is
// inlined, so the branches fold; every width computes the same bits.
INLINE void silu_mul_tile(float* g, const float* u, const int TT) {
  int j = 0;
  for (; j + 8 <= TT; j += 8) vstore8(silu_float8(vload8(0, g + j)) * vload8(0, u + j), 0, g + j);
  for (; j + 4 <= TT; j += 4) vstore4(silu_float4(vload4(0, g + j)) * vload4(0, u + j), 0, g + j);
  for (; j < TT; ++j) g[j] = silu_float(g[j]) * u[j];
}

// Half -> float from the raw bits, branch-free: PoCL's vload_half is a
// software routine with branches (no cl_khr_fp16 on its CPU device), a
// dozen instructions per value on the F16 weight and KV paths.  Shifting
// the 15 magnitude bits into a float's position and scaling by 2^112 is
// exact for normal and subnormal halves alike; inf and NaN do not occur in
// weights, scales or KV values.  With TROUPE_AVX512 (a PoCL CPU device on an AVX-512 host, see dpbusd
// below for why inline assembly) it is one vcvtph2ps, exact as well.
#ifdef TROUPE_AVX512
inline float16 half_bits_to_float16(ushort16 h) {
  float16 f;
  __asm__("vcvtph2ps %1, %0" : "=v"(f) : "v"(h));
  return f;
}
#elif defined(TROUPE_AVX2)
// F16C (every AVX2 host has it): eight halves per vcvtph2ps.
inline float8 half_bits_to_float8(ushort8 h) {
  float8 f;
  __asm__("vcvtph2ps %1, %0" : "=x"(f) : "x"(h));
  return f;
}
inline float16 half_bits_to_float16(ushort16 h) {
  return (float16)(half_bits_to_float8(h.lo), half_bits_to_float8(h.hi));
}
#else
inline float16 half_bits_to_float16(ushort16 h) {
  const float16 f = as_float16(convert_uint16(h & (ushort16)0x7fff) << 13) * 0x1.0p112f;
  return as_float16(as_uint16(f) | (convert_uint16(h & (ushort16)0x8000) << 16));
}
#endif

// Loaders: the 32 values of block b of row r, as two float16 halves.
// K is the row length in values, nb = K / 32 blocks per row.
// Row t's token: tokens[t], or where negative (-1 - k) the device's draw
// k of the step before (draw.cl; step overlap on the device), token 0
// where that draw was refused (as the host fills a refused placeholder).
INLINE int token_at(__global const int* tokens, __global const int* drawn, int t) {
  const int tok = tokens[t];
  return tok >= 0 ? tok : max(drawn[-1 - tok], 0);
}

inline void load_f32(__global const uchar* wq, __global const float* wd, __global const float* wm,
                     int K, int nb, int r, int b, float16* lo, float16* hi) {
  __global const float* w = (__global const float*)wq + (size_t)r * K + b * QK;
  *lo = vload16(0, w);
  *hi = vload16(1, w);
}

inline void load_f16(__global const uchar* wq, __global const float* wd, __global const float* wm,
                     int K, int nb, int r, int b, float16* lo, float16* hi) {
  __global const ushort* w = (__global const ushort*)wq + (size_t)r * K + b * QK;
  *lo = half_bits_to_float16(vload16(0, w));
  *hi = half_bits_to_float16(vload16(1, w));
}

// A bfloat16 is a float's top half.
inline void load_bf16(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  __global const ushort* w = (__global const ushort*)wq + (size_t)r * K + b * QK;
  *lo = as_float16(convert_uint16(vload16(0, w)) << 16);
  *hi = as_float16(convert_uint16(vload16(1, w)) << 16);
}

inline void load_q4_0(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  size_t blk = (size_t)r * nb + b;
  uchar16 q = vload16(blk, wq);
  float d = wd[blk];
  *lo = (convert_float16(q & (uchar16)0xF) - 8.0f) * d;
  *hi = (convert_float16(q >> (uchar16)4) - 8.0f) * d;
}

inline void load_q4_1(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  size_t blk = (size_t)r * nb + b;
  uchar16 q = vload16(blk, wq);
  float d = wd[blk];
  float m = wm[blk];
  *lo = fma(convert_float16(q & (uchar16)0xF), (float16)d, (float16)m);
  *hi = fma(convert_float16(q >> (uchar16)4), (float16)d, (float16)m);
}

// The fifth bits h of a block's lanes (q4_1's nibble order: lane j values
// 4j..4j+3, bits h >> 4j) as 16 in each byte whose bit is set (q5_0_bytes
// below says how four bits spread to four bytes).
INLINE int8 q5_high(uint h) {
  const int8 sh = (int8)(0, 4, 8, 12, 16, 20, 24, 28);
  return (((((int8)(int)h >> sh) & 15) * 0x00204081) & 0x01010101) << 4;
}

// A packed Q5_1 block's five-bit u (0..31) as lanes of four bytes.
INLINE int8 q5_1_u(__global const uchar* wq, size_t blk) {
  __global const uchar* p = wq + blk * 20;
  const int4 q = vload4(0, (__global const int*)p);
  const uint h = *(__global const uint*)(p + 16);
  return (int8)(q & (int4)0x0F0F0F0F, (q >> 4) & (int4)0x0F0F0F0F) | q5_high(h);
}

// A ku6 block's six-bit u (0..63) as lanes of four bytes: the nibbles as
// q4_1's, the top two bits from the uints h.x (values 0-15) and h.y
// (16-31), whose byte k holds at bits 2j, 2j + 1 those of value 4j + k
// (lane j's byte k), so one variable shift a lane brings them to bits 4-5.
INLINE int8 ku6_u(__global const uchar* wq, size_t blk) {
  __global const uchar* p = wq + blk * 28;
  const int4 q = vload4(0, (__global const int*)p);
  const uint2 h = vload2(0, (__global const uint*)(p + 16));
  const int8 top = as_int8((uint8)(h.xxxx, h.yyyy) >> (uint8)(0, 2, 4, 6, 0, 2, 4, 6));
  return (int8)(q & (int4)0x0F0F0F0F, (q >> 4) & (int4)0x0F0F0F0F) |
         ((top << 4) & (int8)0x30303030);
}

// A ku6 block's scales and offsets (s0, s1, m0, m1): its integer factors
// times its super-block's floats, each product exact (k_quant_factors).
INLINE float4 ku6_sm(__global const uchar* wq, __global const float* wd, size_t blk) {
  const char4 f = vload4(0, (__global const char*)(wq + blk * 28 + 24));
  return convert_float4(f) * vload2(blk / 8, wd).xxyy;
}

// Q5_1 is Q4_1 with a fifth bit: value = d u + m, one rounding (fma).
inline void load_q5_1(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  const size_t blk = (size_t)r * nb + b;
  const float d = wd[blk], m = wm[blk];
  const int8 u = q5_1_u(wq, blk);
  *lo = fma(convert_float16(as_uchar16(u.lo)), (float16)d, (float16)m);
  *hi = fma(convert_float16(as_uchar16(u.hi)), (float16)d, (float16)m);
}

// A Q5_1 QKV's V rows (a byte a value): read signed, so that Q8_0 rows
// held there (m = 0) give d q exactly, and Q5_1's five-bit u the same.
inline void load_q5_1_v(__global const uchar* wq, __global const float* wd, __global const float* wm,
                        int K, int nb, int r, int b, float16* lo, float16* hi) {
  const size_t blk = (size_t)r * nb + b;
  const float d = wd[blk], m = wm[blk];
  __global const char* q = (__global const char*)wq;
  *lo = fma(convert_float16(vload16(2 * blk, q)), (float16)d, (float16)m);
  *hi = fma(convert_float16(vload16(2 * blk + 1, q)), (float16)d, (float16)m);
}

// Q5_0 as the signed bytes u - 16 (u: a value's five bits), the quants
// Q8_0 holds for the same values, so that its products are Q8_0's
// (dot_signed, no offset term): llama.cpp's formula, and the sums of the
// Q8_0 it was widened to before, bit for bit, from 24 bytes a block
// instead of 36 (decode streams the weights once a token).  Lane j of a
// block (q4_0's nibble order) holds values 4j..4j+3, whose fifth bits are
// h >> 4j: a byte whose bit is clear gets 0xF0 over its nibble (the
// nibble minus 16).  n * 0x00204081 & 0x01010101 puts bit k of a nibble n
// at bit 8k (n + n << 7 + n << 14 + n << 21: no two overlap).
INLINE int8 q5_0_bytes(int8 nib, uint h) {
  const int8 sh = (int8)(0, 4, 8, 12, 16, 20, 24, 28);
  const int8 clear = ((((int8)(int)~h >> sh) & 15) * 0x00204081) & 0x01010101;
  return nib | as_int8(as_uint8(clear) * 0xF0u);  // unsigned: byte 3's 0xF0 sets the sign
}
INLINE int16 q5_0_bytes2(int16 nib, uint2 h) {
  const int16 sh = (int16)(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  const int16 hv = (int16)((int8)(int)~h.x, (int8)(int)~h.y);
  const int16 clear = (((hv >> sh) & 15) * 0x00204081) & 0x01010101;
  return nib | as_int16(as_uint16(clear) * 0xF0u);
}

// Q5_0 (q5_0_bytes): d q as q8_0's values, the same floats.
inline void load_q5_0(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  const size_t blk = (size_t)r * nb + b;
  const uchar16 q = vload16(blk, wq);
  const int8 u = q5_0_bytes((int8)(as_int4(q & (uchar16)0xF), as_int4(q >> (uchar16)4)),
                            ((__global const uint*)wm)[blk]);
  const float d = wd[blk];
  *lo = convert_float16(as_char16(u.lo)) * d;
  *hi = convert_float16(as_char16(u.hi)) * d;
}

inline void load_q8_0(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  size_t blk = (size_t)r * nb + b;
  __global const char* q = (__global const char*)wq + blk * QK;
  float d = wd[blk];
  *lo = convert_float16(vload16(0, q)) * d;
  *hi = convert_float16(vload16(1, q)) * d;
}

// One rounding (fma) of s u + m: the file's value, as dequantize_row has it.
inline void load_ku6(__global const uchar* wq, __global const float* wd, __global const float* wm,
                     int K, int nb, int r, int b, float16* lo, float16* hi) {
  const size_t blk = (size_t)r * nb + b;
  const float4 sm = ku6_sm(wq, wd, blk);
  const int8 u = ku6_u(wq, blk);
  *lo = fma(convert_float16(as_uchar16(u.lo)), (float16)sm.x, (float16)sm.z);
  *hi = fma(convert_float16(as_uchar16(u.hi)), (float16)sm.y, (float16)sm.w);
}

// x rounded to the nearest half-precision value (ties to even), returned as
// float: what a round trip through a half buffer gives, without one
// (OpenCL C 1.2 offers no half arithmetic).  Overflow is not handled: the
// callers round probabilities and activations far below 65504.
inline float round_to_half(float x) {
  const float ax = fabs(x);
  if (ax < 6.103515625e-05f) return rint(x * 16777216.0f) / 16777216.0f;  // half subnormals: 2^-24 steps
  uint u = as_uint(x);
  u += 0x0FFFu + ((u >> 13) & 1u);
  return as_float(u & ~0x1FFFu);
}

// GELU (tanh form) as ggml's CPU backend computes it, through its half
// table: x rounded to half, gelu in float, the result rounded to half
// (ggml_vec_geglu_f32 with GGML_GELU_FP16); saturated outside +-10.
inline float gelu_ggml(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float h = round_to_half(x);
  return round_to_half(0.5f * h *
                       (1.0f + tanh(0.79788456080286535587989211986876f * h *
                                    (1.0f + 0.044715f * h * h))));
}

// The same through the host's table of every half's GELU (the engine's
// gelu_half_table, ggml's ggml_table_gelu_f16): a lookup instead of a
// scalar tanh.  Without F16C (no float_to_half_bits) it computes.
#if defined(TROUPE_AVX512) || defined(TROUPE_AVX2)
inline float gelu_from_table(__global const ushort* tab, float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const ushort8 h = (ushort8)(tab[float_to_half_bits(x)]);
  float4 f;
  __asm__("vcvtph2ps %1, %0" : "=x"(f) : "x"(h));
  return f.s0;
}
#else
#define gelu_from_table(tab, x) gelu_ggml(x)
#endif

inline float16 round_to_half16(float16 v) {
  const float16 sub = rint(v * 16777216.0f) / 16777216.0f;  // half subnormals: 2^-24 steps
  uint16 u = as_uint16(v);
  u += (uint16)0x0FFFu + ((u >> 13) & (uint16)1u);
  const float16 nrm = as_float16(u & (uint16)~0x1FFFu);
  return select(nrm, sub, isless(fabs(v), (float16)6.103515625e-05f));
}

// Integer dot products (matmul.cl's Q kernels).  The 32 values of a weight
// block as bytes u (packed in an int8) with its scale and offset
// coefficient, so that, against activations quantized by quantize.cl,
//   block dot = dw * dx * sum(u * q) + mo * (exact ? xsum.y : xsum.x)
// (xsum.x: the activation block's scaled sum as llama.cpp's q8_1 holds it,
// rounded to half; xsum.y: the scale times the quants' sum, exact): q4_1
// (u = the nibbles, mo = its min with xsum.x, as llama.cpp; q5_1 the same
// with its five-bit u), q4_0 (u = the
// nibbles, mo = -8 dw, with xsum.y: exact, as llama.cpp's integer sums
// are), ku6 (below); q8_0's u are its signed quants, with no offset term:
// dw * dx * sum(w * q), llama.cpp's formula.

// Lane i of the result: the sum over bytes 4i..4i+3 of u (unsigned) times
// s (signed).  AVX-512 VNNI's vpdpbusd where the host found it
// (TROUPE_VNNI: a PoCL CPU device, whose kernels are x86 code), as inline
// assembly: PoCL compiles kernels for its generic skylake-avx512 target and
// drops target attributes when it builds the work-group functions, so the
// builtin cannot be selected.  Elsewhere plain integer arithmetic.
#ifdef TROUPE_VNNI
inline int8 dpbusd(int8 u, int8 s) {
  int8 acc = (int8)0;
  __asm__("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}
#elif defined(TROUPE_AVX2)
// AVX2 (TROUPE_AVX2: a PoCL CPU device on an AVX2 host without AVX-512)
// has no vpdpbusd: vpmaddubsw multiplies unsigned by signed bytes and sums
// pairs into 16 bits, saturating past 32767, and vpmaddwd sums the 16-bit
// pairs into lanes of four bytes.  Every type's u keeps a pair below the
// saturation (the 4-bit types' nibbles, q5_1's 5 bits, ku6's 6 bits, q8_0's magnitudes),
// so the two give vpdpbusd's lanes exactly (dot_nibbles, dot_signed
// below).  The generic code below widens every byte to 32 bits and
// multiplies there (on a Zen 3 host, SmolLM2 Q4_1 prefill 53 t/s against
// 180, decode 38 against 80-90).
inline int8 maddubs(int8 u, int8 s) {
  int8 r;
  __asm__("vpmaddubsw %2, %1, %0" : "=x"(r) : "x"(u), "x"(s));
  return r;
}
inline int8 maddwd(int8 a, int8 b) {
  int8 r;
  __asm__("vpmaddwd %2, %1, %0" : "=x"(r) : "x"(a), "x"(b));
  return r;
}
#else
inline int8 dpbusd(int8 u, int8 s) {
  const int16 lo = convert_int16(as_uchar16(u.lo)) * convert_int16(as_char16(s.lo));
  const int16 hi = convert_int16(as_uchar16(u.hi)) * convert_int16(as_char16(s.hi));
  return (int8)(lo.s048c + lo.s159d + lo.s26ae + lo.s37bf,
                hi.s048c + hi.s159d + hi.s26ae + hi.s37bf);
}
#endif

// Two consecutive blocks at once, in one 512-bit register (lanes 0-7 the
// first block's, 8-15 the second's): half the instructions per block.
#ifdef TROUPE_VNNI
inline int16 dpbusd2(int16 u, int16 s) {
  int16 acc = (int16)0;
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
#elif !defined(TROUPE_AVX2)
inline int16 dpbusd2(int16 u, int16 s) { return (int16)(dpbusd(u.lo, s.lo), dpbusd(u.hi, s.hi)); }
#endif

// The block dot product each loader's u takes (matmul.cl's Q_DOT calls
// LOADU##_dot and LOADU##_dot2), with dpbusd's lanes and integer results
// on every path, so every host computes the same sums.  With AVX2 the
// unsigned types' u (nibbles, ku6's 6 bits) take one vpmaddubsw and one
// vpmaddwd (dot_nibbles).
//
// q8_0's are signed (dot_signed): with AVX2, as llama.cpp, |w| times s
// with w's sign (vpsignb; a pair at most 2 * 128 * 127, no saturation);
// with VNNI sum((s + 128) w) - 128 sum(w) (below); elsewhere signed
// products widened to 32 bits.  Measured on Gemma 3
// (q8_0 and Q5_0 widened to it carry most of its products) against the
// unsigned form with a -128 offset term, which took the nibble split: the
// gate/up kernel 21% faster in prefill, decode 37.1 -> 40 t/s; and the
// sums are exact with no large offset term cancelling, as llama.cpp's.
#ifdef TROUPE_AVX2
// Bytes' magnitudes (vpabsb: -128 gives 128 as an unsigned byte) and s
// with w's signs (vpsignb: negated where w < 0, zero where w = 0).
inline int8 abs_bytes(int8 w) {
  int8 r;
  __asm__("vpabsb %1, %0" : "=x"(r) : "x"(w));
  return r;
}
inline int8 sign_bytes(int8 s, int8 w) {
  int8 r;
  __asm__("vpsignb %2, %1, %0" : "=x"(r) : "x"(s), "x"(w));
  return r;
}
inline int8 dot_signed(int8 w, int8 s) {
  return maddwd(maddubs(abs_bytes(w), sign_bytes(s, w)), (int8)0x00010001);
}
inline int16 dot_signed2(int16 w, int16 s) {
  return (int16)(dot_signed(w.lo, s.lo), dot_signed(w.hi, s.hi));
}
#elif defined(TROUPE_VNNI)
// sum((s + 128) w) - 128 sum(w): the same lanes.  The bias goes on the
// activation and the correction comes from the weights, so that in a tile
// (one weight block, many tokens) the correction is one vpdpbusd a row,
// not one a token, and it starts the accumulator (no subtraction): one
// vpdpbusd a product where the activation-side correction took two (the
// asm statements are pure, so the compiler shares the row's correction and
// the token's bias over the tile's unrolled loop).
inline int8 dpbusd_onto(int8 acc, int8 u, int8 s) {
  __asm__("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}
inline int16 dpbusd2_onto(int16 acc, int16 u, int16 s) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
inline int8 dot_signed(int8 w, int8 s) {
  return dpbusd_onto(-dpbusd((int8)0x80808080, w), s ^ (int8)0x80808080, w);
}
inline int16 dot_signed2(int16 w, int16 s) {
  return dpbusd2_onto(-dpbusd2((int16)0x80808080, w), s ^ (int16)0x80808080, w);
}
#else  // both signed, widened and multiplied: the same lanes
inline int8 dot_signed(int8 w, int8 s) {
  const int16 lo = convert_int16(as_char16(w.lo)) * convert_int16(as_char16(s.lo));
  const int16 hi = convert_int16(as_char16(w.hi)) * convert_int16(as_char16(s.hi));
  return (int8)(lo.s048c + lo.s159d + lo.s26ae + lo.s37bf,
                hi.s048c + hi.s159d + hi.s26ae + hi.s37bf);
}
inline int16 dot_signed2(int16 w, int16 s) {
  return (int16)(dot_signed(w.lo, s.lo), dot_signed(w.hi, s.hi));
}
#endif
#ifdef TROUPE_AVX2
inline int8 dot_nibbles(int8 u, int8 s) { return maddwd(maddubs(u, s), (int8)0x00010001); }
inline int16 dot_nibbles2(int16 u, int16 s) {
  return (int16)(dot_nibbles(u.lo, s.lo), dot_nibbles(u.hi, s.hi));
}
#else
#define dot_nibbles dpbusd
#define dot_nibbles2 dpbusd2
#endif
#define loadu_q4_0_dot dot_nibbles
#define loadu_q4_0_dot2 dot_nibbles2
#define loadu_q4_1_dot dot_nibbles
#define loadu_q4_1_dot2 dot_nibbles2
#define loadu_q8_0_dot dot_signed
#define loadu_q8_0_dot2 dot_signed2
#define loadu_q5_0_dot dot_signed
#define loadu_q5_0_dot2 dot_signed2
// q5_1's u are at most 31, ku6's at most 63: a vpmaddubsw pair sum at
// most 2 * 63 * 127.
#define loadu_q5_1_dot dot_nibbles
#define loadu_q5_1_dot2 dot_nibbles2
#define loadu_ku6_dot dot_nibbles
#define loadu_ku6_dot2 dot_nibbles2

// How each loader's scales meet a block's dot product lanes (lane i: bytes
// 4i..4i+3; a pair's lanes 8-15 its second block) and its offset terms
// (matmul.cl's Q_DOT): the types of their scale and offset coefficient
// (_t1 a block's, _t2 a pair's), the lanes' scales from them and the
// activations' scales dx (_lanes, _lanes2), the offset coefficients
// against the activation sums (_offset2: lanes for xsum4; _tail_offset:
// into a block's accumulator; _has_offset: whether there is one).  Per
// block (q4_0, q4_1, q8_0): one scale and one offset term a block (none
// for q8_0), against the sum .x or, exact, .y.  Per 16
// (ku6): two of each, against the activations' half sums (quantize_q8_k
// with halves: .x values 0-15, .y 16-31).
#define BLOCK_LANES(dw, dx) (float8)((dw) * (dx))
#define BLOCK_LANES2(dw, dx) ((dw) * (dx)).s0000000011111111
#define BLOCK_OFFSET2(mo, exact) q_offset(mo, exact)
#define BLOCK_TAIL_OFFSET(mo, exact, s, A) A.s0 = fma(mo, (exact) ? (s).y : (s).x, A.s0)
#define HALF_LANES(dw, dx) ((dw) * (dx)).s00001111
#define HALF_LANES2(dw, dx) ((dw) * (dx).s0011).s0000111122223333
#define HALF_OFFSET2(mo, exact) (float16)((mo), (float4)0.0f, (float4)0.0f, (float4)0.0f)
#define HALF_TAIL_OFFSET(mo, exact, s, A) A.s01 = fma(mo, s, A.s01)

// What a block of a row holds, for each loader (matmul.cl's W_PREFETCH):
// bytes at wq, floats at wd (scales) and at wm (offsets).  ku6's floats
// are per super-block, read by eight blocks in a row: not prefetched.
#define load_f32_qbytes (4 * QK)
#define load_f16_qbytes (2 * QK)
#define load_bf16_qbytes (2 * QK)
#define load_q4_0_qbytes 16
#define load_q4_1_qbytes 16
#define load_q5_0_qbytes 16
#define load_q5_1_qbytes 20
#define load_q5_1_v_qbytes QK
#define load_q8_0_qbytes QK
#define load_ku6_qbytes 28
#define load_f32_scales 0
#define load_f16_scales 0
#define load_bf16_scales 0
#define load_q4_0_scales 1
#define load_q4_1_scales 1
#define load_q5_0_scales 1
#define load_q5_1_scales 1
#define load_q5_1_v_scales 1
#define load_q8_0_scales 1
#define load_ku6_scales 0
#define load_f32_offsets 0
#define load_f16_offsets 0
#define load_bf16_offsets 0
#define load_q4_0_offsets 0
#define load_q4_1_offsets 1
#define load_q5_0_offsets 1
#define load_q5_1_offsets 1
#define load_q5_1_v_offsets 1
#define load_q8_0_offsets 0
#define load_ku6_offsets 0
#define loadu_q4_0_qbytes 16
#define loadu_q4_1_qbytes 16
#define loadu_q5_0_qbytes 16
#define loadu_q8_0_qbytes QK
#define loadu_q5_1_qbytes 20
#define loadu_ku6_qbytes 28
#define loadu_q4_0_scales 1
#define loadu_q4_1_scales 1
#define loadu_q5_0_scales 1
#define loadu_q8_0_scales 1
#define loadu_q5_1_scales 1
#define loadu_ku6_scales 0
#define loadu_q4_0_offsets 0
#define loadu_q4_1_offsets 1
#define loadu_q5_0_offsets 1
#define loadu_q8_0_offsets 0
#define loadu_q5_1_offsets 1
#define loadu_ku6_offsets 0

#define loadu_q4_0_t1 float
#define loadu_q4_0_t2 float2
#define loadu_q4_0_lanes BLOCK_LANES
#define loadu_q4_0_lanes2 BLOCK_LANES2
#define loadu_q4_0_offset2 BLOCK_OFFSET2
#define loadu_q4_0_tail_offset BLOCK_TAIL_OFFSET
#define loadu_q4_0_has_offset 1
#define loadu_q4_1_t1 float
#define loadu_q4_1_t2 float2
#define loadu_q4_1_lanes BLOCK_LANES
#define loadu_q4_1_lanes2 BLOCK_LANES2
#define loadu_q4_1_offset2 BLOCK_OFFSET2
#define loadu_q4_1_tail_offset BLOCK_TAIL_OFFSET
#define loadu_q4_1_has_offset 1
#define loadu_q8_0_t1 float
#define loadu_q8_0_t2 float2
#define loadu_q8_0_lanes BLOCK_LANES
#define loadu_q8_0_lanes2 BLOCK_LANES2
#define loadu_q8_0_offset2 BLOCK_OFFSET2
#define loadu_q8_0_tail_offset BLOCK_TAIL_OFFSET
#define loadu_q8_0_has_offset 0
#define loadu_q5_0_t1 float
#define loadu_q5_0_t2 float2
#define loadu_q5_0_lanes BLOCK_LANES
#define loadu_q5_0_lanes2 BLOCK_LANES2
#define loadu_q5_0_offset2 BLOCK_OFFSET2
#define loadu_q5_0_tail_offset BLOCK_TAIL_OFFSET
#define loadu_q5_0_has_offset 0
#define loadu_q5_1_t1 float
#define loadu_q5_1_t2 float2
#define loadu_q5_1_lanes BLOCK_LANES
#define loadu_q5_1_lanes2 BLOCK_LANES2
#define loadu_q5_1_offset2 BLOCK_OFFSET2
#define loadu_q5_1_tail_offset BLOCK_TAIL_OFFSET
#define loadu_q5_1_has_offset 1
#define loadu_ku6_t1 float2
#define loadu_ku6_t2 float4
#define loadu_ku6_lanes HALF_LANES
#define loadu_ku6_lanes2 HALF_LANES2
#define loadu_ku6_offset2 HALF_OFFSET2
#define loadu_ku6_tail_offset HALF_TAIL_OFFSET
#define loadu_ku6_has_offset 1

inline float hsum8(float8 v) {
  float4 b = v.lo + v.hi;
  float2 c = b.lo + b.hi;
  return c.x + c.y;
}

inline void loadu_q4_0(__global const uchar* wq, __global const float* wd,
                       __global const float* wm, int nb, int r, int b, int8* u, float* dw,
                       float* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  const uchar16 q = vload16(blk, wq);
  *u = (int8)(as_int4(q & (uchar16)0xF), as_int4(q >> (uchar16)4));
  *dw = wd[blk];
  *mo = -8.0f * *dw;
  *exact = 1;
}

inline void loadu_q4_1(__global const uchar* wq, __global const float* wd,
                       __global const float* wm, int nb, int r, int b, int8* u, float* dw,
                       float* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  const uchar16 q = vload16(blk, wq);
  *u = (int8)(as_int4(q & (uchar16)0xF), as_int4(q >> (uchar16)4));
  *dw = wd[blk];
  *mo = wm[blk];
  *exact = 0;
}

inline void loadu_q8_0(__global const uchar* wq, __global const float* wd,
                       __global const float* wm, int nb, int r, int b, int8* u, float* dw,
                       float* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = vload8(0, (__global const int*)(wq + blk * QK));
  *dw = wd[blk];
  *mo = 0.0f;
  *exact = 1;
}

inline void loadu_q5_0(__global const uchar* wq, __global const float* wd,
                       __global const float* wm, int nb, int r, int b, int8* u, float* dw,
                       float* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  const uchar16 q = vload16(blk, wq);
  *u = q5_0_bytes((int8)(as_int4(q & (uchar16)0xF), as_int4(q >> (uchar16)4)),
                  ((__global const uint*)wm)[blk]);
  *dw = wd[blk];
  *mo = 0.0f;
  *exact = 1;
}

// Q5_1 against Q8_1 activations: llama.cpp's formula is Q4_1's (its min
// against the half-rounded sum, xsum.x), with five-bit u.
inline void loadu_q5_1(__global const uchar* wq, __global const float* wd,
                       __global const float* wm, int nb, int r, int b, int8* u, float* dw,
                       float* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = q5_1_u(wq, blk);
  *dw = wd[blk];
  *mo = wm[blk];
  *exact = 0;
}

inline void loadu_ku6(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int nb, int r, int b, int8* u, float2* dw, float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  const float4 sm = ku6_sm(wq, wd, blk);
  *u = ku6_u(wq, blk);
  *dw = sm.xy;
  *mo = sm.zw;
  *exact = 1;
}

// Blocks b and b + 1 of row r (the loaders above, two at once): u packs
// both blocks' 32 bytes, dw and mo their scales and offset coefficients.
// The 4-bit types unpack both blocks' nibbles with one 256-bit load.
inline int16 nibbles_pair(__global const uchar* wq, size_t blk) {
  const int8 q = vload8(0, (__global const int*)(wq + blk * 16));
  const int8 lo = q & (int8)0x0F0F0F0F, hi = (q >> 4) & (int8)0x0F0F0F0F;
  return (int16)(lo.s0123, hi.s0123, lo.s4567, hi.s4567);
}

inline void loadu_q4_0_pair(__global const uchar* wq, __global const float* wd,
                            __global const float* wm, int nb, int r, int b, int16* u, float2* dw,
                            float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = nibbles_pair(wq, blk);
  *dw = vload2(0, wd + blk);
  *mo = -8.0f * *dw;
  *exact = 1;
}

inline void loadu_q4_1_pair(__global const uchar* wq, __global const float* wd,
                            __global const float* wm, int nb, int r, int b, int16* u, float2* dw,
                            float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = nibbles_pair(wq, blk);
  *dw = vload2(0, wd + blk);
  *mo = vload2(0, wm + blk);
  *exact = 0;
}

inline void loadu_q8_0_pair(__global const uchar* wq, __global const float* wd,
                            __global const float* wm, int nb, int r, int b, int16* u, float2* dw,
                            float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = vload16(0, (__global const int*)(wq + blk * QK));
  *dw = vload2(0, wd + blk);
  *mo = (float2)0.0f;
  *exact = 1;
}

inline void loadu_q5_0_pair(__global const uchar* wq, __global const float* wd,
                            __global const float* wm, int nb, int r, int b, int16* u, float2* dw,
                            float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = q5_0_bytes2(nibbles_pair(wq, blk), vload2(0, (__global const uint*)wm + blk));
  *dw = vload2(0, wd + blk);
  *mo = (float2)0.0f;
  *exact = 1;
}

inline void loadu_q5_1_pair(__global const uchar* wq, __global const float* wd,
                            __global const float* wm, int nb, int r, int b, int16* u, float2* dw,
                            float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = (int16)(q5_1_u(wq, blk), q5_1_u(wq, blk + 1));
  *dw = vload2(0, wd + blk);
  *mo = vload2(0, wm + blk);
  *exact = 0;
}

inline void loadu_ku6_pair(__global const uchar* wq, __global const float* wd,
                           __global const float* wm, int nb, int r, int b, int16* u, float4* dw,
                           float4* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  const float4 sm1 = ku6_sm(wq, wd, blk), sm2 = ku6_sm(wq, wd, blk + 1);
  *u = (int16)(ku6_u(wq, blk), ku6_u(wq, blk + 1));
  *dw = (float4)(sm1.xy, sm2.xy);
  *mo = (float4)(sm1.zw, sm2.zw);
  *exact = 1;
}

// A Q5_1 QKV's V rows (matmul.cl's QKV kernels): the bytes signed
// (dot_signed), so that Q8_0 V rows held in a Q5_1 QKV (m = 0; a Q5_K_M
// file's attn_v beside Q5_1 attn_q and attn_k) give Q8_0's sums, and Q5_1
// ones theirs.  Only there: the signed products cost more than the
// unsigned ones (measured on SmolLM2 Q5_1 with every Q5_1 product signed,
// when they took two vpdpbusd a block: pp512 0.88x, tg128 0.92x).
// Held a byte a value (the header above), not packed as the other rows.
inline void loadu_q5_1_v(__global const uchar* wq, __global const float* wd,
                         __global const float* wm, int nb, int r, int b, int8* u, float* dw,
                         float* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = vload8(0, (__global const int*)(wq + blk * QK));
  *dw = wd[blk];
  *mo = wm[blk];
  *exact = 0;
}
inline void loadu_q5_1_v_pair(__global const uchar* wq, __global const float* wd,
                              __global const float* wm, int nb, int r, int b, int16* u,
                              float2* dw, float2* mo, int* exact) {
  const size_t blk = (size_t)r * nb + b;
  *u = vload16(0, (__global const int*)(wq + blk * QK));
  *dw = vload2(0, wd + blk);
  *mo = vload2(0, wm + blk);
  *exact = 0;
}
#define loadu_q5_1_v_dot dot_signed
#define loadu_q5_1_v_dot2 dot_signed2
#define loadu_q5_1_v_t1 float
#define loadu_q5_1_v_t2 float2
#define loadu_q5_1_v_lanes BLOCK_LANES
#define loadu_q5_1_v_lanes2 BLOCK_LANES2
#define loadu_q5_1_v_offset2 BLOCK_OFFSET2
#define loadu_q5_1_v_tail_offset BLOCK_TAIL_OFFSET
#define loadu_q5_1_v_has_offset 1
#define loadu_q5_1_v_qbytes QK
#define loadu_q5_1_v_scales 1
#define loadu_q5_1_v_offsets 1

// One block of 32 values: scale amax / 127, quants rounded to nearest.
inline void quantize_block(float16 lo, float16 hi, __global char* q, __global float* d,
                           __global float2* s) {
  const float16 a = fmax(fabs(lo), fabs(hi));
  float8 m8 = fmax(a.lo, a.hi);
  float4 m4 = fmax(m8.lo, m8.hi);
  float2 m2 = fmax(m4.lo, m4.hi);
  const float amax = fmax(m2.x, m2.y);
  const float dx = amax / 127.0f;
  const float id = dx > 0.0f ? 1.0f / dx : 0.0f;
  const int16 ql = convert_int16_rte(lo * id), qh = convert_int16_rte(hi * id);
  vstore16(convert_char16(ql), 0, q);
  vstore16(convert_char16(qh), 1, q);
  const int16 qs = ql + qh;
  const int8 s8 = qs.lo + qs.hi;
  const int4 s4 = s8.lo + s8.hi;
  // Scale and scaled sum stored as half, as llama.cpp's q8_1 blocks hold
  // them (its results then are ours); the quants use the exact scale.
  const float dh = round_to_half(dx);
  const float sum = (float)(s4.x + s4.y + s4.z + s4.w);
  *d = dh;
  *s = (float2)(round_to_half(dx * sum), dh * sum);
}

// The paged KV cache's element type and layout (attention.cl says how the
// cache is laid out), shared by every file that reads or writes it.
#ifdef TROUPE_KV_F16
typedef half kv_t;
typedef ushort kv_bits_t;  // a value's bits, to copy (half has no loads without cl_khr_fp16)
#define KV_LOAD16(i, p) half_bits_to_float16(vload16(i, (__global const ushort*)(p)))
#define KV_LOAD1(p) vload_half(0, p)
#define KV_STORE(v, i, p) STORE_HALF(v, i, p)
#else
typedef float kv_t;
typedef uint kv_bits_t;
#define KV_LOAD16(i, p) vload16(i, p)
#define KV_LOAD1(p) (*(p))
#define KV_STORE(v, i, p) ((p)[i] = (v))
#endif

#define HD_MAX 256

// Head vectors are handled 16 values at a time (head_dim % 16 == 0, checked
// on the host), so V loads and their half conversion use full-width vector
// instructions.

// Start of the (layer, page, kv head) block of either cache: page_size x hd
// values.
inline size_t kv_block(int layer, int n_pages, int n_kv, int page_size, int hd, int page, int g) {
  return (((size_t)layer * n_pages + page) * n_kv + g) * page_size * hd;
}

// 1 / sqrt(mean(x^2) + eps) over n values: the scale of every RMSNorm here
// (the rows' norms, Gemma's sandwich norms, norm_rope.cl's per-head QK-norm).
INLINE float rms_scale(__global const float* x, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss = fma(x[i], x[i], ss);
  return 1.0f / sqrt(ss / (float)n + eps);
}
