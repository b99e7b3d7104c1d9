// Q and K normed per head, then rotated, for models with QK-norm (Gemma 3,
// Qwen 3): the projection wrote [q | k | v] per row to qkv (plain matmul);
// this kernel RMS-norms each q and k head with its weights (qn, kn: hd
// values, shared by the heads), applies RoPE from the row's table, writes
// q back in place and k and v into the paged cache, as the fused qkv
// kernel does for the other models.  ggml's order: (x * scale) * w, then
// the rotation.  One work-item per (head of the stacked projection, row);
// its body, qk_norm_rope_at, is also a fused Gemma layer's phase.
#define QK_NORM_ROPE_ARGS                                                                         \
  __global float *qkv, __global const float *qn, __global const float *kn,                       \
      __global const int *pos, __global const int *row_seq, __global const int *pt,               \
      __global const int *pt_off, __global kv_t *kc, __global kv_t *vc, int n_head, int n_kv,     \
      int hd, int rope_dims, __global const float2 *rope, int neox, int page_size, int layer,     \
      int n_pages, float eps

INLINE void qk_norm_rope_at(int head, int t, QK_NORM_ROPE_ARGS) {
  if (head >= n_head + 2 * n_kv) return;
  __global float* x = qkv + (size_t)t * (n_head + 2 * n_kv) * hd + (size_t)head * hd;
  const int is_v = head >= n_head + n_kv;
  float v[HD_MAX];
  if (is_v) {
    for (int i = 0; i < hd; ++i) v[i] = x[i];
  } else if (neox && rope_dims == hd && hd % 32 == 0) {
    // NeoX pairs (i, i + hd/2) over whole heads (Gemma 3, Qwen 3): sixteen
    // pairs at a time in vectors, each value computed as the loop below
    // computes it (the same products in the same order: the same bits).
    __global const float* w = head < n_head ? qn : kn;
    const float scale = rms_scale(x, hd, eps);
    const int n_pairs = hd / 2;
    __global const float* cs = (__global const float*)(rope + (size_t)t * n_pairs);
    for (int i = 0; i < n_pairs; i += 16) {
      const float16 v0 = vload16(0, x + i) * scale * vload16(0, w + i);
      const float16 v1 = vload16(0, x + n_pairs + i) * scale * vload16(0, w + n_pairs + i);
      const float16 a = vload16(0, cs + 2 * i), b = vload16(1, cs + 2 * i);
      const float16 c = (float16)(a.even, b.even), sn = (float16)(a.odd, b.odd);
      vstore16(v0 * c - v1 * sn, 0, v + i);
      vstore16(v0 * sn + v1 * c, 0, v + n_pairs + i);
    }
  } else {
    __global const float* w = head < n_head ? qn : kn;
    const float scale = rms_scale(x, hd, eps);
    for (int i = 0; i < hd; ++i) v[i] = x[i] * scale * w[i];
    const int half_rope = rope_dims / 2;
    for (int i = 0; i < half_rope; ++i) {
      const int d0 = neox ? i : 2 * i;
      const int d1 = neox ? i + half_rope : 2 * i + 1;
      const float2 cs = rope[(size_t)t * half_rope + i];
      const float v0 = v[d0], v1 = v[d1];
      v[d0] = v0 * cs.x - v1 * cs.y;
      v[d1] = v0 * cs.y + v1 * cs.x;
    }
  }
  if (head < n_head) {
    if (hd % 16 == 0)
      for (int i = 0; i < hd; i += 16) vstore16(vload16(0, v + i), 0, x + i);
    else
      for (int i = 0; i < hd; ++i) x[i] = v[i];
    return;
  }
  const int g = is_v ? head - n_head - n_kv : head - n_head;
  const int page = pt[pt_off[row_seq[t]] + pos[t] / page_size];
  const size_t o = kv_block(layer, n_pages, n_kv, page_size, hd, page, g);
  const int slot = pos[t] % page_size;
  if (is_v) {
    for (int i = 0; i < hd; ++i) KV_STORE(v[i], o + (size_t)slot * hd + i, vc);
  } else {  // K: transposed within the page
    for (int i = 0; i < hd; ++i) KV_STORE(v[i], o + (size_t)i * page_size + slot, kc);
  }
}

__kernel void qk_norm_rope(QK_NORM_ROPE_ARGS) {
  qk_norm_rope_at(get_global_id(0), get_global_id(1), qkv, qn, kn, pos, row_seq, pt, pt_off, kc,
                  vc, n_head, n_kv, hd, rope_dims, rope, neox, page_size, layer, n_pages, eps);
}
