// Matrix products y = W x for every weight type, with the step's fusions:
//   matmul_*      y[t][n] (+)= W[n] . x[t]      (accumulate: the residual add)
//   matmul_glu_*  h[t][n] = silu(W[n] . x[t]) * (W[F + n] . x[t])
//                 over the stacked [gate; up] matrix (the gated FFN), and
//                 h quantized (quantize.cl) for an integer down projection
//   matmul_qkv_*  the stacked [q; k; v] projection with RoPE applied, q
//                 written to the qkv buffer and k, v written straight into
//                 the paged KV cache (see attention.cl for its layout)
// A work-item computes its output row(s) for a tile of TT consecutive
// tokens, so each weight block is decoded once per TT tokens: the _tiled
// kernels (TT = TROUPE_TILE, set by the host) serve prefill and large
// batches, _t4 small decode batches (2 rows or more), and _t1 (TT = 1) a
// single row with no redundant arithmetic.
//
// Two input formats, X below: F (the activations as float, every weight
// type dequantized to float) and Q (the activations quantized to 8 bits by
// quantize.cl, per block of 32 or, for K-quant weights, per 256 as Q8_K,
// for the quantized types: integer dot products, as llama.cpp computes
// them; kernels named *_xq_*).

// Loops over a tile's tokens are unrolled (_Pragma("unroll")) so that the
// per-token accumulators live in registers: indexed in a loop, they would
// be kept on the stack, and every fma would wait on a store and a load.
//
// A token's result never depends on the tile it is computed in (one row
// alone, 4 or TROUPE_TILE tokens): every tile sums a row in the same order,
// so a sequence computed as decode rows and recomputed as a prefill chunk
// (preemption) gets the same values, bit for bit.

