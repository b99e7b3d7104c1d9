// RMSNorm: y[r] = x[src(r)] / sqrt(mean(x^2) + eps) * w.
// src(r) = rows[r] when gather is set (only the rows whose logits are
// wanted reach the final norm), else r.  One work-item per row; the row's
// body, rmsnorm_row / rmsnorm_q8_row, is also a fused layer's (layer.cl).

INLINE void rmsnorm_row(int r, __global const float* x, __global const float* w, __global float* y,
                        __global const int* rows, int gather, int D, float eps) {
  __global const float* xr = x + (size_t)(gather ? rows[r] : r) * D;
  __global float* yr = y + (size_t)r * D;
  const float scale = rms_scale(xr, D, eps);
  for (int i = 0; i < D; ++i) yr[i] = xr[i] * scale * w[i];
}

__kernel void rmsnorm(__global const float* x, __global const float* w, __global float* y,
                      __global const int* rows, int gather, int D, float eps) {
  rmsnorm_row(get_global_id(0), x, w, y, rows, gather, D, eps);
}

// The same, written quantized to 8 bits per block (quantize.cl's format) for
// the integer matmuls that read it, instead of as float.
INLINE void rmsnorm_q8_row(int r, __global const float* x, __global const float* w,
                           __global char* xq, __global float* xd, __global float2* xsum,
                           __global const int* rows, int gather, int D, float eps) {
  __global const float* xr = x + (size_t)(gather ? rows[r] : r) * D;
  const float scale = rms_scale(xr, D, eps);
  const int nb = D / QK;
  for (int b = 0; b < nb; ++b) {
    const size_t blk = (size_t)r * nb + b;
    const int i = b * QK;
    quantize_block(vload16(0, xr + i) * scale * vload16(0, w + i),
                   vload16(1, xr + i) * scale * vload16(1, w + i), xq + blk * QK, xd + blk,
                   xsum + blk);
  }
}

__kernel void rmsnorm_q8(__global const float* x, __global const float* w, __global char* xq,
                         __global float* xd, __global float2* xsum, __global const int* rows,
                         int gather, int D, float eps) {
  rmsnorm_q8_row(get_global_id(0), x, w, xq, xd, xsum, rows, gather, D, eps);
}

// x[r] += rmsnorm(t[r]) * w: Gemma's post-attention and post-FFN norms,
// applied to a sublayer's output before the residual add (ggml's order:
// (t * scale) * w, then + x).  One work-item per row; the row's body is
// also a fused Gemma layer's phase.
INLINE void rmsnorm_add_row(int r, __global float* x, __global const float* t,
                            __global const float* w, int D, float eps) {
  __global const float* tr = t + (size_t)r * D;
  __global float* xr = x + (size_t)r * D;
  const float scale = rms_scale(tr, D, eps);
  for (int i = 0; i < D; ++i) xr[i] = tr[i] * scale * w[i] + xr[i];
}

__kernel void rmsnorm_add(__global float* x, __global const float* t, __global const float* w,
                          int D, float eps) {
  rmsnorm_add_row(get_global_id(0), x, t, w, D, eps);
}

// Final logit softcapping over n logits, as llama.cpp's three ops: x times
// the cap's float reciprocal inv, tanh, times the cap.
__kernel void softcap_values(__global float* x, float inv, float cap, int n) {
  const int i = get_global_id(0);
  if (i < n) x[i] = tanh(x[i] * inv) * cap;
}

// x *= s over n values (Gemma's embedding times sqrt(n_embd), as ggml_scale).
__kernel void scale_values(__global float* x, float s, int n) {
  const int i = get_global_id(0);
  if (i < n) x[i] *= s;
}
