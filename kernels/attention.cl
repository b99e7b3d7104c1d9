// Paged KV cache.  The arena holds n_pages pages; a page holds page_size
// token slots for every layer and KV head:
//   cache[layer][page][kv_head][slot][head_dim]   (F32, or half with TROUPE_KV_F16)
// A sequence's page table lists its pages in position order, so position p
// lives in page pt[pt_off[s] + p / page_size], slot p % page_size.
//
// Rows of a batch are the new tokens of all sequences, flattened; row_seq
// says which sequence a row belongs to and pos its position.

#ifdef TROUPE_KV_F16
typedef half kv_t;
#define KV_LOAD16(i, p) half_bits_to_float16(vload16(i, (__global const ushort*)(p)))
#define KV_STORE(v, i, p) vstore_half(v, i, p)
#else
typedef float kv_t;
#define KV_LOAD16(i, p) vload16(i, p)
#define KV_STORE(v, i, p) ((p)[i] = (v))
#endif

#define HD_MAX 256

// Head vectors are handled 16 values at a time (head_dim % 16 == 0, checked
// on the host), so K/V loads and their half conversion use full-width
// vector instructions.

inline size_t kv_offset(int layer, int n_pages, int n_kv, int page_size, int hd, int page, int g,
                        int slot) {
  return ((((size_t)layer * n_pages + page) * n_kv + g) * page_size + slot) * hd;
}

// Most rows one work-item handles (a prefill chunk's rows share their
// sequence, so each K/V vector is loaded and converted once for them all).
#define ATT_ROWS 4

inline void load_hd(float16* dst, __global const kv_t* src, int hd16) {
  for (int i = 0; i < hd16; ++i) dst[i] = KV_LOAD16(i, src);
}

// Same order of operations as a one-row loop, so the result of a row does
// not depend on how rows are grouped.
inline float dot_priv(const float16* q, const float16* k, int hd16) {
  float16 d = (float16)0.0f;
  for (int i = 0; i < hd16; ++i) d = fma(q[i], k[i], d);
  return hsum16(d);
}

inline float hmax16(float16 v) {
  float8 a = fmax(v.lo, v.hi);
  float4 b = fmax(a.lo, a.hi);
  float2 c = fmax(b.lo, b.hi);
  return fmax(c.x, c.y);
}

// Keys are taken ATT_KEYS at a time: their scores form one vector, so the
// softmax's exponentials run as vector instructions.
#define ATT_KEYS 16

// The scores of keys j0 .. j0+ATT_KEYS-1 for each row (-inf past the row's
// last position).  Keys past max_last are not read: their pages may not
// exist.
inline void block_scores(float sc[ATT_ROWS][ATT_KEYS], const float16 qv[ATT_ROWS][HD_MAX / 16],
                         __global const kv_t* kc, __global const int* table, const int* last,
                         int nr, int j0, int max_last, int layer, int n_pages, int n_kv, int g,
                         int page_size, int hd, float post_scale) {
  const int hd16 = hd / 16;
  float16 kv[HD_MAX / 16];
  for (int k = 0; k < ATT_KEYS; ++k) {
    const int j = j0 + k;
    if (j > max_last) {
      for (int r = 0; r < nr; ++r) sc[r][k] = -INFINITY;
      continue;
    }
    const size_t o =
        kv_offset(layer, n_pages, n_kv, page_size, hd, table[j / page_size], g, j % page_size);
    load_hd(kv, kc + o, hd16);
    for (int r = 0; r < nr; ++r)
      sc[r][k] = j > last[r] ? -INFINITY : dot_priv(qv[r], kv, hd16) * post_scale;
  }
}

// acc[r] += p[r][k] * V[j0 + k] for the keys of a block that exist.
inline void block_values(float16 acc[ATT_ROWS][HD_MAX / 16], const float p[ATT_ROWS][ATT_KEYS],
                         __global const kv_t* vc, __global const int* table, int nr, int j0,
                         int max_last, int layer, int n_pages, int n_kv, int g, int page_size,
                         int hd) {
  const int hd16 = hd / 16;
  float16 vv[HD_MAX / 16];
  for (int k = 0; k < ATT_KEYS && j0 + k <= max_last; ++k) {
    const int j = j0 + k;
    const size_t o =
        kv_offset(layer, n_pages, n_kv, page_size, hd, table[j / page_size], g, j % page_size);
    load_hd(vv, vc + o, hd16);
    for (int r = 0; r < nr; ++r)
      for (int i = 0; i < hd16; ++i) acc[r][i] = fma((float16)p[r][k], vv[i], acc[r][i]);
  }
}