// One-token tiles (decode) stream their rows' weights once and mostly
// wait on them (perf: the hot instructions are the weights' loads): each
// row pair asks for its block PREFETCH_ROWS rows ahead.  The hardware
// prefetchers follow each row's stream but start late on rows of a few
// hundred bytes.  Measured on a Zen 5 host, tg128 alternated against no
// prefetch: 2 rows ahead +15%, 4 +20%, 8 +25%, 16 and 32 no better
// (SmolLM2 Q4_1); at 8, SmolLM2 Q4_1 +30%, Q8_0 +15%, BF16 +6%, Gemma 3
// +18%.  Not for F32 weights (four prefetches a block pair, and the F32
// model here, stories15M, sits in the L3 cache: 0.87x), nor for tiles of
// several tokens, which reuse each block enough to hide the wait.
#define PREFETCH_ROWS 8
#define W_PREFETCH(LOADU, r, b)                                                          \
  {                                                                                      \
    const size_t pf_ = (size_t)((r) + PREFETCH_ROWS) * nb + (b);                         \
    PREFETCH(wq + pf_ * LOADU##_qbytes);                                                 \
    if (LOADU##_scales) PREFETCH(wd + pf_ * LOADU##_scales);                             \
    if (LOADU##_offsets) PREFETCH(wm + pf_ * LOADU##_offsets);                           \
  }
#define W_PREFETCH2(LOADU, TT, r1, r2, b) \
  if ((TT) == 1 && LOADU##_qbytes <= 64) { \
    W_PREFETCH(LOADU, r1, b)              \
    W_PREFETCH(LOADU, r2, b)              \
  }

// acc[j] += row r of W . x[t0 + j] for j < TT (float16 partial sums).
#define F_DOT(LOAD, TT, r, acc)                                            \
  for (int b = 0; b < nb; ++b) {                                           \
    float16 lo, hi;                                                        \
    LOAD(wq, wd, wm, K, nb, (r), b, &lo, &hi);                             \
    _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) { \
      acc[j] = fma(lo, vload16(0, xs[j] + b * QK), acc[j]);                \
      acc[j] = fma(hi, vload16(1, xs[j] + b * QK), acc[j]);                \
    }                                                                      \
  }

// Two rows at once (r1 into acc1, r2 into acc2): each activation vector is
// loaded once for both (the gate and up rows of the FFN, a rotation pair,
// adjacent rows of the plain matmul).
#define F_DOT2(LOAD, TT, r1, acc1, r2, acc2)                               \
  for (int b = 0; b < nb; ++b) {                                           \
    float16 lo1, hi1, lo2, hi2;                                            \
    W_PREFETCH2(LOAD, TT, r1, r2, b)                                       \
    LOAD(wq, wd, wm, K, nb, (r1), b, &lo1, &hi1);                          \
    LOAD(wq, wd, wm, K, nb, (r2), b, &lo2, &hi2);                          \
    _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) { \
      const float16 xl = vload16(0, xs[j] + b * QK);                       \
      const float16 xh = vload16(1, xs[j] + b * QK);                       \
      acc1[j] = fma(lo1, xl, acc1[j]);                                     \
      acc2[j] = fma(lo2, xl, acc2[j]);                                     \
      acc1[j] = fma(hi1, xh, acc1[j]);                                     \
      acc2[j] = fma(hi2, xh, acc2[j]);                                     \
    }                                                                      \
  }

#define F_XARGS __global const float* x

// Row pointers of the token tile: x's row ROW(j) for tile entry j.  Dense
// kernels take consecutive rows, clamped (DENSE_ROW: the tail tile repeats
// the last token, whose results are not stored); the grouped expert
// kernels take the rows their slot's assignments name (ID_ROW).  LIVE:
// how many entries of the tile are real; the products skip the rest
// (TILE_LIVE), so a tail tile costs its own tokens, not a whole tile's (a
// decode step of 5 rows in tiles of 4 cost as much as one of 8 before).
// One branch per entry and block, the same for the whole work-item; a
// tile of one has none, and neither have the prefill tiles (TROUPE_TILE,
// 8 on AVX-512; on AVX2, where it is 4, the small decode tiles are those
// too): with the branches their accumulators no longer stayed in
// registers and an 8-row step took 1.8 times as long.
#define F_SETUP_AT(TT, ROW, LIVE) \
  const int nb = K / QK;          \
  const int tile_live = LIVE(TT); \
  __global const float* xs[TT];   \
  _Pragma("unroll") for (int j = 0; j < TT; ++j) xs[j] = x + (size_t)(ROW(j)) * K;

#define TILE_LIVE(TT, j) ((TT) == 1 || (TT) == TROUPE_TILE || (j) < tile_live)
#define DENSE_ROW(j) min(t0 + (j), T - 1)
#define DENSE_LIVE(TT) min((TT), T - t0)
#define F_SETUP(TT) F_SETUP_AT(TT, DENSE_ROW, DENSE_LIVE)

#define F_ZERO(TT, acc) \
  float16 acc[TT];      \
  _Pragma("unroll") for (int j = 0; j < TT; ++j) acc[j] = (float16)0.0f;

// Q: per block, the weights' 32 values as bytes (LOADU, see common.cl)
// dotted with the activations' signed bytes in integers, scaled by both
// blocks' scales (per block, or per 16 values for ku6); the weights'
// offset term (q4_1's and q5_1's min, q4_0's bias, ku6's offsets; q8_0
// has none) times the activation block's scaled sum is added apart; it
// uses the activation block's exact scaled sum (q4_0; ku6's per 16) or its
// half-rounded one (q4_1, q5_1), as llama.cpp.  Blocks are taken two at a time
// in 512-bit registers (measured on SmolLM2: prefill +10%, batched decode
// +3-13%, one-token decode +4%).
#define Q_XARGS __global const int *xq, __global const float *xd, __global const float2 *xsum

#define Q_SETUP_AT(TT, ROW, LIVE) \
  const int nb = K / QK;          \
  const int tile_live = LIVE(TT); \
  int tj[TT];                     \
  _Pragma("unroll") for (int j = 0; j < TT; ++j) tj[j] = ROW(j);

#define Q_SETUP(TT) Q_SETUP_AT(TT, DENSE_ROW, DENSE_LIVE)

// Blocks go in pairs (float16 accumulators: lanes 0-7 sum the even
// blocks, 8-15 the odd ones), a lone last block into the low half.  The
// offset term goes into the same accumulator, one lane per block (see
// q_offset; ku6: one per 16 values), so a tile of TT tokens keeps TT
// registers per row, not 2 TT:
// the 8-token tiles of two rows (Q_DOT2) then fit the 32 vector registers
// (measured: spills before).  Every tile sums in this order.
#define Q_ZERO(TT, acc) \
  float16 acc[TT];      \
  _Pragma("unroll") for (int j = 0; j < TT; ++j) acc[j] = (float16)0.0f;

// The offset coefficients of a block pair (mo) placed against the lanes
// where xsum4 (the activation pair's two float2 sums, broadcast to 16
// lanes: lane 4i + k holds component k of (b.x, b.y, b+1.x, b+1.y)) has
// the sum the weight type uses: .x (lanes 0 and 10) or, exact, .y (lanes
// 1 and 11); zero elsewhere.
inline float16 q_offset(float2 mo, int exact) {
  float16 m = (float16)0.0f;
  if (exact) {
    m.s1 = mo.x;
    m.sb = mo.y;
  } else {
    m.s0 = mo.x;
    m.sa = mo.y;
  }
  return m;
}

inline float16 xsum4(__global const float2* xsum, size_t xb) {
  const float4 v = vload4(0, (__global const float*)(xsum + xb));
  return (float16)(v, v, v, v);
}

// A block pair's dot products (weights wu, activations xv; their scales
// dw and dx as the loader's _lanes2 places them) and offset terms
// (coefficients m16 from its _offset2, activation sums xs16 from xsum4)
// into A.
#define Q_PAIR_ACC(LOADU, wu, xv, dw, dx, m16, xs16, A)                      \
  A = fma(convert_float16(LOADU##_dot2(wu, xv)), LOADU##_lanes2(dw, dx), A); \
  if (LOADU##_has_offset) A = fma(m16, xs16, A);

// The lone last block (odd block counts) into the low half, its offset
// term(s) into lane 0 (1).
#define Q_TAIL(LOADU, TT, r, b, A)                                                    \
  {                                                                                   \
    int8 wu;                                                                          \
    LOADU##_t1 dw, mo;                                                                \
    int exact;                                                                        \
    LOADU(wq, wd, wm, nb, (r), (b), &wu, &dw, &mo, &exact);                           \
    _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) {            \
      const size_t xb = (size_t)tj[j] * nb + (b);                                     \
      const float8 lanes = LOADU##_lanes(dw, xd[xb]);                                 \
      A[j].lo = fma(convert_float8(LOADU##_dot(wu, vload8(xb, xq))), lanes, A[j].lo); \
      if (LOADU##_has_offset) LOADU##_tail_offset(mo, exact, xsum[xb], A[j]);         \
    }                                                                                 \
  }

#define Q_DOT(LOADU, TT, r, acc)                                                    \
  {                                                                                 \
    int b = 0;                                                                      \
    for (; b + 1 < nb; b += 2) {                                                    \
      int16 wu;                                                                     \
      LOADU##_t2 dw, mo;                                                            \
      int exact;                                                                    \
      LOADU##_pair(wq, wd, wm, nb, (r), b, &wu, &dw, &mo, &exact);                  \
      const float16 m16 = LOADU##_offset2(mo, exact);                               \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) {        \
        const size_t xb = (size_t)tj[j] * nb + b;                                   \
        Q_PAIR_ACC(LOADU, wu, vload16(0, xq + xb * 8), dw, vload2(0, xd + xb), m16, \
                   xsum4(xsum, xb), acc[j])                                         \
      }                                                                             \
    }                                                                               \
    if (b < nb) Q_TAIL(LOADU, TT, r, b, acc)                                        \
  }

// Two rows at once, sharing the activation blocks' loads ...
#define Q_DOT2_SHARED(LOADU, TT, r1, acc1, r2, acc2)                                    \
  {                                                                                     \
    int b = 0;                                                                          \
    for (; b + 1 < nb; b += 2) {                                                        \
      W_PREFETCH2(LOADU, TT, r1, r2, b)                                                 \
      int16 wu1, wu2;                                                                   \
      LOADU##_t2 dw1, mo1, dw2, mo2;                                                    \
      int exact;                                                                        \
      LOADU##_pair(wq, wd, wm, nb, (r1), b, &wu1, &dw1, &mo1, &exact);                  \
      LOADU##_pair(wq, wd, wm, nb, (r2), b, &wu2, &dw2, &mo2, &exact);                  \
      const float16 m1 = LOADU##_offset2(mo1, exact), m2 = LOADU##_offset2(mo2, exact); \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) {            \
        const size_t xb = (size_t)tj[j] * nb + b;                                       \
        const int16 xv = vload16(0, xq + xb * 8);                                       \
        const float2 dx = vload2(0, xd + xb);                                           \
        const float16 xs16 = xsum4(xsum, xb);                                           \
        Q_PAIR_ACC(LOADU, wu1, xv, dw1, dx, m1, xs16, acc1[j])                          \
        Q_PAIR_ACC(LOADU, wu2, xv, dw2, dx, m2, xs16, acc2[j])                          \
      }                                                                                 \
    }                                                                                   \
    if (b < nb) {                                                                       \
      Q_TAIL(LOADU, TT, r1, b, acc1)                                                    \
      Q_TAIL(LOADU, TT, r2, b, acc2)                                                    \
    }                                                                                   \
  }

// ... except for tiles of 4 tokens or more with AVX2 (TROUPE_AVX2), whose
// 16 vector registers the two rows' accumulators (a float16 is two
// registers there) would fill: one row after the other, each activation
// block loaded twice (from the L1 cache).  Each row sums its blocks in the
// same order either way, so the results are the same.
#ifdef TROUPE_AVX2
#define Q_SPLIT_ROWS 1
#else
#define Q_SPLIT_ROWS 0
#endif
#define Q_DOT2(LOADU, TT, r1, acc1, r2, acc2) \
  if (Q_SPLIT_ROWS && TT >= 4) {              \
    Q_DOT(LOADU, TT, r1, acc1)                \
    Q_DOT(LOADU, TT, r2, acc2)                \
  } else                                      \
    Q_DOT2_SHARED(LOADU, TT, r1, acc1, r2, acc2)

// Each kernel's body is a function of its work-item's grid position (gx,
// gy) as well, NAME_at, so that a fused layer (layer.cl) runs the same
// code for the items it takes.
#define F_XNAMES x
#define Q_XNAMES xq, xd, xsum
#define W_ARGS __global const uchar *wq, __global const float *wd, __global const float *wm

#define MATMUL_ARGS(X)                                                                \
  W_ARGS, X##_XARGS, __global float *y, int K, int N, int T, int ldy, int accumulate, \
      int rows_per_item
#define MATMUL_NAMES(X) wq, wd, wm, X##_XNAMES, y, K, N, T, ldy, accumulate, rows_per_item

// Row n's sums for the tile into y (added to y's values with accumulate).
#define MATMUL_STORE(TT, acc, n)                                     \
  {                                                                  \
    float sums[TT];                                                  \
    hsum16_tile(acc, sums, TT);                                      \
    _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) { \
      const size_t i = (size_t)(t0 + j) * ldy + (n);                 \
      y[i] = accumulate ? y[i] + sums[j] : sums[j];                  \
    }                                                                \
  }

// Rows go two at a time (X##_DOT2), so that each activation block loaded
// (and, for q8_0 with VNNI, its correction term; for the scales, its
// broadcast) serves both rows, and one-token tiles run two independent
// sums; a row's sums are in the same order either way, so the results are
// those of one row at a time.  Measured (alternated A/B, AVX-512 host):
// prefill +4-19%, one-token decode +3-4% (SmolLM2, stories15M), Gemma 3's
// -3% within the noise.  With AVX2 the rows go one at a time as before (its 16 vector
// registers would not hold two rows' float accumulators of a multi-token
// tile, and Q_DOT2 splits those there anyway); unmeasured.
#ifdef TROUPE_AVX2
#define MATMUL_ROW_PAIRS 0
#else
#define MATMUL_ROW_PAIRS 1
#endif
#define TROUPE_MATMUL(NAME, LOAD, TT, X)                                             \
  INLINE void NAME##_at(int gx, int gy, MATMUL_ARGS(X)) {                            \
    const int t0 = gy * TT;                                                          \
    if (t0 >= T) return;                                                             \
    X##_SETUP(TT) const int n0 = gx * rows_per_item;                                 \
    const int n_end = min(n0 + rows_per_item, N);                                    \
    int n = n0;                                                                      \
    if (MATMUL_ROW_PAIRS)                                                            \
      for (; n + 1 < n_end; n += 2) {                                                \
        X##_ZERO(TT, acc) X##_ZERO(TT, acc2) X##_DOT2(LOAD, TT, n, acc, n + 1, acc2) \
            MATMUL_STORE(TT, acc, n) MATMUL_STORE(TT, acc2, n + 1)                   \
      }                                                                              \
    for (; n < n_end; ++n) {                                                         \
      X##_ZERO(TT, acc) X##_DOT(LOAD, TT, n, acc) MATMUL_STORE(TT, acc, n)           \
    }                                                                                \
  }                                                                                  \
  __kernel void NAME(MATMUL_ARGS(X)) {                                               \
    NAME##_at(get_global_id(0), get_global_id(1), MATMUL_NAMES(X));                  \
  }

// quant_out's bits: h also written quantized; GELU (Gemma) instead of SiLU,
// through gelu_tab (the host's gelu_half_table; unread without GELU).
#define GLU_QUANT_OUT 1
#define GLU_GELU 2

// The gated FFN's rows of one work-item for its tile: gate row W0 + n, up
// row W0 + F + n of the stacked matrix; tile entry j, where VALID(j), goes
// to h's row OUT(j), and with quant_out also quantized for an integer down
// projection (the work-item's rows are whole blocks: rows_per_item and F
// multiples of 32), read back.
#define GLU_ROWS(LOAD, TT, X, W0, VALID, OUT)                                                      \
  const int n0 = gx * rows_per_item;                                                               \
  const int n_end = min(n0 + rows_per_item, F);                                                    \
  int n = n0;                                                                                      \
  /* One token: eight rows' SiLU at a time, in a vector (silu_mul_tile; the */                     \
  /* same bits as one at a time). */                                                               \
  if (TT == 1 && !(quant_out & GLU_GELU))                                                          \
    for (; n + 8 <= n_end; n += 8) {                                                               \
      float g8[8], u8[8];                                                                          \
      for (int k = 0; k < 8; ++k) {                                                                \
        X##_ZERO(1, g) X##_ZERO(1, u) X##_DOT2(LOAD, 1, (W0) + n + k, g, (W0) + F + n + k, u);     \
        hsum16_tile(g, g8 + k, 1);                                                                 \
        hsum16_tile(u, u8 + k, 1);                                                                 \
      }                                                                                            \
      silu_mul_tile(g8, u8, 8);                                                                    \
      if (VALID(0)) vstore8(vload8(0, g8), 0, h + (size_t)(OUT(0)) * F + n);                       \
    }                                                                                              \
  for (; n < n_end; ++n) {                                                                         \
    X##_ZERO(TT, g) X##_ZERO(TT, u) X##_DOT2(LOAD, TT, (W0) + n, g, (W0) + F + n, u);              \
    float gs[TT], us[TT];                                                                          \
    hsum16_tile(g, gs, TT);                                                                        \
    hsum16_tile(u, us, TT);                                                                        \
    if (quant_out & GLU_GELU) {                                                                    \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) gs[j] =                                       \
          gelu_from_table(gelu_tab, gs[j]) * us[j];                                                \
    } else {                                                                                       \
      silu_mul_tile(gs, us, TT);                                                                   \
    }                                                                                              \
    _Pragma("unroll") for (int j = 0; j < TT; ++j) if (VALID(j)) h[(size_t)(OUT(j)) * F + n] =     \
        gs[j];                                                                                     \
  }                                                                                                \
  if (quant_out & GLU_QUANT_OUT)                                                                   \
    _Pragma("unroll") for (int j = 0; j < TT;                                                      \
                           ++j) if (VALID(j)) for (int n = n0; n < min(n0 + rows_per_item, F);     \
                                                   n += QK) {                                      \
      const size_t at = (size_t)(OUT(j)) * F + n;                                                  \
      quantize_block(vload16(0, h + at), vload16(1, h + at), oq + at, od + at / QK, os + at / QK); \
    }

#define DENSE_VALID(j) (t0 + (j) < T)
#define DENSE_OUT(j) (t0 + (j))

#define GLU_ARGS(X)                                                                                \
  W_ARGS, X##_XARGS, __global float *h, int K, int F, int T, int rows_per_item, __global char *oq, \
      __global float *od, __global float2 *os, int quant_out, __global const ushort *gelu_tab
#define GLU_NAMES(X) \
  wq, wd, wm, X##_XNAMES, h, K, F, T, rows_per_item, oq, od, os, quant_out, gelu_tab

#define TROUPE_MATMUL_GLU(NAME, LOAD, TT, X)                       \
  INLINE void NAME##_at(int gx, int gy, GLU_ARGS(X)) {             \
    const int t0 = gy * TT;                                        \
    if (t0 >= T) return;                                           \
    X##_SETUP(TT) GLU_ROWS(LOAD, TT, X, 0, DENSE_VALID, DENSE_OUT) \
  }                                                                \
  __kernel void NAME(GLU_ARGS(X)) {                                \
    NAME##_at(get_global_id(0), get_global_id(1), GLU_NAMES(X));   \
  }

