// Products over F32 weights held in panels (the device type f32p; the
// host's device_weights says which models): rows in groups of 16, each
// group stored column by column, value (r, k) at (r / 16) 16 K + 16 k +
// r % 16.  A work-item's loop loads one column of a panel (16 rows' values
// at k, one vector) and multiplies it by each token's x[k], broadcast: an
// outer product, each lane one row's sum.  The row-major kernels
// (matmul.cl) sum a row across the lanes and end every row with a
// horizontal sum, a third of a tile's work with stories15M's 288-value rows
// (docs/bench_engine.md); here there is none, and the loop is three panels'
// loads and eight broadcasts to 24 fmas (3 panels x 8 tokens, 24 of
// AVX-512's 32 registers).  Measured alone on 768 x 288 x 512 (a
// stand-alone OpenCL program, PoCL): 2.0x the row-major kernel's GFLOP/s.
//
// Each row's sum is one fma chain over k in order, from zero, whatever the
// tile and however many panels a work-item takes: a token's result never
// depends on its tile (matmul.cl), so the fused layers, the launches apart
// and a preempted sequence's recomputation agree bit for bit.  The sums
// are not those of the row-major F32 kernels (another order): a model's
// layers are all in panels or none (device_weights).
//
// Same arguments as matmul.cl's F32 kernels, so layer.cl runs these as
// the weight type f32p; rows_per_item (for QKV: rotation pairs, two rows
// each) must give whole panels, and N (F for gate/up) must be a multiple
// of 16 (the host's panel_rows_per_item).  Only what the F32 layers use:
// SiLU (no GELU, no quantized output) and the normal RoPE layout, with
// rope_dims a multiple of 16.

#define PANEL 16
// Panels per pass of a work-item: 3 x TROUPE_TILE (8) accumulators.
#define PANEL_GROUP 3

#define P_ZERO(TT, P, acc)                                                                     \
  float16 acc[P][TT];                                                                          \
  _Pragma("unroll") for (int p = 0; p < P; ++p) _Pragma("unroll") for (int j = 0; j < TT; ++j) \
      acc[p][j] = (float16)0.0f;

// acc[p][j] += panel p0 + p of W . x[t0 + j] for p < P, j < TT.
#define P_DOT(TT, P, p0, acc)                                                                \
  {                                                                                          \
    __global const float* wp_ = (__global const float*)wq + (size_t)(p0)*PANEL * K;          \
    for (int k = 0; k < K; ++k) {                                                            \
      float16 w_[P];                                                                         \
      _Pragma("unroll") for (int p = 0; p < P; ++p) w_[p] =                                  \
          vload16(0, wp_ + ((size_t)p * K + k) * PANEL);                                     \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) {                 \
        const float16 s_ = (float16)xs[j][k];                                                \
        _Pragma("unroll") for (int p = 0; p < P; ++p) acc[p][j] = fma(w_[p], s_, acc[p][j]); \
      }                                                                                      \
    }                                                                                        \
  }

// A work-item's rows [n0, n_end) (whole panels) in passes of GROUP
// panels, then one panel at a time: BODY(DOT, TT, P, n) for the pass at
// row n, its sums by DOT(TT, P, p0, acc) (P_DOT here, QP_DOT for the
// quantized panels below).
#define P_PASSES(DOT, GROUP, TT, n0, n_end, BODY)                \
  {                                                              \
    int n_ = (n0);                                               \
    for (; n_ + (GROUP)*PANEL <= (n_end); n_ += (GROUP)*PANEL) { \
      BODY(DOT, TT, GROUP, n_)                                   \
    }                                                            \
    for (; n_ < (n_end); n_ += PANEL) {                          \
      BODY(DOT, TT, 1, n_)                                       \
    }                                                            \
  }

// Plain products: y[t][n..] (+)= the pass's sums.
#define P_MATMUL_PASS(DOT, TT, P, n)                                        \
  {                                                                         \
    P_ZERO(TT, P, acc)                                                      \
    DOT(TT, P, (n) / PANEL, acc)                                            \
    _Pragma("unroll") for (int p = 0; p < P; ++p)                           \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) {    \
      __global float* yp = y + (size_t)(t0 + j) * ldy + (n) + p * PANEL;    \
      vstore16(accumulate ? vload16(0, yp) + acc[p][j] : acc[p][j], 0, yp); \
    }                                                                       \
  }

#define TROUPE_MATMUL_PANELS(NAME, TT, X, DOT, GROUP)                         \
  INLINE void NAME##_at(int gx, int gy, MATMUL_ARGS(X)) {                     \
    const int t0 = gy * TT;                                                   \
    if (t0 >= T) return;                                                      \
    X##_SETUP(TT) const int n0 = gx * rows_per_item;                          \
    P_PASSES(DOT, GROUP, TT, n0, min(n0 + rows_per_item, N), P_MATMUL_PASS)   \
  }                                                                           \
  __kernel void NAME(MATMUL_ARGS(X)) {                                        \
    NAME##_at(get_global_id(0), get_global_id(1), MATMUL_NAMES(X));           \
  }

