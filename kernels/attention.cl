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
inline float dot_hd(const float16* q, __global const kv_t* k, int hd16) {
  float16 d = (float16)0.0f;
  for (int i = 0; i < hd16; ++i) d = fma(q[i], KV_LOAD16(i, k), d);
  return hsum16(d);
}

inline size_t kv_offset(int layer, int n_pages, int n_kv, int page_size, int hd, int page, int g,
                        int slot) {
  return ((((size_t)layer * n_pages + page) * n_kv + g) * page_size + slot) * hd;
}

// Causal attention through page tables, for decode rows (one new token) and
// prefill chunks alike: row t attends to positions 0..pos[t] of its
// sequence, with an online softmax.  GQA: query head h reads KV head
// h / (n_head / n_kv).  One work-item per (head, row).
__kernel void attention(__global const float* qkv, __global const kv_t* kc,
                        __global const kv_t* vc, __global float* out, __global const int* pos,
                        __global const int* row_seq, __global const int* pt,
                        __global const int* pt_off, int n_head, int n_kv, int hd, int page_size,
                        int layer, int n_pages, float scale) {
  const int h = get_global_id(0);
  const int t = get_global_id(1);
  if (h >= n_head) return;
  const int g = h / (n_head / n_kv);
  const int hd16 = hd / 16;
  __global const float* q = qkv + (size_t)t * (n_head + 2 * n_kv) * hd + h * hd;
  float16 qv[HD_MAX / 16], acc[HD_MAX / 16];
  for (int i = 0; i < hd16; ++i) {
#ifdef TROUPE_KV_F16
    qv[i] = round_to_half16(vload16(i, q));  // llama.cpp rounds q to half; scale after q.k
#else
    qv[i] = vload16(i, q) * scale;
#endif
    acc[i] = (float16)0.0f;
  }
  __global const int* table = pt + pt_off[row_seq[t]];
  const int last = pos[t];
#ifdef TROUPE_KV_F16
  // With a half KV cache, follow llama.cpp's (non flash-attention) numerics
  // exactly: q is rounded to half before q.k, the scale applied after, and
  // the normalized probabilities are rounded to half before p.v.  This
  // needs the softmax denominator first, hence two passes.
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= last; ++j) {
    const size_t o = kv_offset(layer, n_pages, n_kv, page_size, hd, table[j / page_size], g,
                               j % page_size);
    const float sc = dot_hd(qv, kc + o, hd16) * scale;
    const float m_new = fmax(m, sc);
    l = l * exp(m - m_new) + exp(sc - m_new);
    m = m_new;
  }
  const float inv_l = 1.0f / l;
  for (int j = 0; j <= last; ++j) {
    const size_t o = kv_offset(layer, n_pages, n_kv, page_size, hd, table[j / page_size], g,
                               j % page_size);
    const float p = round_to_half(exp(dot_hd(qv, kc + o, hd16) * scale - m) * inv_l);
    __global const kv_t* v = vc + o;
    for (int i = 0; i < hd16; ++i) acc[i] = fma((float16)p, KV_LOAD16(i, v), acc[i]);
  }
  const float inv = 1.0f;
#else
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= last; ++j) {
    const size_t o = kv_offset(layer, n_pages, n_kv, page_size, hd, table[j / page_size], g,
                               j % page_size);
    const float sc = dot_hd(qv, kc + o, hd16);
    const float m_new = fmax(m, sc);
    const float corr = exp(m - m_new);
    const float p = exp(sc - m_new);
    l = l * corr + p;
    __global const kv_t* v = vc + o;
    for (int i = 0; i < hd16; ++i) acc[i] = fma((float16)p, KV_LOAD16(i, v), acc[i] * corr);
    m = m_new;
  }
  const float inv = 1.0f / l;
#endif
  __global float* o = out + (size_t)t * n_head * hd + h * hd;
  for (int i = 0; i < hd16; ++i) vstore16(acc[i] * inv, i, o);
}
