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
//
// A whole step (step_*): the embedding, every layer and the final norm in
// one launch, where the layers' weights are one buffer (the host's weight
// arena, runtime/device/weight_arena.hpp) and a table gives each tensor's offset
// in it.  Each layer has counters of its own, so no counter is reused
// within a launch.

// The engine fuses layers on CPU devices only and defines TROUPE_FUSED_LAYERS
// there.  Elsewhere this file compiles to nothing: its kernels are the
// largest of the program (clang emits 2 MB of IR for them, against 0.3 MB
// for attention), and on NVIDIA's OpenCL (H200, driver 580) the whole
// program's build did not finish in 5 minutes.
#ifdef TROUPE_FUSED_LAYERS

#if defined(TROUPE_AVX512) || defined(TROUPE_VNNI) || defined(TROUPE_AVX2)
#define CPU_RELAX() __asm__ volatile("pause")
#else
#define CPU_RELAX()
#endif

// The next run of a phase's n items for this group: returns how many (0:
// none left) and their first in *first.  A run is a third of what is left
// with two groups, so each group streams its weights in few long runs (a
// run is a new stream for the memory's prefetchers: runs of an eighth
// measured 0.81x on SmolLM2 tg128) and the last runs are single items, so
// the groups end a phase close together.
INLINE int take_items(volatile __global int* next, int n, int groups, int* first) {
  for (;;) {
    const int cur = *next;
    if (cur >= n) return 0;
    const int k = max(1, (n - cur) / (groups + 1));
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

#define LAYER_PHASES 8

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

// A phase's token tiles: tg of them, the first tf of TT rows, and where TT
// is the prefill tile (TROUPE_TILE, 8 on AVX-512) a tail of at most 4
// rows in a tile of 4 (the _t4 bodies, which skip their dead entries; the
// prefill tile's have no such branches, see matmul.cl).  A decode step of
// 9 rows then computes 12 tokens' products, not 16 (measured before: 9
// rows took 1.6 times an 8-row step).  A row's results are the same in any
// tile (matmul.cl), so the launches apart, which tile by the host's choice,
// give the same values.  Only for a tile that is a multiple of 4 (the
// tail's tile of 4 starts at row TT tf; engine.token_tile may be any
// size).
#define TILE_COUNTS(TT)                                                                  \
  const int tf =                                                                         \
      (TT) == TROUPE_TILE && (TT) > 4 && (TT) % 4 == 0 && T % (TT) <= 4 ? T / (TT)      \
                                                                        : (T + (TT)-1) / (TT); \
  const int tg = tf + (tf * (TT) < T);

// Tile k (below tg) of a phase's item: function F's body for tile size
// TS, grid position (gx, k); the tail tile of 4 at its own grid row.
#define TILE_AT_t1(F, gx, k, ...) F##_t1_at(gx, k, __VA_ARGS__)
#define TILE_AT_t4(F, gx, k, ...) F##_t4_at(gx, k, __VA_ARGS__)
#define TILE_AT_tiled(F, gx, k, ...)                               \
  do {                                                             \
    if ((k) < tf)                                                  \
      F##_tiled_at(gx, k, __VA_ARGS__);                            \
    else                                                           \
      F##_t4_at(gx, (TROUPE_TILE / 4) * tf + (k)-tf, __VA_ARGS__); \
  } while (0)

// Counters per layer (two per phase, one for the groups through, one
// spare; a Gemma layer's twelve phases take the most), in a whole step's
// counter buffer: layer l's at ctr0 + LAYER_CTRS * l, the step's own
// (embedding, final norm, groups through) after the last layer's.  The
// host's k_layer_counters.
#define LAYER_CTRS 26

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

// Buffers and sizes a layer's phases read besides its weights.
#define LAYER_IO_ARGS                                                                         \
  __global float *x, __global float *xn, __global char *qa_q, __global float *qa_d,           \
      __global float2 *qa_s, __global float *qkv, __global float *att, __global char *qb_q,   \
      __global float *qb_d, __global float2 *qb_s, __global float *h, __global kv_t *kc,      \
      __global kv_t *vc, __global const int *pos, __global const int *row_seq,                \
      __global const int *pt, __global const int *pt_off, __global const float2 *rope, int T, \
      int D, int F, int n_head, int n_kv, int hd, int rope_dims, int neox, int page_size,     \
      int n_pages, float scale, float eps, int att_rows, int one_pass, int rpi, int rpi_glu

#define LAYER_ARGS                                                                                 \
  __global const uchar *qkv_q, __global const float *qkv_d, __global const float *qkv_m,           \
      __global const uchar *wo_q, __global const float *wo_d, __global const float *wo_m,          \
      __global const uchar *gu_q, __global const float *gu_d, __global const float *gu_m,          \
      __global const uchar *dn_q, __global const float *dn_d, __global const float *dn_m,          \
      __global const float *attn_norm, __global const float *ffn_norm, __global const float *bias, \
      int has_bias, int layer, int dn_fmt, LAYER_IO_ARGS, volatile __global int *ctr

// The FFN's two phases where down takes gate/up's activation format
// (FFN_SAME: h written quantized per 32 where X is Q) ...
#define FFN_SAME(WT, TS, X, LAST_WAIT)                                                            \
  PHASE(5, n_glu* tg, 1,                                                                          \
        TILE_AT_##TS(matmul_glu_##WT, i % n_glu, i / n_glu, gu_q, gu_d, gu_m, X##_IN_A, h, D, F,  \
                     T, rpi_glu, qb_q, qb_d, qb_s, X##_QUANT_OUT, 0))                             \
  PHASE(6, n_d* tg, LAST_WAIT,                                                                    \
        TILE_AT_##TS(matmul_##WT, i % n_d, i / n_d, dn_q, dn_d, dn_m, X##_IN_H, x, F, D, T, D, 1, \
                     rpi))

// A K-quant product's phase: format fmt (1: Q4_K held as q4_1, 2: KU6) of
// the matrix w over Q8_K activations in qb, rows of K values, into y (acc:
// added to it).
#define KQ_PRODUCT(TS, fmt, w, K, y, acc)                                                          \
  if ((fmt) == 2)                                                                                  \
    TILE_AT_##TS(matmul_xq_ku6, i % n_d, i / n_d, w##_q, w##_d, w##_m, Q_IN_H, y, K, D, T, D, acc, \
                 rpi);                                                                             \
  else                                                                                             \
    TILE_AT_##TS(matmul_xq_q4_1, i % n_d, i / n_d, w##_q, w##_d, w##_m, Q_IN_H, y, K, D, T, D,     \
                 acc, rpi)