// Gated FFN: the gate rows' sums go to h, then the up rows' sums multiply
// their SiLU in place (both passes' accumulators at once would not fit
// the registers).
#define P_GLU_PASS(DOT, TT, P, n)                                                   \
  {                                                                                 \
    P_ZERO(TT, P, g)                                                                \
    DOT(TT, P, (n) / PANEL, g)                                                      \
    _Pragma("unroll") for (int p = 0; p < P; ++p)                                   \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T)              \
            vstore16(g[p][j], 0, h + (size_t)(t0 + j) * F + (n) + p * PANEL);       \
  }                                                                                 \
  {                                                                                 \
    P_ZERO(TT, P, u)                                                                \
    DOT(TT, P, (F + (n)) / PANEL, u)                                                \
    _Pragma("unroll") for (int p = 0; p < P; ++p)                                   \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) {            \
      __global float* hp = h + (size_t)(t0 + j) * F + (n) + p * PANEL;              \
      const float16 gv = vload16(0, hp);                                            \
      vstore16((float16)(silu_float8(gv.lo), silu_float8(gv.hi)) * u[p][j], 0, hp); \
    }                                                                               \
  }

// With quant_out (quantized panels: the down product's input), each
// token's h rows of the work-item (whole blocks of 32) quantized once
// written, as matmul.cl's GLU kernels do.
#define TROUPE_MATMUL_GLU_PANELS(NAME, TT, X, DOT, GROUP)                                 \
  INLINE void NAME##_at(int gx, int gy, GLU_ARGS(X)) {                                    \
    const int t0 = gy * TT;                                                               \
    if (t0 >= T) return;                                                                  \
    X##_SETUP(TT) const int n0 = gx * rows_per_item;                                      \
    const int n_end = min(n0 + rows_per_item, F);                                         \
    P_PASSES(DOT, GROUP, TT, n0, n_end, P_GLU_PASS)                                       \
    if (quant_out & GLU_QUANT_OUT)                                                        \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) for (int n = n0;     \
                                                                          n < n_end;      \
                                                                          n += QK) {      \
        const size_t at = (size_t)(t0 + j) * F + n;                                       \
        quantize_block(vload16(0, h + at), vload16(1, h + at), oq + at, od + at / QK,     \
                       os + at / QK);                                                     \
      }                                                                                   \
  }                                                                                       \
  __kernel void NAME(GLU_ARGS(X)) {                                                       \
    NAME##_at(get_global_id(0), get_global_id(1), GLU_NAMES(X));                          \
  }

// QKV: a panel is 16 rows of one head (hd a multiple of 16): Q rows go to
// qkv, K and V rows into the paged cache (attention.cl's layout), as
// matmul.cl's QKV kernels store them.  The normal RoPE layout pairs rows
// (2i, 2i + 1), a panel's even and odd lanes; rope_dims a multiple of 16
// rotates whole panels or none.
#define P_QKV_PASS(DOT, TT, P, n)                                                        \
  {                                                                                      \
    P_ZERO(TT, P, acc)                                                                   \
    DOT(TT, P, (n) / PANEL, acc)                                                         \
    _Pragma("unroll") for (int p = 0; p < P; ++p) {                                      \
      const int r = (n) + p * PANEL;                                                     \
      const int head = r / hd, d = r % hd;                                               \
      const int rotate = head < n_head + n_kv && d < rope_dims;                          \
      _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) {                   \
        const int t = t0 + j;                                                            \
        float16 v = acc[p][j];                                                           \
        if (has_bias) v += vload16(0, bias + r);                                         \
        if (rotate) {                                                                    \
          const float16 cs =                                                             \
              vload16(0, (__global const float*)(rope + (size_t)t * half_rope + d / 2)); \
          const float8 a = v.even, b = v.odd, c = cs.even, s = cs.odd;                   \
          float16 o;                                                                     \
          o.even = a * c - b * s;                                                        \
          o.odd = a * s + b * c;                                                         \
          v = o;                                                                         \
        }                                                                                \
        if (head < n_head) {                                                             \
          vstore16(v, 0, qkv + (size_t)t * stride + r);                                  \
        } else {                                                                         \
          const int g = head < n_head + n_kv ? head - n_head : head - n_head - n_kv;     \
          const size_t gk = (size_t)g * page_size * hd;                                  \
          float vs[PANEL];                                                               \
          vstore16(v, 0, vs);                                                            \
          if (head < n_head + n_kv) { /* K: transposed within the page */                \
            for (int l = 0; l < PANEL; ++l)                                              \
              KV_STORE(vs[l], kv_k[j] + gk + (size_t)(d + l) * page_size, kc);           \
          } else {                                                                       \
            for (int l = 0; l < PANEL; ++l) KV_STORE(vs[l], kv_v[j] + gk + d + l, vc);   \
          }                                                                              \
        }                                                                                \
      }                                                                                  \
    }                                                                                    \
  }

