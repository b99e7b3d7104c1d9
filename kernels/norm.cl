// RMSNorm: y[r] = x[src(r)] / sqrt(mean(x^2) + eps) * w.
// src(r) = rows[r] when gather is set (only the rows whose logits are
// wanted reach the final norm), else r.  One work-item per row.
__kernel void rmsnorm(__global const float* x, __global const float* w, __global float* y,
                      __global const int* rows, int gather, int D, float eps) {
  const int r = get_global_id(0);
  __global const float* xr = x + (size_t)(gather ? rows[r] : r) * D;
  __global float* yr = y + (size_t)r * D;
  float ss = 0.0f;
  for (int i = 0; i < D; ++i) ss = fma(xr[i], xr[i], ss);
  const float scale = 1.0f / sqrt(ss / (float)D + eps);
  for (int i = 0; i < D; ++i) yr[i] = xr[i] * scale * w[i];
}

// h[t][i] = silu(gu[t][i]) * gu[t][F + i]: the gated FFN activation over
// the fused gate/up projection (F = n_ff).
__kernel void silu_mul(__global const float* gu, __global float* h, int F) {
  const int i = get_global_id(0);
  const int t = get_global_id(1);
  if (i >= F) return;
  __global const float* row = gu + (size_t)t * 2 * F;
  h[(size_t)t * F + i] = silu(row[i]) * row[F + i];
}