// Rows t0 .. t0+nr-1 (nr <= ATT_ROWS) of one sequence, head h: row t
// attends to positions 0..pos[t] with an online softmax.
inline void attend_rows(__global const float* qkv, __global const kv_t* kc, __global const kv_t* vc,
                        __global float* out, __global const int* pos, __global const int* table,
                        int t0, int nr, int h, int g, int n_head, int n_kv, int hd, int page_size,
                        int layer, int n_pages, float scale, __global char* oq, __global float* od,
                        __global float2* os, int one_pass) {
  const int hd16 = hd / 16;
  float16 qv[ATT_ROWS][HD_MAX / 16], acc[ATT_ROWS][HD_MAX / 16];
  float sc[ATT_ROWS][ATT_KEYS];
  float m[ATT_ROWS], l[ATT_ROWS];
  int last[ATT_ROWS];
  int max_last = 0;
#ifdef TROUPE_KV_F16
  const int two_pass = !one_pass;
#else
  const int two_pass = 0;
#endif
  for (int r = 0; r < nr; ++r) {
    __global const float* q = qkv + (size_t)(t0 + r) * (n_head + 2 * n_kv) * hd + h * hd;
    for (int i = 0; i < hd16; ++i) {
      // llama.cpp rounds q to half and scales after q.k
      qv[r][i] = two_pass ? round_to_half16(vload16(i, q)) : vload16(i, q) * scale;
      acc[r][i] = (float16)0.0f;
    }
    m[r] = -INFINITY;
    l[r] = 0.0f;
    last[r] = pos[t0 + r];
    max_last = max(max_last, last[r]);
  }
  // With a half KV cache, follow llama.cpp's (non flash-attention) numerics:
  // q is rounded to half before q.k, the scale applied after, and the
  // normalized probabilities are rounded to half before p.v.  This needs
  // the softmax denominator first, hence two passes.  one_pass (flash
  // attention, as llama.cpp's -fa) takes one pass with an online softmax.
  if (two_pass) {
    for (int j0 = 0; j0 <= max_last; j0 += ATT_KEYS) {
      block_scores(sc, qv, kc, table, last, nr, j0, max_last, layer, n_pages, n_kv, g, page_size,
                   hd, scale);
      for (int r = 0; r < nr; ++r) {
        if (j0 > last[r]) continue;
        const float16 s = vload16(0, sc[r]);
        const float m_new = fmax(m[r], hmax16(s));
        l[r] = l[r] * exp(m[r] - m_new) + hsum16(exp(s - m_new));
        m[r] = m_new;
      }
    }
    for (int r = 0; r < nr; ++r) l[r] = 1.0f / l[r];
    for (int j0 = 0; j0 <= max_last; j0 += ATT_KEYS) {
      block_scores(sc, qv, kc, table, last, nr, j0, max_last, layer, n_pages, n_kv, g, page_size,
                   hd, scale);
      for (int r = 0; r < nr; ++r)
        vstore16(round_to_half16(exp(vload16(0, sc[r]) - m[r]) * l[r]), 0, sc[r]);
      block_values(acc, sc, vc, table, nr, j0, max_last, layer, n_pages, n_kv, g, page_size, hd);
    }
    for (int r = 0; r < nr; ++r) l[r] = 1.0f;
  } else {
    for (int j0 = 0; j0 <= max_last; j0 += ATT_KEYS) {
      block_scores(sc, qv, kc, table, last, nr, j0, max_last, layer, n_pages, n_kv, g, page_size,
                   hd, 1.0f);
      for (int r = 0; r < nr; ++r) {
        if (j0 > last[r]) {
          vstore16((float16)0.0f, 0, sc[r]);
          continue;
        }
        const float16 s = vload16(0, sc[r]);
        const float m_new = fmax(m[r], hmax16(s));
        const float corr = exp(m[r] - m_new);
        const float16 p = exp(s - m_new);
        l[r] = l[r] * corr + hsum16(p);
        for (int i = 0; i < hd16; ++i) acc[r][i] *= corr;
        vstore16(p, 0, sc[r]);
        m[r] = m_new;
      }
      block_values(acc, sc, vc, table, nr, j0, max_last, layer, n_pages, n_kv, g, page_size, hd);
    }
    for (int r = 0; r < nr; ++r) l[r] = 1.0f / l[r];
  }
  for (int r = 0; r < nr; ++r) {
    const size_t at = (size_t)(t0 + r) * n_head * hd + h * hd;
    for (int i = 0; i < hd16; ++i) vstore16(acc[r][i] * l[r], i, out + at);
    if (oq)  // quantized too, for an integer output projection (hd % 32 == 0)
      for (int i = 0; i < hd16; i += 2) {
        const size_t blk = at / QK + i / 2;
        quantize_block(acc[r][i] * l[r], acc[r][i + 1] * l[r], oq + blk * QK, od + blk, os + blk);
      }
  }
}

// Causal attention through page tables, for decode rows (one new token) and
// prefill chunks alike.  GQA: query head h reads KV head h / (n_head /
// n_kv).  One work-item per (head, rows_per_item consecutive rows); the
// rows of one sequence among them share each K/V load.  With quant_out the
// output is also written quantized (quantize.cl's format) to oq, od, os.
// one_pass: flash attention's single pass with a half KV cache (see
// attend_rows).
__kernel void attention(__global const float* qkv, __global const kv_t* kc, __global const kv_t* vc,
                        __global float* out, __global const int* pos, __global const int* row_seq,
                        __global const int* pt, __global const int* pt_off, int n_head, int n_kv,
                        int hd, int page_size, int layer, int n_pages, float scale, int n_rows,
                        int rows_per_item, __global char* oq, __global float* od,
                        __global float2* os, int quant_out, int one_pass) {
  const int h = get_global_id(0);
  const int t_begin = get_global_id(1) * rows_per_item;
  if (h >= n_head) return;
  const int g = h / (n_head / n_kv);
  const int t_end = min(t_begin + rows_per_item, n_rows);
  for (int t0 = t_begin; t0 < t_end;) {
    int nr = 1;
    while (t0 + nr < t_end && nr < ATT_ROWS && row_seq[t0 + nr] == row_seq[t0]) ++nr;
    attend_rows(qkv, kc, vc, out, pos, pt + pt_off[row_seq[t0]], t0, nr, h, g, n_head, n_kv, hd,
                page_size, layer, n_pages, scale, quant_out ? oq : 0, od, os, one_pass);
    t0 += nr;
  }
}