// ... and where down is a K-quant beside per-32 layers (llama-quantize's
// Q4_K_M and Q6_K of a model whose other rows are no whole super-blocks:
// only ffn_down gets K-quants).  h is written as float, quantized to Q8_K
// in a phase of its own (per 256 values: quantize.cl), then multiplied by
// down's kernel: Q4_K held as q4_1 (dn_fmt 1) or the KU6 types (dn_fmt 2,
// with sums per 16), as the launches apart run them.
#define FFN_Q8K(WT, TS, X, LAST_WAIT)                                                            \
  PHASE(5, n_glu* tg, 1,                                                                         \
        TILE_AT_##TS(matmul_glu_##WT, i % n_glu, i / n_glu, gu_q, gu_d, gu_m, X##_IN_A, h, D, F, \
                     T, rpi_glu, qb_q, qb_d, qb_s, 0, 0))                                        \
  PHASE(7, T*(F / 256), 1,                                                                       \
        quantize_q8_k_at(i % (F / 256), i / (F / 256), h, F, qb_q, qb_d, qb_s, dn_fmt == 2))     \
  PHASE(6, n_d* tg, LAST_WAIT, KQ_PRODUCT(TS, dn_fmt, dn, F, x, 1))

// The phases of one layer over T rows with the products of weight type WT
// (the separate kernels' suffix, e.g. xq_q4_1) and token tile TS (t1, t4,
// tiled: TT tokens), activations in format X, the FFN as FFN says,
// counters at ctr.  LAST_WAIT: whether the last phase waits (a whole
// step's next layer reads its rows).
#define LAYER_BODY(WT, TS, TT, X, LAST_WAIT, FFN)                                                  \
  {                                                                                                \
    TILE_COUNTS(TT)                                                                                \
    const int n_qkv = ((n_head + 2 * n_kv) * hd / 2 + rpi - 1) / rpi;                              \
    const int n_d = (D + rpi - 1) / rpi;                                                           \
    const int n_glu = (F + rpi_glu - 1) / rpi_glu;                                                 \
    PHASE(0, T, 1, X##_NORM_ROW(i, attn_norm))                                                     \
    PHASE(1, n_qkv* tg, 1,                                                                         \
          TILE_AT_##TS(matmul_qkv_##WT, i % n_qkv, i / n_qkv, qkv_q, qkv_d, qkv_m, X##_IN_A, qkv,  \
                       D, T, pos, row_seq, pt, pt_off, kc, vc, n_head, n_kv, hd, rope_dims, rope,  \
                       neox, page_size, layer, n_pages, rpi, bias, has_bias))                      \
    PHASE(2, n_head*((T + att_rows - 1) / att_rows), 1,                                            \
          attention_at(i % n_head, i / n_head, qkv, kc, vc, att, pos, row_seq, pt, pt_off, n_head, \
                       n_kv, hd, page_size, layer, n_pages, scale, T, att_rows, qb_q, qb_d, qb_s,  \
                       X##_QUANT_OUT, one_pass, 0))                                                \
    PHASE(3, n_d* tg, 1,                                                                           \
          TILE_AT_##TS(matmul_##WT, i % n_d, i / n_d, wo_q, wo_d, wo_m, X##_IN_ATT, x,             \
                       n_head * hd, D, T, D, 1, rpi))                                              \
    PHASE(4, T, 1, X##_NORM_ROW(i, ffn_norm))                                                      \
    FFN(WT, TS, X, LAST_WAIT)                                                                      \
  }

// The last group through sets the n counters at c back to zero.
#define RESET_COUNTERS(c, n)                            \
  mem_fence(CLK_GLOBAL_MEM_FENCE);                      \
  if (atomic_inc((c) + (n)-1) == get_num_groups(0) - 1) \
    for (int z = 0; z < (n); ++z) (c)[z] = 0;

// KIND: empty, or _kd for the K-quant down (FFN_Q8K).
#define TROUPE_LAYER(WT, TS, TT, X, FFN, KIND)          \
  __kernel void layer_##WT##KIND##_##TS(LAYER_ARGS) { \
    const int groups = get_num_groups(0);             \
    LAYER_BODY(WT, TS, TT, X, 0, FFN)                 \
    RESET_COUNTERS(ctr, 2 * LAYER_PHASES + 1)         \
  }

// A Gemma 3 layer (QK-norm, sandwich norms, GELU, a sliding window where
// window > 0) as its Q4_K_M files hold it: Q8_0 (and Q5_0 as Q8_0) QKV
// and gate/up of type GU (Q8_0, or Q5_0 packed) over per-32 activations,
// K-quant Wo and down (wo_fmt, dn_fmt) over Q8_K ones.  The launches apart's twelve kernels as phases:
// norm, QKV, per-head QK-norm with RoPE and the KV store, attention, Q8_K
// quantization of its output, Wo into xn, x += norm(xn); norm, gate/up with
// GELU (from the table), Q8_K quantization of h, down into xn, x +=
// norm(xn).  rope: the layer's table (the host picks the local layers').
#define GEMMA_PHASES 12
#define TROUPE_GEMMA_LAYER(GU, TS, TT)                                                             \
  __kernel void layer_gemma_xq_##GU##_##TS(                                                        \
      LAYER_ARGS, __global const float* q_norm, __global const float* k_norm,                      \
      __global const float* post_attn_norm, __global const float* post_ffn_norm, int wo_fmt,       \
      int window, __global const ushort* gelu_tab) {                                               \
    const int groups = get_num_groups(0);                                                          \
    TILE_COUNTS(TT)                                                                                \
    const int A = n_head * hd, W = (n_head + 2 * n_kv) * hd;                                       \
    const int n_qkv = (W + rpi - 1) / rpi;                                                         \
    const int n_d = (D + rpi - 1) / rpi;                                                           \
    const int n_glu = (F + rpi_glu - 1) / rpi_glu;                                                 \
    PHASE(0, T, 1, Q_NORM_ROW(i, attn_norm))                                                       \
    PHASE(1, n_qkv* tg, 1,                                                                         \
          TILE_AT_##TS(matmul_xq_q8_0, i % n_qkv, i / n_qkv, qkv_q, qkv_d, qkv_m, Q_IN_A, qkv, D,  \
                       W, T, W, 0, rpi))                                                           \
    PHASE(2, (n_head + 2 * n_kv) * T, 1,                                                           \
          qk_norm_rope_at(i % (n_head + 2 * n_kv), i / (n_head + 2 * n_kv), qkv, q_norm, k_norm,   \
                          pos, row_seq, pt, pt_off, kc, vc, n_head, n_kv, hd, rope_dims, rope,     \
                          neox, page_size, layer, n_pages, eps))                                   \
    PHASE(3, n_head*((T + att_rows - 1) / att_rows), 1,                                            \
          attention_at(i % n_head, i / n_head, qkv, kc, vc, att, pos, row_seq, pt, pt_off, n_head, \
                       n_kv, hd, page_size, layer, n_pages, scale, T, att_rows, qb_q, qb_d, qb_s,  \
                       0, one_pass, window))                                                       \
    PHASE(4, T*(A / 256), 1,                                                                       \
          quantize_q8_k_at(i % (A / 256), i / (A / 256), att, A, qb_q, qb_d, qb_s, wo_fmt == 2))   \
    PHASE(5, n_d* tg, 1, KQ_PRODUCT(TS, wo_fmt, wo, A, xn, 0))                                     \
    PHASE(6, T, 1, rmsnorm_add_row(i, x, xn, post_attn_norm, D, eps))                              \
    PHASE(7, T, 1, Q_NORM_ROW(i, ffn_norm))                                                        \
    PHASE(8, n_glu* tg, 1,                                                                         \
          TILE_AT_##TS(matmul_glu_xq_##GU, i % n_glu, i / n_glu, gu_q, gu_d, gu_m, Q_IN_A, h, D,  \
                       F, T, rpi_glu, qb_q, qb_d, qb_s, GLU_GELU, gelu_tab))                       \
    PHASE(9, T*(F / 256), 1,                                                                       \
          quantize_q8_k_at(i % (F / 256), i / (F / 256), h, F, qb_q, qb_d, qb_s, dn_fmt == 2))     \
    PHASE(10, n_d* tg, 1, KQ_PRODUCT(TS, dn_fmt, dn, F, xn, 0))                                    \
    PHASE(11, T, 0, rmsnorm_add_row(i, x, xn, post_ffn_norm, D, eps))                              \
    RESET_COUNTERS(ctr, 2 * GEMMA_PHASES + 1)                                                      \
  }