// `rope` holds (cos, sin) of each row's angle for each rotation pair,
// [rows][rope_dims / 2], computed once per step on the host (every layer
// reuses it).  One work-item per rotation pair (r0, r1) of the stacked
// projection: pairs (2i, 2i+1) of a head in the normal layout, (i, i +
// rope_dims/2) in NeoX; dimensions past rope_dims are paired but not
// rotated, and v heads are never rotated.  Where has_bias, bias[w]
// (Qwen2's [bq | bk | bv]) is added to stacked row w before the rotation,
// as llama.cpp adds it.  The pair's two rows are summed together
// (X##_DOT2) for every tile, one token included: an earlier measurement
// had one token's rows apart faster; on the AVX-512 host of Session 33,
// together measured +2-4% in decode (SmolLM2, stories15M; alternated A/B).
// Each row's sums are the same either way, bit for bit.
#define QKV_ARGS(X)                                                                      \
  W_ARGS, X##_XARGS, __global float *qkv, int K, int T, __global const int *pos,         \
      __global const int *row_seq, __global const int *pt, __global const int *pt_off,   \
      __global kv_t *kc, __global kv_t *vc, int n_head, int n_kv, int hd, int rope_dims, \
      __global const float2 *rope, int neox, int page_size, int layer, int n_pages,      \
      int rows_per_item, __global const float *bias, int has_bias
