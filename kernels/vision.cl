// The vision encoder (runtime/device/vision_forward): a ViT over an image's
// patches and the projector that maps its rows to the language model's
// input width.  Plain kernels, float throughout: an image is one batch of
// a few hundred rows, encoded once per request, so these favour being
// easy to check against the C++ reference (tests/unit/vision_reference.hpp)
// over speed.

// y[r][o] = b[o] + sum_i x[x_first + r][i] w[o][i] (b optional).  One
// work-item per (o, r).
__kernel void vis_linear(__global const float* x, __global const float* w, __global const float* b,
                         __global float* y, int K, int N, int has_bias, int x_first) {
  const int o = get_global_id(0), r = get_global_id(1);
  __global const float* xr = x + (size_t)(x_first + r) * K;
  __global const float* wr = w + (size_t)o * K;
  float s = 0.0f;
  for (int i = 0; i < K; ++i) s = fma(xr[i], wr[i], s);
  y[(size_t)r * N + o] = has_bias ? s + b[o] : s;
}

// Layer norm of each row: (x - mean) / sqrt(var + eps) * w + b.  One
// work-item per row.
__kernel void vis_layernorm(__global const float* x, __global const float* w,
                            __global const float* b, __global float* y, int D, float eps) {
  const int r = get_global_id(0);
  __global const float* xr = x + (size_t)r * D;
  __global float* yr = y + (size_t)r * D;
  float mean = 0.0f;
  for (int i = 0; i < D; ++i) mean += xr[i];
  mean /= (float)D;
  float var = 0.0f;
  for (int i = 0; i < D; ++i) var = fma(xr[i] - mean, xr[i] - mean, var);
  const float scale = 1.0f / sqrt(var / (float)D + eps);
  for (int i = 0; i < D; ++i) yr[i] = (xr[i] - mean) * scale * w[i] + b[i];
}

// The activation between the two linear layers of an MLP, in place, as
// ggml's CPU backend computes it for float: 0 GELU (tanh form) and 1 the
// "quick" GELU x sigmoid(1.702 x), each looked up by half in `tab`
// (runtime/device/gelu_table), 2 SiLU.
__kernel void vis_activate(__global float* x, __global const ushort* tab, int kind) {
  const size_t i = get_global_id(0);
  const float v = x[i];
  if (kind == 0) {
    x[i] = gelu_from_table(tab, v);
  } else if (kind == 1) {
#if defined(TROUPE_AVX512) || defined(TROUPE_AVX2)
    x[i] = vload_half(float_to_half_bits(v), (__global const half*)tab);
#else
    x[i] = v / (1.0f + exp(-1.702f * v));
#endif
  } else {
    x[i] = silu_float(v);
  }
}

// x[i] += t[i] (residuals).
__kernel void vis_add(__global float* x, __global const float* t) {
  const size_t i = get_global_id(0);
  x[i] += t[i];
}

// Full (non-causal) attention of every row over every row, per head: q, k
// and v are rows x (heads x hd), out the same.  One work-item per (row,
// head), with an online softmax (one pass over the keys).
#define VIS_MAX_HEAD_DIM 128
__kernel void vis_attention(__global const float* q, __global const float* k,
                            __global const float* v, __global float* out, int rows, int heads,
                            int hd, float scale) {
  const int r = get_global_id(0), h = get_global_id(1);
  const size_t width = (size_t)heads * hd;
  __global const float* qr = q + (size_t)r * width + (size_t)h * hd;
  float acc[VIS_MAX_HEAD_DIM];
  for (int d = 0; d < hd; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < rows; ++j) {
    __global const float* kj = k + (size_t)j * width + (size_t)h * hd;
    float s = 0.0f;
    for (int d = 0; d < hd; ++d) s = fma(qr[d], kj[d], s);
    s *= scale;
    const float m2 = fmax(m, s);
    const float c = exp(m - m2), p = exp(s - m2);
    l = l * c + p;
    __global const float* vj = v + (size_t)j * width + (size_t)h * hd;
    for (int d = 0; d < hd; ++d) acc[d] = fma(p, vj[d], acc[d] * c);
    m = m2;
  }
  __global float* o = out + (size_t)r * width + (size_t)h * hd;
  for (int d = 0; d < hd; ++d) o[d] = acc[d] / l;
}