#define TROUPE_MATMUL_QKV_PANELS(NAME, TT, X, DOT, GROUP)        \
  INLINE void NAME##_at(int gx, int gy, QKV_ARGS(X)) {           \
    const int t0 = gy * TT;                                      \
    if (t0 >= T) return;                                         \
    X##_SETUP(TT) const int half_rope = rope_dims / 2;           \
    const int stride = (n_head + 2 * n_kv) * hd;                 \
    const int r0 = 2 * gx * rows_per_item;                       \
    const int r_end = min(r0 + 2 * rows_per_item, stride);       \
    QKV_KV_SLOTS(TT, r_end > r0 && (r_end - 1) / hd >= n_head)   \
    P_PASSES(DOT, GROUP, TT, r0, r_end, P_QKV_PASS)              \
  }                                                              \
  __kernel void NAME(QKV_ARGS(X)) {                              \
    NAME##_at(get_global_id(0), get_global_id(1), QKV_NAMES(X)); \
  }

#define TROUPE_PANELS_FAMILY(TS, TT)                                   \
  TROUPE_MATMUL_PANELS(matmul_f32p_##TS, TT, F, P_DOT, PANEL_GROUP)    \
  TROUPE_MATMUL_GLU_PANELS(matmul_glu_f32p_##TS, TT, F, P_DOT, PANEL_GROUP) \
  TROUPE_MATMUL_QKV_PANELS(matmul_qkv_f32p_##TS, TT, F, P_DOT, PANEL_GROUP)

TROUPE_PANELS_FAMILY(t1, 1)
TROUPE_PANELS_FAMILY(t4, 4)
TROUPE_PANELS_FAMILY(tiled, TROUPE_TILE)

// Quantized weights in panels (the device types q4_1p and q8_0p;
// device_weights), with integer products against the activations
// quantized to 8 bits in blocks of 32 (quantize.cl), as the row-major xq
// kernels take them.  Per panel p and block b: the 16 rows' quants as
// vectors of 16 lanes, lane r holding four bytes of row r; then the 16
// rows' scales d (and, q4_1p, mins m) as floats.
//   q4_1p: four vectors, vector c holding the row's block bytes 4c..4c+3:
//          its low nibbles are values 4c..4c+3, its high nibbles values
//          16 + 4c..16 + 4c + 3 (the activation block's words c and 4 + c);
//          a row's block sum d dx sum(u q) + m s (s: the activation block's
//          half-rounded scaled sum, .x, llama.cpp's Q8_1 s).
//   q8_0p: eight vectors, vector c the row's values 4c..4c+3 (signed);
//          the block sum d dx (sum((q + 128) w) - 128 sum(w)), the integer
//          sum exact as llama.cpp's.
// One vpdpbusd takes four values of 16 rows against one activation word
// broadcast, so a block costs eight of them a token and its scales a
// multiply and an fma or two for the 16 rows, where the row-major kernels
// pay a conversion, a scale shuffle and two fmas per row and block pair,
// and end each row with a horizontal sum.  Measured: SmolLM2 Q4_1 pp512
// 2.09x the row-major kernels, tg128 0.98x (docs/bench_engine.md).
//
// Each row's sum is a chain over blocks in order, from zero, whatever the
// tile: a token's result never depends on its tile, and every layer of
// such a model is in panels (device_weights), so prefill, decode and fused
// layers agree bit for bit.  The sums are not the row-major kernels'
// (another order).  One panel a pass: two would not fit the 32 vector
// registers with eight tokens' sums.
// Lane i: acc + the sum over bytes 4i..4i+3 of u (unsigned) times s
// (signed).  Without VNNI (the engine holds no panels there; the kernel
// tests build them): widened products, since q8_0p's u reach 255, past
// what AVX2's saturating vpmaddubsw pairs hold.
#ifdef TROUPE_VNNI
#define QP_ONTO(acc, u, s) dpbusd2_onto(acc, u, s)
#else
inline int4 qp_lanes4(int4 u, int4 s) {
  const int16 p = convert_int16(as_uchar16(u)) * convert_int16(as_char16(s));
  return p.s048c + p.s159d + p.s26ae + p.s37bf;
}
inline int16 qp_dot_wide(int16 u, int16 s) {
  return (int16)(qp_lanes4(u.s0123, s.s0123), qp_lanes4(u.s4567, s.s4567),
                 qp_lanes4(u.s89ab, s.s89ab), qp_lanes4(u.scdef, s.scdef));
}
#define QP_ONTO(acc, u, s) ((acc) + qp_dot_wide(u, s))
#endif

#define QP_WORDS_q4_1p 4
#define QP_U_q4_1p 8
#define QP_LOAD_q4_1p(wp_, u_)                          \
  _Pragma("unroll") for (int c = 0; c < 4; ++c) {       \
    const int16 raw = vload16(c, wp_);                  \
    u_[c] = raw & (int16)0x0F0F0F0F;                    \
    u_[4 + c] = (raw >> 4) & (int16)0x0F0F0F0F;         \
  }
#define QP_SCALES_q4_1p(wb, d_, m_) \
  const float16 d_ = vload16(wb, wd), m_ = vload16(wb, wm);
#define QP_BLOCK_q4_1p(i_, d_, m_, xb, A)                    \
  A = fma(convert_float16(i_), d_ * xd[xb], A);              \
  A = fma(m_, (float16)xsum[xb].x, A);

#define QP_WORDS_q8_0p 8
#define QP_U_q8_0p 8
// The weights are vpdpbusd's signed operand and the activations, plus 128,
// its unsigned one; 128 sum(w), the correction, once a block for all the
// tile's tokens (no division by dx per token, which measured 1.23x where
// Q4_1 took 2.09x).
#define QP_LOAD_q8_0p(wp_, u_)                                                      \
  int16 corr_ = (int16)0;                                                           \
  _Pragma("unroll") for (int c = 0; c < 8; ++c) {                                   \
    u_[c] = vload16(c, wp_);                                                        \
    corr_ = QP_ONTO(corr_, (int16)(int)0x80808080, u_[c]);                          \
  }
#define QP_SCALES_q8_0p(wb, d_, m_) const float16 d_ = vload16(wb, wd);
#define QP_BLOCK_q8_0p(i_, d_, m_, xb, A) \
  A = fma(convert_float16(i_ - corr_), d_ * xd[xb], A);

// One word c of the activation block (four values, broadcast to the 16
// rows) into the block's sums.
#define QP_WORD_q4_1p(i_, u, x) QP_ONTO(i_, u, (int16)(x))
#define QP_WORD_q8_0p(i_, u, x) QP_ONTO(i_, (int16)(as_int(as_uint(x) ^ 0x80808080u)), u)

#define QP_DOT_T(WT, TT, P, p0, acc)                                                           \
  {                                                                                            \
    for (int b = 0; b < nb; ++b) {                                                             \
      _Pragma("unroll") for (int p = 0; p < P; ++p) {                                          \
        const size_t wb = (size_t)((p0) + p) * nb + b;                                         \
        __global const int* wp_ = (__global const int*)wq + wb * QP_WORDS_##WT * PANEL;        \
        int16 u_[QP_U_##WT];                                                                   \
        QP_LOAD_##WT(wp_, u_) QP_SCALES_##WT(wb, d_, m_)                                       \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (TILE_LIVE(TT, j)) {                 \
          const size_t xb = (size_t)tj[j] * nb + b;                                            \
          __global const int* xw = xq + xb * 8;                                                \
          int16 i_ = (int16)0;                                                                 \
          _Pragma("unroll") for (int c = 0; c < 8; ++c) i_ = QP_WORD_##WT(i_, u_[c], xw[c]);   \
          QP_BLOCK_##WT(i_, d_, m_, xb, acc[p][j])                                             \
        }                                                                                      \
      }                                                                                        \
    }                                                                                          \
  }
#define QP_DOT_q4_1p(TT, P, p0, acc) QP_DOT_T(q4_1p, TT, P, p0, acc)
#define QP_DOT_q8_0p(TT, P, p0, acc) QP_DOT_T(q8_0p, TT, P, p0, acc)

#define TROUPE_QPANELS_FAMILY(WT, TS, TT)                                       \
  TROUPE_MATMUL_PANELS(matmul_xq_##WT##_##TS, TT, Q, QP_DOT_##WT, 1)            \
  TROUPE_MATMUL_GLU_PANELS(matmul_glu_xq_##WT##_##TS, TT, Q, QP_DOT_##WT, 1)    \
  TROUPE_MATMUL_QKV_PANELS(matmul_qkv_xq_##WT##_##TS, TT, Q, QP_DOT_##WT, 1)

TROUPE_QPANELS_FAMILY(q4_1p, t1, 1)
TROUPE_QPANELS_FAMILY(q4_1p, t4, 4)
TROUPE_QPANELS_FAMILY(q4_1p, tiled, TROUPE_TILE)
TROUPE_QPANELS_FAMILY(q8_0p, t1, 1)
TROUPE_QPANELS_FAMILY(q8_0p, t4, 4)
TROUPE_QPANELS_FAMILY(q8_0p, tiled, TROUPE_TILE)