#define QKV_NAMES(X)                                                                     \
  wq, wd, wm, X##_XNAMES, qkv, K, T, pos, row_seq, pt, pt_off, kc, vc, n_head, n_kv, hd, \
      rope_dims, rope, neox, page_size, layer, n_pages, rows_per_item, bias, has_bias

// Each token's KV slot, found once for a work-item's rows where some are
// K or V rows (NEEDED; a page lookup and a division each): where kv head
// 0's K and V go in its page; kv head g is g page_size hd further.
#define QKV_KV_SLOTS(TT, NEEDED)                                               \
  size_t kv_k[TT], kv_v[TT];                                                   \
  if (NEEDED) _Pragma("unroll") for (int j = 0; j < TT; ++j) {                 \
      const int t = min(t0 + j, T - 1);                                        \
      const int page = pt[pt_off[row_seq[t]] + pos[t] / page_size];            \
      const size_t o = kv_block(layer, n_pages, n_kv, page_size, hd, page, 0); \
      const int slot = pos[t] % page_size;                                     \
      kv_k[j] = o + slot;                                                      \
      kv_v[j] = o + (size_t)slot * hd;                                         \
    }

#define TROUPE_MATMUL_QKV(NAME, LOAD, TT, X, VLOAD, VSPLIT)                               \
  INLINE void NAME##_at(int gx, int gy, QKV_ARGS(X)) {                                    \
    const int t0 = gy * TT;                                                               \
    if (t0 >= T) return;                                                                  \
    X##_SETUP(TT) const int half_hd = hd / 2;                                             \
    const int half_rope = rope_dims / 2;                                                  \
    const int n_pairs = (n_head + 2 * n_kv) * half_hd;                                    \
    const int stride = (n_head + 2 * n_kv) * hd;                                          \
    const int w0 = gx * rows_per_item;                                                    \
    const int w_end = min(w0 + rows_per_item, n_pairs);                                   \
    QKV_KV_SLOTS(TT, w_end > w0 && (w_end - 1) / half_hd >= n_head)                       \
    for (int w = w0; w < w_end; ++w) {                                                    \
      const int head = w / half_hd;                                                       \
      const int i = w % half_hd;                                                          \
      int d0, d1;                                                                         \
      if (neox && i < half_rope) {                                                        \
        d0 = i;                                                                           \
        d1 = i + half_rope;                                                               \
      } else if (neox) {                                                                  \
        d0 = rope_dims + 2 * (i - half_rope);                                             \
        d1 = d0 + 1;                                                                      \
      } else {                                                                            \
        d0 = 2 * i;                                                                       \
        d1 = d0 + 1;                                                                      \
      }                                                                                   \
      const int rotate = head < n_head + n_kv && (neox ? i < half_rope : d0 < rope_dims); \
      X##_ZERO(TT, a0) X##_ZERO(TT, a1);                                                  \
      if (VSPLIT && head >= n_head + n_kv) {                                              \
        X##_DOT2(VLOAD, TT, head* hd + d0, a0, head * hd + d1, a1)                        \
      } else {                                                                            \
        X##_DOT2(LOAD, TT, head* hd + d0, a0, head * hd + d1, a1)                         \
      }                                                                                   \
      float s0[TT], s1[TT];                                                               \
      hsum16_tile(a0, s0, TT);                                                            \
      hsum16_tile(a1, s1, TT);                                                            \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) {                    \
        const int t = t0 + j;                                                             \
        float v0 = s0[j], v1 = s1[j];                                                     \
        if (has_bias) {                                                                   \
          v0 += bias[head * hd + d0];                                                     \
          v1 += bias[head * hd + d1];                                                     \
        }                                                                                 \
        if (rotate) {                                                                     \
          const float2 cs = rope[(size_t)t * half_rope + i];                              \
          const float c = cs.x, s = cs.y;                                                 \
          const float r0 = v0 * c - v1 * s;                                               \
          v1 = v0 * s + v1 * c;                                                           \
          v0 = r0;                                                                        \
        }                                                                                 \
        if (head < n_head) {                                                              \
          qkv[(size_t)t * stride + head * hd + d0] = v0;                                  \
          qkv[(size_t)t * stride + head * hd + d1] = v1;                                  \
        } else {                                                                          \
          const int g = head < n_head + n_kv ? head - n_head : head - n_head - n_kv;      \
          const size_t gk = (size_t)g * page_size * hd;                                   \
          if (head < n_head + n_kv) { /* K: transposed within the page */                 \
            KV_STORE(v0, kv_k[j] + gk + (size_t)d0 * page_size, kc);                      \
            KV_STORE(v1, kv_k[j] + gk + (size_t)d1 * page_size, kc);                      \
          } else {                                                                        \
            KV_STORE(v0, kv_v[j] + gk + d0, vc);                                          \
            KV_STORE(v1, kv_v[j] + gk + d1, vc);                                          \
          }                                                                               \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }                                                                                       \
  __kernel void NAME(QKV_ARGS(X)) {                                                       \
    NAME##_at(get_global_id(0), get_global_id(1), QKV_NAMES(X));                          \
  }

// Grouped expert products (mixture of experts, moe.cl): a work-item
// computes rows of one slot's expert for a tile of that slot's assignments
// (moe_route lists them by slot).  Grid dimension 1 runs over slots x
// `tiles` (enough tiles for the fullest slot); tiles past their slot's
// count return at once.  Slot s's rows start at s * rows-per-expert of the
// stacked matrix (device_weights.hpp's device_moe); slot0 offsets the slot
// lists (a device holding slots [slot0, slot0 + S)).  Assignment a reads
// x's row a / x_div (the token's row for gate/up, x_div = n_used; its own
// row of h for down, x_div = 1) and writes output row a.  Each
// assignment's sums are a dense kernel's for the same row, whatever its tile.
#define ID_SETUP(TT)                                  \
  const int slot = get_global_id(1) / tiles;          \
  const int begin = slot_off[slot0 + slot];           \
  const int cnt = slot_off[slot0 + slot + 1] - begin; \
  const int i0 = (get_global_id(1) % tiles) * TT;     \
  if (i0 >= cnt) return;                              \
  int arow[TT];                                       \
  _Pragma("unroll") for (int j = 0; j < TT; ++j) arow[j] = slot_rows[begin + min(i0 + j, cnt - 1)];

#define ID_ROW(j) (arow[j] / x_div)
#define ID_VALID(j) (i0 + (j) < cnt)
#define ID_LIVE(TT) min((TT), cnt - i0)
#define ID_OUT(j) arow[j]

#define ID_ARGS \
  __global const int *slot_off, __global const int *slot_rows, int slot0, int tiles, int x_div

#define TROUPE_MATMUL_ID(NAME, LOAD, TT, X)                                                        \
  __kernel void NAME(__global const uchar* wq, __global const float* wd, __global const float* wm, \
                     X##_XARGS, __global float* y, int K, int N, int rows_per_item, ID_ARGS) {     \
    ID_SETUP(TT)                                                                                   \
    X##_SETUP_AT(TT, ID_ROW, ID_LIVE) const int n0 = get_global_id(0) * rows_per_item;             \
    for (int n = n0; n < min(n0 + rows_per_item, N); ++n) {                                        \
      X##_ZERO(TT, acc) X##_DOT(LOAD, TT, slot* N + n, acc);                                       \
      float sums[TT];                                                                              \
      hsum16_tile(acc, sums, TT);                                                                  \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (i0 + j < cnt)                             \
          y[(size_t)arow[j] * N + n] = sums[j];                                                    \
    }                                                                                              \
  }

#define TROUPE_MATMUL_ID_GLU(NAME, LOAD, TT, X)                                                    \
  __kernel void NAME(__global const uchar* wq, __global const float* wd, __global const float* wm, \
                     X##_XARGS, __global float* h, int K, int F, int rows_per_item,                \
                     __global char* oq, __global float* od, __global float2* os, int quant_out,    \
                     __global const ushort* gelu_tab, ID_ARGS) {                                   \
    const int gx = get_global_id(0);                                                               \
    ID_SETUP(TT)                                                                                   \
    X##_SETUP_AT(TT, ID_ROW, ID_LIVE) GLU_ROWS(LOAD, TT, X, slot * 2 * F, ID_VALID, ID_OUT)        \
  }

// Three token tiles per family: 1 (one decode row), 4 (small decode
// batches) and TROUPE_TILE (prefill chunks and large batches).  The QKV
// kernels read V rows with VLOAD where VSPLIT (a Q5_1 QKV's, common.cl's
// loadu_q5_1_v; a Q5_0 QKV's, held as Q8_0), with LOAD elsewhere.
#define TROUPE_MATMUL_FAMILY(T, LOAD, X, XN) TROUPE_MATMUL_FAMILY_SPLIT(T, LOAD, X, XN, LOAD, 0)
#define TROUPE_MATMUL_FAMILY_SPLIT(T, LOAD, X, XN, VLOAD, VSPLIT)                    \
  TROUPE_MATMUL(matmul_##XN##T##_t1, LOAD, 1, X)                                     \
  TROUPE_MATMUL(matmul_##XN##T##_t4, LOAD, 4, X)                                     \
  TROUPE_MATMUL(matmul_##XN##T##_tiled, LOAD, TROUPE_TILE, X)                        \
  TROUPE_MATMUL_GLU(matmul_glu_##XN##T##_t1, LOAD, 1, X)                             \
  TROUPE_MATMUL_GLU(matmul_glu_##XN##T##_t4, LOAD, 4, X)                             \
  TROUPE_MATMUL_GLU(matmul_glu_##XN##T##_tiled, LOAD, TROUPE_TILE, X)                \
  TROUPE_MATMUL_QKV(matmul_qkv_##XN##T##_t1, LOAD, 1, X, VLOAD, VSPLIT)              \
  TROUPE_MATMUL_QKV(matmul_qkv_##XN##T##_t4, LOAD, 4, X, VLOAD, VSPLIT)              \
  TROUPE_MATMUL_QKV(matmul_qkv_##XN##T##_tiled, LOAD, TROUPE_TILE, X, VLOAD, VSPLIT) \
  TROUPE_MATMUL_ID(matmul_id_##XN##T##_t1, LOAD, 1, X)                               \
  TROUPE_MATMUL_ID(matmul_id_##XN##T##_t4, LOAD, 4, X)                               \
  TROUPE_MATMUL_ID(matmul_id_##XN##T##_tiled, LOAD, TROUPE_TILE, X)                  \
  TROUPE_MATMUL_ID_GLU(matmul_id_glu_##XN##T##_t1, LOAD, 1, X)                       \
  TROUPE_MATMUL_ID_GLU(matmul_id_glu_##XN##T##_t4, LOAD, 4, X)                       \
  TROUPE_MATMUL_ID_GLU(matmul_id_glu_##XN##T##_tiled, LOAD, TROUPE_TILE, X)

#ifndef TROUPE_TILE
#define TROUPE_TILE 4
#endif

// Every family, unless TROUPE_MM_ONE asks for one (TROUPE_MM_<variant>,
// the variant as in the kernels' names: q4_1, xq_q4_1, ...): a device
// other than a CPU builds a program per variant its model uses
// (runtime/device/cl_programs.cpp), since NVIDIA's compiler took minutes
// over all fifteen; with TROUPE_MM_ONE alone, only the macros
// (matmul_panels.cl's program).

#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_f32)
TROUPE_MATMUL_FAMILY(f32, load_f32, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_f16)
TROUPE_MATMUL_FAMILY(f16, load_f16, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_q4_0)
TROUPE_MATMUL_FAMILY(q4_0, load_q4_0, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_q4_1)
TROUPE_MATMUL_FAMILY(q4_1, load_q4_1, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_q8_0)
TROUPE_MATMUL_FAMILY(q8_0, load_q8_0, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_ku6)
TROUPE_MATMUL_FAMILY(ku6, load_ku6, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_q5_1)
TROUPE_MATMUL_FAMILY_SPLIT(q5_1, load_q5_1, F, , load_q5_1_v, 1)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_q5_0)
TROUPE_MATMUL_FAMILY_SPLIT(q5_0, load_q5_0, F, , load_q8_0, 1)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_bf16)
TROUPE_MATMUL_FAMILY(bf16, load_bf16, F, )
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_xq_q4_0)
TROUPE_MATMUL_FAMILY(q4_0, loadu_q4_0, Q, xq_)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_xq_q4_1)
TROUPE_MATMUL_FAMILY(q4_1, loadu_q4_1, Q, xq_)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_xq_q8_0)
TROUPE_MATMUL_FAMILY(q8_0, loadu_q8_0, Q, xq_)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_xq_ku6)
TROUPE_MATMUL_FAMILY(ku6, loadu_ku6, Q, xq_)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_xq_q5_1)
TROUPE_MATMUL_FAMILY_SPLIT(q5_1, loadu_q5_1, Q, xq_, loadu_q5_1_v, 1)
#endif
#if !defined(TROUPE_MM_ONE) || defined(TROUPE_MM_xq_q5_0)
TROUPE_MATMUL_FAMILY_SPLIT(q5_0, loadu_q5_0, Q, xq_, loadu_q8_0, 1)
#endif
