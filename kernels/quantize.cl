// Activations quantized to 8 bits per block of 32 values, the input format
// of the integer matmuls (matmul.cl's Q kernels), as llama.cpp's q8_1:
//   xq char[rows][K], xd float[rows][K / 32] (scale, rounded to half as
//   llama.cpp stores it), xsum float2[rows][K / 32] (the scaled sum of the
//   block's quants two ways, for the weights' offset term: see common.cl).
// The weight side is in common.cl (loadu_*).

// One work-item per (block, row) of x [rows][K].
__kernel void quantize_q8(__global const float* x, int K, __global char* xq, __global float* xd,
                          __global float2* xsum) {
  const int b = get_global_id(0), r = get_global_id(1);
  const int nb = K / QK;
  if (b >= nb) return;
  const size_t blk = (size_t)r * nb + b;
  quantize_block(vload16(0, x + blk * QK), vload16(1, x + blk * QK), xq + blk * QK, xd + blk,
                 xsum + blk);
}

// The Q8_K scale of 256 values: iscale = -127 / (the first value of
// largest magnitude), d = 1 / iscale; both 0 for a block of zeros.
INLINE void q8_k_scale(__global const float* xr, float* iscale, float* d) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 256; ++j) {
    const float ax = fabs(xr[j]);
    if (ax > amax) {
      amax = ax;
      max = xr[j];
    }
  }
  *iscale = amax > 0.0f ? -127.0f / max : 0.0f;
  *d = amax > 0.0f ? 1.0f / *iscale : 0.0f;
}

// The same format from llama.cpp's Q8_K quantization, the activations its
// K-quant dot products take (ggml's quantize_row_q8_K_ref): per 256
// values one float scale from the value of largest magnitude (the first
// such), iscale = -127 / max, quants min(127, round(iscale * x)), scale 1 /
// iscale, not rounded to half.  Written as eight blocks of 32 sharing that
// scale, each sum exact both ways (xsum.x too: K-quant dot products use
// integer block sums), so Q4_K held as Q4_1 computes what llama.cpp's
// Q4_K x Q8_K does.  With halves (the input of KU6 weights, a scale and
// offset per 16 values), xsum holds the scaled sums of values 0-15 and
// 16-31 of a block instead (llama.cpp's Q8_K keeps sums per 16, bsums).
INLINE int isum16(int16 v) {
  const int8 a = v.lo + v.hi;
  const int4 b = a.lo + a.hi;
  return b.x + b.y + b.z + b.w;
}

// Block b (of 256 values) of row r of x [rows][K]; also the body of a
// fused layer's phase (layer.cl) for a K-quant down projection's input.
// The same values as q8_k_scale and a plain loop, in vectors of 16: the
// largest and smallest value give the one of largest magnitude, unless
// they tie with opposite signs (then the first, found as q8_k_scale does).
// Measured on SmolLM2 Q6_K prefill: the plain loops took as long as the
// KU6 product that reads their output.
INLINE void quantize_q8_k_at(int b, int r, __global const float* x, int K, __global char* xq,
                             __global float* xd, __global float2* xsum, int halves) {
  const int nb = K / 256;
  if (b >= nb) return;
  __global const float* xr = x + (size_t)r * K + (size_t)b * 256;
  float16 vmax = vload16(0, xr), vmin = vmax;
  for (int i = 1; i < 16; ++i) {
    const float16 v = vload16(i, xr);
    vmax = fmax(vmax, v);
    vmin = fmin(vmin, v);
  }
  float8 m8 = fmax(vmax.lo, vmax.hi), n8 = fmin(vmin.lo, vmin.hi);
  float4 m4 = fmax(m8.lo, m8.hi), n4 = fmin(n8.lo, n8.hi);
  const float hi = fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w));
  const float lo = fmin(fmin(n4.x, n4.y), fmin(n4.z, n4.w));
  float iscale, d;
  if (hi > -lo) {
    iscale = -127.0f / hi;
    d = 1.0f / iscale;
  } else if (-lo > hi) {
    iscale = -127.0f / lo;
    d = 1.0f / iscale;
  } else {
    q8_k_scale(xr, &iscale, &d);  // zeros, or a tie of opposite signs
  }
  const size_t blk0 = ((size_t)r * K + (size_t)b * 256) / QK;
  for (int sb = 0; sb < 256 / QK; ++sb) {
    const int16 q0 = min((int16)127, convert_int16(rint(iscale * vload16(2 * sb, xr))));
    const int16 q1 = min((int16)127, convert_int16(rint(iscale * vload16(2 * sb + 1, xr))));
    vstore16(convert_char16(q0), 0, xq + (blk0 + sb) * QK);
    vstore16(convert_char16(q1), 0, xq + (blk0 + sb) * QK + 16);
    const int slo = isum16(q0), shi = isum16(q1);
    xd[blk0 + sb] = d;
    const float whole = d * (float)(slo + shi);
    xsum[blk0 + sb] = halves ? (float2)(d * (float)slo, d * (float)shi) : (float2)(whole, whole);
  }
}

// One work-item per (256 values, row) of x [rows][K].
__kernel void quantize_q8_k(__global const float* x, int K, __global char* xq, __global float* xd,
                            __global float2* xsum, int halves) {
  quantize_q8_k_at(get_global_id(0), get_global_id(1), x, K, xq, xd, xsum, halves);
}

// x's rows rounded in place to the values their Q8_K quantization holds
// (d * q, as quantize_q8_k computes them): the float input of a K-quant
// matrix where integer products are off (engine.int8_dot false), so that
// its float products see what llama.cpp's K-quant x Q8_K dot products
// see.  One work-item per (256 values, row).
__kernel void round_q8_k(__global float* x, int K) {
  const int b = get_global_id(0), r = get_global_id(1);
  if (b >= K / 256) return;
  __global float* xr = x + (size_t)r * K + (size_t)b * 256;
  float iscale, d;
  q8_k_scale(xr, &iscale, &d);
  for (int j = 0; j < 256; ++j) xr[j] = d * (float)min(127, convert_int_rte(iscale * xr[j]));
}
