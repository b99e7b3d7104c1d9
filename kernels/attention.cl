// Paged KV cache.  The arena holds n_pages pages; a page holds page_size
// token slots for every layer and KV head.  V is stored by slot,
//   vcache[layer][page][kv_head][slot][head_dim],
// K transposed within a page,
//   kcache[layer][page][kv_head][head_dim][slot],
// so that one dimension of consecutive keys is one vector load and the
// scores of ATT_KEYS keys are one vector of FMAs, with no horizontal sum
// per key (F32, or half with TROUPE_KV_F16, for both).
// A sequence's page table lists its pages in position order, so position p
// lives in page pt[pt_off[s] + p / page_size], slot p % page_size.
//
// Rows of a batch are the new tokens of all sequences, flattened; row_seq
// says which sequence a row belongs to and pos its position.

// kv_t, its loads and stores, HD_MAX and kv_block: common.cl (matmul.cl's
// QKV kernels and norm_rope.cl write the cache too).

// Most rows one work-item handles (a prefill chunk's rows share their
// sequence, so each K/V vector is loaded and converted once for them all).
#define ATT_ROWS 4

// Rows r < nr of a work-item.  The loop runs to the constant ATT_ROWS so
// that it unrolls and per-row arrays (accumulators, scores) live in
// registers; the guard skips the rows a group lacks.
#define FOR_ROWS(r) _Pragma("unroll") for (int r = 0; r < ATT_ROWS; ++r) if (r < nr)

inline float hmax16(float16 v) {
  float8 a = fmax(v.lo, v.hi);
  float4 b = fmax(a.lo, a.hi);
  float2 c = fmax(b.lo, b.hi);
  return fmax(c.x, c.y);
}

// Keys are taken ATT_KEYS at a time: their scores form one vector, so the
// scores and the softmax's exponentials run as vector instructions.
#define ATT_KEYS 16

// Blocks of scores the two-pass attention keeps from its first pass for
// its second (512 keys: 8 KB of private memory for ATT_ROWS rows); keys
// past them are scored again.  The kept scores are the values the second
// pass would compute, so the result is the same bit for bit.
#define ATT_KEPT_BLOCKS 32

// Dimension d of the 16 keys of a block, key k at kc + kb[k] + d *
// page_size (kb[k]: its (page, kv head) block's offset plus its slot; -1
// for a key past the last, read as 0).
inline float16 key_dim_gather(__global const kv_t* kc, const long* kb, int d, int page_size) {
  float t[ATT_KEYS];
  for (int k = 0; k < ATT_KEYS; ++k)
    t[k] = kb[k] < 0 ? 0.0f : KV_LOAD1(kc + kb[k] + (size_t)d * page_size);
  return vload16(0, t);
}

// Where the keys of a block are: kp, their first key's dimension 0 when
// the block lies in one page (page_size % ATT_KEYS == 0: each dimension
// is one contiguous load), else kb, each key's own (see key_dim_gather).
typedef struct {
  __global const kv_t* kp;
  long kb[ATT_KEYS];
  int page_size;
} key_block;

INLINE float16 key_dim(__global const kv_t* kc, const key_block* kb, int d) {
  return kb->kp ? KV_LOAD16(0, kb->kp + (size_t)d * kb->page_size)
                : key_dim_gather(kc, kb->kb, d, kb->page_size);
}

// o[r] = the part of row r's scores that lane l held in a one-key dot
// product over 16-value chunks: sum over chunks c of q[16c + l] k[16c + l].
INLINE void score_lane(float16* o, const float qs[ATT_ROWS][HD_MAX], __global const kv_t* kc,
                       const key_block* kb, int l, int nr, int hd) {
  float16 a[ATT_ROWS];
  FOR_ROWS(r) a[r] = (float16)0.0f;
  for (int d = l; d < hd; d += 16) {
    const float16 k = key_dim(kc, kb, d);
    FOR_ROWS(r) a[r] = fma((float16)qs[r][d], k, a[r]);
  }
  FOR_ROWS(r) o[r] = a[r];
}