// The embedding's row of row t's token (token_at), block b, dequantized into x (the
// embedding's weight type et: 0 f32, 1 f16, 2 q4_0, 3 q4_1, 4 q8_0, 5 ku6,
// 6 q5_1, 7 bf16, 9 q5_0, as the host's type_slot).
INLINE void embed_block(int et, int t, int b, __global const uchar* eq, __global const float* ed,
                        __global const float* em, __global const int* tokens,
                        __global const int* drawn, __global float* x, int D) {
  const int nb = D / QK;
  const int tok = token_at(tokens, drawn, t);
  float16 lo, hi;
  switch (et) {
    case 0:
      load_f32(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 1:
      load_f16(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 2:
      load_q4_0(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 3:
      load_q4_1(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 5:
      load_ku6(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 6:
      load_q5_1(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 7:
      load_bf16(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    case 9:
      load_q5_0(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
    default:
      load_q8_0(eq, ed, em, D, nb, tok, b, &lo, &hi);
      break;
  }
  __global float* o = x + (size_t)t * D + b * QK;
  vstore16(lo, 0, o);
  vstore16(hi, 1, o);
}

// A layer's tensor k in the arena: offs holds ARENA_SLOTS byte offsets per
// layer (the host's k_arena_slots: qkv, wo, gate/up, down: quants, scales,
// mins each; then the two norms and the bias, -1 where the layer has none;
// then not an offset: down's activation format, dn_fmt).
#define ARENA_SLOTS 16
#define ARENA_AT(T, k) ((__global const T*)(arena + o[k]))

// A whole step: embedding (type et) of the T tokens, the n_layer layers,
// then the final norm of the R rows logit_rows names (to qa quantized
// where final_q8, else to xo) for the classifier's launch.
#define TROUPE_STEP(WT, TS, TT, X, FFN, KIND)                                                    \
  __kernel void step_##WT##KIND##_##TS(                                                          \
      __global const uchar* arena, __global const long* offs, int n_layer, int et,               \
      __global const uchar* eq, __global const float* ed, __global const float* em,              \
      __global const int* tokens, __global const int* drawn, __global const float* out_norm,     \
      __global const int* logit_rows, int R, int final_q8, __global float* xo, LAYER_IO_ARGS,    \
      volatile __global int* ctr0) {                                                             \
    const int groups = get_num_groups(0);                                                        \
    volatile __global int* ctr = ctr0 + LAYER_CTRS * n_layer;                                    \
    PHASE(0, T*(D / QK), 1,                                                                      \
          embed_block(et, i / (D / QK), i % (D / QK), eq, ed, em, tokens, drawn, x, D))          \
    for (int layer = 0; layer < n_layer; ++layer) {                                              \
      __global const long* o = offs + ARENA_SLOTS * layer;                                       \
      __global const uchar *qkv_q = ARENA_AT(uchar, 0), *wo_q = ARENA_AT(uchar, 3),              \
                           *gu_q = ARENA_AT(uchar, 6), *dn_q = ARENA_AT(uchar, 9);               \
      __global const float *qkv_d = ARENA_AT(float, 1), *qkv_m = ARENA_AT(float, 2),             \
                           *wo_d = ARENA_AT(float, 4), *wo_m = ARENA_AT(float, 5),               \
                           *gu_d = ARENA_AT(float, 7), *gu_m = ARENA_AT(float, 8),               \
                           *dn_d = ARENA_AT(float, 10), *dn_m = ARENA_AT(float, 11),             \
                           *attn_norm = ARENA_AT(float, 12), *ffn_norm = ARENA_AT(float, 13);    \
      const int has_bias = o[14] >= 0, dn_fmt = (int)o[15];                                      \
      __global const float* bias = has_bias ? ARENA_AT(float, 14) : attn_norm;                   \
      volatile __global int* ctr = ctr0 + LAYER_CTRS * layer;                                    \
      LAYER_BODY(WT, TS, TT, X, 1, FFN)                                                          \
    }                                                                                            \
    PHASE(1, R, 0,                                                                               \
          if (final_q8) rmsnorm_q8_row(i, x, out_norm, qa_q, qa_d, qa_s, logit_rows, 1, D, eps); \
          else rmsnorm_row(i, x, out_norm, xo, logit_rows, 1, D, eps))                           \
    RESET_COUNTERS(ctr0, LAYER_CTRS*(n_layer + 1))                                               \
  }

#define TROUPE_LAYER_TILES(WT, X, FFN, KIND)         \
  TROUPE_LAYER(WT, t1, 1, X, FFN, KIND)              \
  TROUPE_LAYER(WT, t4, 4, X, FFN, KIND)              \
  TROUPE_LAYER(WT, tiled, TROUPE_TILE, X, FFN, KIND) \
  TROUPE_STEP(WT, t1, 1, X, FFN, KIND)               \
  TROUPE_STEP(WT, t4, 4, X, FFN, KIND)               \
  TROUPE_STEP(WT, tiled, TROUPE_TILE, X, FFN, KIND)

TROUPE_LAYER_TILES(f32, F, FFN_SAME, )
TROUPE_LAYER_TILES(f32p, F, FFN_SAME, )     // F32 in panels (matmul_panels.cl)
TROUPE_LAYER_TILES(xq_q4_1p, Q, FFN_SAME, )  // Q4_1 in panels (matmul_panels.cl)
TROUPE_LAYER_TILES(xq_q8_0p, Q, FFN_SAME, )  // Q8_0 in panels (matmul_panels.cl)
TROUPE_LAYER_TILES(f16, F, FFN_SAME, )
TROUPE_LAYER_TILES(bf16, F, FFN_SAME, )
TROUPE_LAYER_TILES(xq_q4_0, Q, FFN_SAME, )
TROUPE_LAYER_TILES(xq_q4_1, Q, FFN_SAME, )
TROUPE_LAYER_TILES(xq_q8_0, Q, FFN_SAME, )
TROUPE_LAYER_TILES(xq_q5_1, Q, FFN_SAME, )
TROUPE_LAYER_TILES(xq_q5_0, Q, FFN_SAME, )
// Q8_0, Q5_1 and Q5_0 layers with a K-quant down: the layers of
// llama-quantize's K-quant files of SmolLM2 and its like.
TROUPE_LAYER_TILES(xq_q8_0, Q, FFN_Q8K, _kd)
TROUPE_LAYER_TILES(xq_q8_0p, Q, FFN_Q8K, _kd)  // the same in panels (matmul_panels.cl)
// Q5_1 layers with a K-quant down: llama-quantize's Q5_K_M of such a model
// (Q5_K falls back to Q5_1 where rows are no whole super-blocks).
TROUPE_LAYER_TILES(xq_q5_1, Q, FFN_Q8K, _kd)
// Q5_0 layers (V rows held as Q8_0) with a K-quant down: llama-quantize's
// Q4_K_M of such a model (Q4_K falls back to Q5_0).
TROUPE_LAYER_TILES(xq_q5_0, Q, FFN_Q8K, _kd)
TROUPE_GEMMA_LAYER(q8_0, t1, 1)
TROUPE_GEMMA_LAYER(q8_0, t4, 4)
TROUPE_GEMMA_LAYER(q8_0, tiled, TROUPE_TILE)
TROUPE_GEMMA_LAYER(q5_0, t1, 1)
TROUPE_GEMMA_LAYER(q5_0, t4, 4)
TROUPE_GEMMA_LAYER(q5_0, tiled, TROUPE_TILE)

#endif  // TROUPE_FUSED_LAYERS
