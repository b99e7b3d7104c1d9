// Helpers shared by every kernel file (embedded first, see cmake/embed_kernels.cmake).
// Quantized weights live on the device in their file's type, split into
// structure-of-arrays form at upload so blocks load with aligned vector reads:
//   q4_0: quants uchar[rows][blocks][16], d float[rows][blocks]
//   q4_1: quants as q4_0, d and m float[rows][blocks]
//   q8_0: quants char[rows][blocks][32], d float[rows][blocks]
// The quants are the file's bytes; the half scales are widened to float at
// upload (exactly), because converting a half costs a dozen instructions
// per block on a device without cl_khr_fp16.
// A block holds 32 values; for 4-bit types the low nibbles of the 16 bytes
// are values 0..15 and the high nibbles values 16..31 (ggml's order).

#define QK 32

inline float hsum16(float16 v) {
  float8 a = v.lo + v.hi;
  float4 b = a.lo + a.hi;
  float2 c = b.lo + b.hi;
  return c.x + c.y;
}

inline float silu(float x) { return x / (1.0f + exp(-x)); }

// Half -> float from the raw bits, branch-free: PoCL's vload_half is a
// software routine with branches (no cl_khr_fp16 on its CPU device), a
// dozen instructions per value on the F16 weight and KV paths.  Shifting the 15 magnitude bits into a
// float's position and scaling by 2^112 is exact for normal and subnormal
// halves alike; inf and NaN do not occur in weights, scales or KV values.
inline float16 half_bits_to_float16(ushort16 h) {
  const float16 f = as_float16(convert_uint16(h & (ushort16)0x7fff) << 13) * 0x1.0p112f;
  return as_float16(as_uint16(f) | (convert_uint16(h & (ushort16)0x8000) << 16));
}

// Loaders: the 32 values of block b of row r, as two float16 halves.
// K is the row length in values, nb = K / 32 blocks per row.
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

inline void load_q8_0(__global const uchar* wq, __global const float* wd, __global const float* wm,
                      int K, int nb, int r, int b, float16* lo, float16* hi) {
  size_t blk = (size_t)r * nb + b;
  __global const char* q = (__global const char*)wq + blk * QK;
  float d = wd[blk];
  *lo = convert_float16(vload16(0, q)) * d;
  *hi = convert_float16(vload16(1, q)) * d;
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

inline float16 round_to_half16(float16 v) {
  const float16 sub = rint(v * 16777216.0f) / 16777216.0f;  // half subnormals: 2^-24 steps
  uint16 u = as_uint16(v);
  u += (uint16)0x0FFFu + ((u >> 13) & (uint16)1u);
  const float16 nrm = as_float16(u & (uint16)~0x1FFFu);
  return select(nrm, sub, isless(fabs(v), (float16)6.103515625e-05f));
}
