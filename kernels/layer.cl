// A whole decoder layer in one launch (a fused layer; the host's
// engine_options::fuse_layers): attention norm, QKV with RoPE and the KV
// store, attention, Wo with the residual add, FFN norm, gate/up with SiLU,
// down with the residual add.  It runs the very bodies of the separate
// kernels (the *_at functions), so its results are theirs, bit for bit.
//
// Why: on a CPU device every launch wakes the driver's worker threads,
// and on this machine's virtual CPUs a wake-up takes 15-30 us, against
// 20-90 us of work in a decode step's launch (docs/bench_engine.md). One
// launch per layer instead of seven removes most of that.
//
// How: the launch has one work-group per compute unit, of one work-item.
// The phases run in order; within a phase, work-groups take the phase's
// items (the separate kernel's work-items) in shrinking runs from a shared
// counter, then wait until every item of the phase is done.  A work-group
// only waits for items another work-group has taken, and a work-group that
// takes items is running, so the wait always ends: even if the groups run
// one after another (one worker thread), the first takes every item.
// Counters (ctr: two per phase, then one for the groups that are through)
// are zero at launch; the last group through sets them back to zero.

#if defined(TROUPE_AVX512) || defined(TROUPE_VNNI)
#define CPU_RELAX() __asm__ volatile("pause")
#else
#define CPU_RELAX()
#endif

// The next run of a phase's n items for this group: returns how many (0:
// none left) and their first in *first.  A run is an eighth of what is
// left with two groups, so the last runs are single items and the groups
// end a phase close together.
INLINE int take_items(volatile __global int* next, int n, int groups, int* first) {
  for (;;) {
    const int cur = *next;
    if (cur >= n) return 0;
    const int k = max(1, (n - cur) / (4 * groups));
    if (atomic_cmpxchg(next, cur, cur + k) == cur) {
      *first = cur;
      return k;
    }
  }
}

// Publishes a run's results, then counts it done.
INLINE void items_done(volatile __global int* done, int k) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  atomic_add(done, k);
}

INLINE void wait_items(volatile __global int* done, int n) {
  while (*done < n) CPU_RELAX();
  mem_fence(CLK_GLOBAL_MEM_FENCE);
}

#define LAYER_PHASES 7

// Phase P's N items, item i running BODY; WAIT: whether the next phase
// needs this one's results.
#define PHASE(P, N, WAIT, BODY)                                            \
  {                                                                        \
    const int n_items = (N);                                               \
    int first, k;                                                          \
    while ((k = take_items(ctr + 2 * (P), n_items, groups, &first)) > 0) { \
      for (int i = first; i < first + k; ++i) BODY;                        \
      items_done(ctr + 2 * (P) + 1, k);                                    \
    }                                                                      \
    if (WAIT) wait_items(ctr + 2 * (P) + 1, n_items);                      \
  }

// Inputs of the products per activation format: the normed rows (A), and
// attention's and the FFN's outputs (ATT, H): quantized (Q; attention and
// the FFN write theirs to qb) or float (F).
#define Q_NORM_ROW(r, w) rmsnorm_q8_row(r, x, w, qa_q, qa_d, qa_s, pos, 0, D, eps)
#define F_NORM_ROW(r, w) rmsnorm_row(r, x, w, xn, pos, 0, D, eps)
#define Q_IN_A (__global const int*)qa_q, qa_d, qa_s
#define F_IN_A xn
#define Q_IN_ATT (__global const int*)qb_q, qb_d, qb_s
#define F_IN_ATT att
#define Q_IN_H Q_IN_ATT
#define F_IN_H h
#define Q_QUANT_OUT 1
#define F_QUANT_OUT 0

