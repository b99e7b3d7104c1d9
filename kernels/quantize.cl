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
