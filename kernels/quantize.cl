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
// Q4_K x Q8_K does.  With halves (the input of KU8 weights, a scale and
// offset per 16 values), xsum holds the scaled sums of values 0-15 and
// 16-31 of a block instead (llama.cpp's Q8_K keeps sums per 16, bsums).
// Block b (of 256 values) of row r of x [rows][K]; also the body of a
// fused layer's phase (layer.cl) for a K-quant down projection's input.
INLINE void quantize_q8_k_at(int b, int r, __global const float* x, int K, __global char* xq,
                             __global float* xd, __global float2* xsum, int halves) {
  const int nb = K / 256;
  if (b >= nb) return;
  __global const float* xr = x + (size_t)r * K + (size_t)b * 256;
  float iscale, d;
  q8_k_scale(xr, &iscale, &d);
  const size_t blk0 = ((size_t)r * K + (size_t)b * 256) / QK;
  // (The halves' sums in two scalars, not an array indexed by j / 16: an
  // indexed private array stopped PoCL vectorizing the loop, 4.5x slower.)
  for (int sb = 0; sb < 256 / QK; ++sb) {
    int lo = 0, hi = 0;
    for (int j = 0; j < QK / 2; ++j) {
      const int v = min(127, convert_int_rte(iscale * xr[sb * QK + j]));
      xq[(blk0 + sb) * QK + j] = (char)v;
      lo += v;
    }
    for (int j = QK / 2; j < QK; ++j) {
      const int v = min(127, convert_int_rte(iscale * xr[sb * QK + j]));
      xq[(blk0 + sb) * QK + j] = (char)v;
      hi += v;
    }
    xd[blk0 + sb] = d;
    const float whole = d * (float)(lo + hi);
    xsum[blk0 + sb] = halves ? (float2)(d * (float)lo, d * (float)hi) : (float2)(whole, whole);
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