#define LAYER_ARGS                                                                                 \
  __global const uchar *qkv_q, __global const float *qkv_d, __global const float *qkv_m,           \
      __global const uchar *wo_q, __global const float *wo_d, __global const float *wo_m,          \
      __global const uchar *gu_q, __global const float *gu_d, __global const float *gu_m,          \
      __global const uchar *dn_q, __global const float *dn_d, __global const float *dn_m,          \
      __global const float *attn_norm, __global const float *ffn_norm, __global const float *bias, \
      int has_bias, __global float *x, __global float *xn, __global char *qa_q,                    \
      __global float *qa_d, __global float2 *qa_s, __global float *qkv, __global float *att,       \
      __global char *qb_q, __global float *qb_d, __global float2 *qb_s, __global float *h,         \
      __global kv_t *kc, __global kv_t *vc, __global const int *pos, __global const int *row_seq,  \
      __global const int *pt, __global const int *pt_off, __global const float2 *rope, int T,      \
      int D, int F, int n_head, int n_kv, int hd, int rope_dims, int neox, int page_size,          \
      int layer, int n_pages, float scale, float eps, int att_rows, int one_pass, int rpi,         \
      int rpi_glu, volatile __global int *ctr

// One layer over T rows with the products of weight type WT (the separate
// kernels' suffix, e.g. xq_q4_1) and token tile TS (t1, t4, tiled: TT
// tokens), activations in format X.
#define TROUPE_LAYER(WT, TS, TT, X)                                                                \
  __kernel void layer_##WT##_##TS(LAYER_ARGS) {                                                    \
    const int groups = get_num_groups(0);                                                          \
    const int tg = (T + TT - 1) / TT;                                                              \
    const int n_qkv = ((n_head + 2 * n_kv) * hd / 2 + rpi - 1) / rpi;                              \
    const int n_d = (D + rpi - 1) / rpi;                                                           \
    const int n_glu = (F + rpi_glu - 1) / rpi_glu;                                                 \
    PHASE(0, T, 1, X##_NORM_ROW(i, attn_norm))                                                     \
    PHASE(1, n_qkv* tg, 1,                                                                         \
          matmul_qkv_##WT##_##TS##_at(i % n_qkv, i / n_qkv, qkv_q, qkv_d, qkv_m, X##_IN_A, qkv, D, \
                                      T, pos, row_seq, pt, pt_off, kc, vc, n_head, n_kv, hd,       \
                                      rope_dims, rope, neox, page_size, layer, n_pages, rpi, bias, \
                                      has_bias))                                                   \
    PHASE(2, n_head*((T + att_rows - 1) / att_rows), 1,                                            \
          attention_at(i % n_head, i / n_head, qkv, kc, vc, att, pos, row_seq, pt, pt_off, n_head, \
                       n_kv, hd, page_size, layer, n_pages, scale, T, att_rows, qb_q, qb_d, qb_s,  \
                       X##_QUANT_OUT, one_pass))                                                   \
    PHASE(3, n_d* tg, 1,                                                                           \
          matmul_##WT##_##TS##_at(i % n_d, i / n_d, wo_q, wo_d, wo_m, X##_IN_ATT, x, n_head * hd,  \
                                  D, T, D, 1, rpi))                                                \
    PHASE(4, T, 1, X##_NORM_ROW(i, ffn_norm))                                                      \
    PHASE(5, n_glu* tg, 1,                                                                         \
          matmul_glu_##WT##_##TS##_at(i % n_glu, i / n_glu, gu_q, gu_d, gu_m, X##_IN_A, h, D, F,   \
                                      T, rpi_glu, qb_q, qb_d, qb_s, X##_QUANT_OUT))                \
    PHASE(6, n_d* tg, 0,                                                                           \
          matmul_##WT##_##TS##_at(i % n_d, i / n_d, dn_q, dn_d, dn_m, X##_IN_H, x, F, D, T, D, 1,  \
                                  rpi))                                                            \
    mem_fence(CLK_GLOBAL_MEM_FENCE);                                                               \
    if (atomic_inc(ctr + 2 * LAYER_PHASES) == groups - 1)                                          \
      for (int c = 0; c <= 2 * LAYER_PHASES; ++c) ctr[c] = 0;                                      \
  }

#define TROUPE_LAYER_TILES(WT, X) \
  TROUPE_LAYER(WT, t1, 1, X)      \
  TROUPE_LAYER(WT, t4, 4, X)      \
  TROUPE_LAYER(WT, tiled, TROUPE_TILE, X)

TROUPE_LAYER_TILES(f32, F)
TROUPE_LAYER_TILES(f16, F)
TROUPE_LAYER_TILES(xq_q4_0, Q)
TROUPE_LAYER_TILES(xq_q4_1, Q)
TROUPE_LAYER_TILES(xq_q8_0, Q)