// The lanes of a one-key dot product reduced as hsum16 reduces them: lane
// l with l + 8, those sums with l + 4, then + 2, then + 1 (for 16 keys at
// once).  score_sum_N(o, l): the sum over lanes l, l + N, l + 2N, ...
// (OpenCL C has no recursion, hence one function per level.)
#define SCORE_LEVEL(NAME, HALF, STEP)                                                     \
  INLINE void NAME(float16* o, const float qs[ATT_ROWS][HD_MAX], __global const kv_t* kc, \
                   const key_block* kb, int l, int nr, int hd) {                          \
    float16 t[ATT_ROWS];                                                                  \
    HALF(o, qs, kc, kb, l, nr, hd);                                                       \
    HALF(t, qs, kc, kb, l + STEP, nr, hd);                                                \
    FOR_ROWS(r) o[r] += t[r];                                                             \
  }
SCORE_LEVEL(score_sum_8, score_lane, 8)
SCORE_LEVEL(score_sum_4, score_sum_8, 4)
SCORE_LEVEL(score_sum_2, score_sum_4, 2)
SCORE_LEVEL(score_sum_1, score_sum_2, 1)

// sc[r] = the scores of keys j0 .. j0+ATT_KEYS-1 for row r (-inf past the
// row's last position).  Keys past max_last are not read where they may
// lie in pages that do not exist.  Each key's score is summed in exactly
// the order of a dot product over 16-value chunks followed by hsum16 (the
// order of llama.cpp's F16 K.Q on this CPU, and of troupe's kernel before
// K was transposed), the same for any row grouping, so a row's result does
// not depend on the batch it came in.
INLINE void block_scores(float16* sc, const float qs[ATT_ROWS][HD_MAX], __global const kv_t* kc,
                         __global const int* table, const int* first, const int* last, int nr,
                         int j0, int max_last,
                         int layer, int n_pages, int n_kv, int g, int page_size, int hd,
                         float post_scale) {
  key_block kb;
  kb.page_size = page_size;
  kb.kp = 0;
  if (page_size % ATT_KEYS == 0) {
    kb.kp = kc + kv_block(layer, n_pages, n_kv, page_size, hd, table[j0 / page_size], g) +
            j0 % page_size;
  } else {
    for (int k = 0; k < ATT_KEYS; ++k) {
      const int j = j0 + k;
      kb.kb[k] = j > max_last ? -1
                              : (long)kv_block(layer, n_pages, n_kv, page_size, hd,
                                               table[j / page_size], g) +
                                    j % page_size;
    }
  }
  float16 s[ATT_ROWS];
  score_sum_1(s, qs, kc, &kb, 0, nr, hd);
  const int16 key = (int16)(j0) + (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  FOR_ROWS(r) sc[r] = select(s[r] * post_scale, (float16)(-INFINITY),
                             key > (int16)last[r] || key < (int16)first[r]);
}

// acc[r] += p[r][k] * V[j0 + k] for the keys of a block that exist.
INLINE void block_values(float16 acc[ATT_ROWS][HD_MAX / 16], const float p[ATT_ROWS][ATT_KEYS],
                         __global const kv_t* vc, __global const int* table, int nr, int j0,
                         int max_last, int layer, int n_pages, int n_kv, int g, int page_size,
                         int hd) {
  const int hd16 = hd / 16;
  float16 vv[HD_MAX / 16];
  for (int k = 0; k < ATT_KEYS && j0 + k <= max_last; ++k) {
    const int j = j0 + k;
    __global const kv_t* v =
        vc + kv_block(layer, n_pages, n_kv, page_size, hd, table[j / page_size], g) +
        (size_t)(j % page_size) * hd;
    _Pragma("unroll") for (int i = 0; i < hd16; ++i) vv[i] = KV_LOAD16(i, v);
    FOR_ROWS(r)
    _Pragma("unroll") for (int i = 0; i < hd16; ++i) acc[r][i] =
        fma((float16)p[r][k], vv[i], acc[r][i]);
  }
}

// Rows t0 .. t0+nr-1 (nr <= ATT_ROWS) of one sequence, head h: row t
// attends to positions 0..pos[t] with an online softmax; with a sliding
// window (window > 0: Gemma's local layers), to pos[t] - window + 1 ..
// pos[t] only (llama.cpp's standard SWA mask: key p0 hidden from query p1
// where p1 - p0 >= window).  Blocks wholly before a row's window are
// skipped for it, as blocks past its last position are.
INLINE void attend_rows(__global const float* qkv, __global const kv_t* kc, __global const kv_t* vc,
                        __global float* out, __global const int* pos, __global const int* table,
                        int t0, int nr, int h, int g, int n_head, int n_kv, int hd, int page_size,
                        int layer, int n_pages, float scale, __global char* oq, __global float* od,
                        __global float2* os, int one_pass, int window) {
  const int hd16 = hd / 16;
  float qs[ATT_ROWS][HD_MAX];
  float16 acc[ATT_ROWS][HD_MAX / 16];
  float16 sc[ATT_ROWS];
  float p[ATT_ROWS][ATT_KEYS];
  float m[ATT_ROWS], l[ATT_ROWS];
  int first[ATT_ROWS], last[ATT_ROWS];
  int max_last = 0, min_first = INT_MAX;
#ifdef TROUPE_KV_F16
  const int two_pass = !one_pass;
#else
  const int two_pass = 0;
#endif
  FOR_ROWS(r) {
    __global const float* q = qkv + (size_t)(t0 + r) * (n_head + 2 * n_kv) * hd + h * hd;
    _Pragma("unroll") for (int i = 0; i < hd16; ++i) {
      // llama.cpp rounds q to half and scales after q.k
      vstore16(two_pass ? round_to_half16(vload16(i, q)) : vload16(i, q) * scale, i, qs[r]);
      acc[r][i] = (float16)0.0f;
    }
    m[r] = -INFINITY;
    l[r] = 0.0f;
    last[r] = pos[t0 + r];
    first[r] = window > 0 ? max(0, last[r] - window + 1) : 0;
    max_last = max(max_last, last[r]);
    min_first = min(min_first, first[r]);
  }
  const int j_begin = min_first / ATT_KEYS * ATT_KEYS;
  // With a half KV cache, follow llama.cpp's (non flash-attention) numerics:
  // q is rounded to half before q.k, the scale applied after, and the
  // normalized probabilities are rounded to half before p.v.  This needs
  // the softmax denominator first, hence two passes; the second takes the
  // scores the first kept (ATT_KEPT_BLOCKS).  one_pass (flash attention,
  // as llama.cpp's -fa) takes one pass with an online softmax.
  if (two_pass) {
    float16 kept[ATT_ROWS][ATT_KEPT_BLOCKS];
    for (int j0 = j_begin; j0 <= max_last; j0 += ATT_KEYS) {
      block_scores(sc, qs, kc, table, first, last, nr, j0, max_last, layer, n_pages, n_kv, g,
                   page_size, hd, scale);
      const int b = (j0 - j_begin) / ATT_KEYS;
      if (b < ATT_KEPT_BLOCKS) FOR_ROWS(r) kept[r][b] = sc[r];
      FOR_ROWS(r) {
        if (j0 > last[r] || j0 + ATT_KEYS <= first[r]) continue;
        const float m_new = fmax(m[r], hmax16(sc[r]));
        l[r] = l[r] * exp(m[r] - m_new) + hsum16(exp(sc[r] - m_new));
        m[r] = m_new;
      }
    }
    FOR_ROWS(r) l[r] = 1.0f / l[r];
    for (int j0 = j_begin; j0 <= max_last; j0 += ATT_KEYS) {
      const int b = (j0 - j_begin) / ATT_KEYS;
      if (b < ATT_KEPT_BLOCKS) {
        FOR_ROWS(r) sc[r] = kept[r][b];
      } else {
        block_scores(sc, qs, kc, table, first, last, nr, j0, max_last, layer, n_pages, n_kv, g,
                     page_size, hd, scale);
      }
      FOR_ROWS(r) vstore16(round_to_half16(exp(sc[r] - m[r]) * l[r]), 0, p[r]);
      block_values(acc, p, vc, table, nr, j0, max_last, layer, n_pages, n_kv, g, page_size, hd);
    }
    FOR_ROWS(r) l[r] = 1.0f;
  } else {
    for (int j0 = j_begin; j0 <= max_last; j0 += ATT_KEYS) {
      block_scores(sc, qs, kc, table, first, last, nr, j0, max_last, layer, n_pages, n_kv, g,
                   page_size, hd, 1.0f);
      FOR_ROWS(r) {
        if (j0 > last[r] || j0 + ATT_KEYS <= first[r]) {
          vstore16((float16)0.0f, 0, p[r]);
          continue;
        }
        const float m_new = fmax(m[r], hmax16(sc[r]));
        const float corr = exp(m[r] - m_new);
        const float16 e = exp(sc[r] - m_new);
        l[r] = l[r] * corr + hsum16(e);
        _Pragma("unroll") for (int i = 0; i < hd16; ++i) acc[r][i] *= corr;
        vstore16(e, 0, p[r]);
        m[r] = m_new;
      }
      block_values(acc, p, vc, table, nr, j0, max_last, layer, n_pages, n_kv, g, page_size, hd);
    }
    FOR_ROWS(r) l[r] = 1.0f / l[r];
  }
  FOR_ROWS(r) {
    const size_t at = (size_t)(t0 + r) * n_head * hd + h * hd;
    _Pragma("unroll") for (int i = 0; i < hd16; ++i) vstore16(acc[r][i] * l[r], i, out + at);
    if (oq)  // quantized too, for an integer output projection (hd % 32 == 0)
      _Pragma("unroll") for (int i = 0; i < hd16; i += 2) {
        const size_t blk = at / QK + i / 2;
        quantize_block(acc[r][i] * l[r], acc[r][i + 1] * l[r], oq + blk * QK, od + blk, os + blk);
      }
  }
}

// attend_rows for common head sizes as constants, so that its loops over
// the head's vectors unroll and its per-row arrays live in registers.  Each
// is a function of its own (not inlined into the kernel): PoCL would
// otherwise keep every work-item's private arrays of a work-group at once,
// which overflows its worker threads' stacks.
#define ATTEND_PARAMS                                                                          \
  __global const float *qkv, __global const kv_t *kc, __global const kv_t *vc,                 \
      __global float *out, __global const int *pos, __global const int *table, int t0, int nr, \
      int h, int g, int n_head, int n_kv, int hd, int page_size, int layer, int n_pages,       \
      float scale, __global char *oq, __global float *od, __global float2 *os, int one_pass,   \
      int window
#define ATTEND_ARGS                                                                               \
  qkv, kc, vc, out, pos, table, t0, nr, h, g, n_head, n_kv, hd, page_size, layer, n_pages, scale, \
      q8, od, os, one_pass, window
#define ATTEND_FOR(NAME, HD)                                                                    \
  __attribute__((noinline)) void NAME(ATTEND_PARAMS) {                                          \
    attend_rows(qkv, kc, vc, out, pos, table, t0, nr, h, g, n_head, n_kv, HD, page_size, layer, \
                n_pages, scale, oq, od, os, one_pass, window);                                  \
  }
ATTEND_FOR(attend_hd48, 48)
ATTEND_FOR(attend_hd64, 64)
ATTEND_FOR(attend_hd128, 128)
// (A head size 256 of its own, for Gemma 3, decoded 8% faster but took the
// kernels' cold build from 16 to 20 s: it runs as attend_any.)
ATTEND_FOR(attend_any, hd)

// Causal attention through page tables, for decode rows (one new token) and
// prefill chunks alike.  GQA: query head h reads KV head h / (n_head /
// n_kv).  One work-item per (head, rows_per_item consecutive rows); the
// rows of one sequence among them share each K/V load.  With quant_out the
// output is also written quantized (quantize.cl's format) to oq, od, os.
// one_pass: flash attention's single pass with a half KV cache (see
// attend_rows).
#define ATTENTION_ARGS                                                                   \
  __global const float *qkv, __global const kv_t *kc, __global const kv_t *vc,           \
      __global float *out, __global const int *pos, __global const int *row_seq,         \
      __global const int *pt, __global const int *pt_off, int n_head, int n_kv, int hd,  \
      int page_size, int layer, int n_pages, float scale, int n_rows, int rows_per_item, \
      __global char *oq, __global float *od, __global float2 *os, int quant_out, int one_pass, \
      int window

// Work-item (h, gy): head h, rows gy * rows_per_item onwards.
INLINE void attention_at(int h, int gy, ATTENTION_ARGS) {
  const int t_begin = gy * rows_per_item;
  if (h >= n_head) return;
  const int g = h / (n_head / n_kv);
  const int t_end = min(t_begin + rows_per_item, n_rows);
  for (int t0 = t_begin; t0 < t_end;) {
    int nr = 1;
    while (t0 + nr < t_end && nr < ATT_ROWS && row_seq[t0 + nr] == row_seq[t0]) ++nr;
    __global const int* table = pt + pt_off[row_seq[t0]];
    __global char* q8 = quant_out ? oq : 0;
    if (hd == 48)
      attend_hd48(ATTEND_ARGS);
    else if (hd == 64)
      attend_hd64(ATTEND_ARGS);
    else if (hd == 128)
      attend_hd128(ATTEND_ARGS);
    else
      attend_any(ATTEND_ARGS);
    t0 += nr;
  }
}

// head_lo: the first query head of the launch (a pipeline stage whose
// group of KV heads attends on another stage runs its other heads only).
__kernel void attention(ATTENTION_ARGS, int head_lo) {
  attention_at(head_lo + get_global_id(0), get_global_id(1), qkv, kc, vc, out, pos, row_seq, pt,
               pt_off, n_head, n_kv, hd, page_size, layer, n_pages, scale, n_rows, rows_per_item,
               oq, od, os, quant_out, one_pass, window);
}

// A group of KV heads attending on another pipeline stage (KV-head
// migration, runtime/device/head_group.hpp): the K and V that a step's
// rows stored for KV heads [g_lo, g_lo + g_n) of `layer`, copied between
// the cache and a compact buffer rows[t][K, V][g_n][hd] (cache values
// as they are: no conversion).  gather: cache to rows; else rows to cache.
// One work-item per (row, head of the group).
__kernel void kv_rows_copy(__global kv_bits_t* kc, __global kv_bits_t* vc, __global kv_bits_t* rows,
                           __global const int* pos, __global const int* row_seq,
                           __global const int* pt, __global const int* pt_off, int n_kv, int hd,
                           int page_size, int layer, int n_pages, int g_lo, int g_n, int gather) {
  const int t = get_global_id(0), j = get_global_id(1);
  const int page = pt[pt_off[row_seq[t]] + pos[t] / page_size];
  const int slot = pos[t] % page_size;
  const size_t o = kv_block(layer, n_pages, n_kv, page_size, hd, page, g_lo + j);
  __global kv_bits_t* rk = rows + ((size_t)t * 2 * g_n + j) * hd;
  __global kv_bits_t* rv = rk + (size_t)g_n * hd;
  for (int d = 0; d < hd; ++d) {
    __global kv_bits_t* k = kc + o + (size_t)d * page_size + slot;  // K: transposed in the page
    __global kv_bits_t* v = vc + o + (size_t)slot * hd + d;
    if (gather) {
      rk[d] = *k;
      rv[d] = *v;
    } else {
      *k = rk[d];
      *v = rv[d];
    }
  }
}
