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

// A work-item's rows [n0, n_end) (whole panels) in passes of PANEL_GROUP
// panels, then one panel at a time: BODY(TT, P, n) for the pass at row n.
#define P_PASSES(TT, n0, n_end, BODY)                                        \
  {                                                                          \
    int n_ = (n0);                                                           \
    for (; n_ + PANEL_GROUP * PANEL <= (n_end); n_ += PANEL_GROUP * PANEL) { \
      BODY(TT, PANEL_GROUP, n_)                                              \
    }                                                                        \
    for (; n_ < (n_end); n_ += PANEL) {                                      \
      BODY(TT, 1, n_)                                                        \
    }                                                                        \
  }

// Plain products: y[t][n..] (+)= the pass's sums.
#define P_MATMUL_PASS(TT, P, n)                                             \
  {                                                                         \
    P_ZERO(TT, P, acc)                                                      \
    P_DOT(TT, P, (n) / PANEL, acc)                                          \
    _Pragma("unroll") for (int p = 0; p < P; ++p)                           \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) {    \
      __global float* yp = y + (size_t)(t0 + j) * ldy + (n) + p * PANEL;    \
      vstore16(accumulate ? vload16(0, yp) + acc[p][j] : acc[p][j], 0, yp); \
    }                                                                       \
  }

#define TROUPE_MATMUL_PANELS(NAME, TT)                              \
  INLINE void NAME##_at(int gx, int gy, MATMUL_ARGS(F)) {           \
    const int t0 = gy * TT;                                         \
    if (t0 >= T) return;                                            \
    F_SETUP(TT) const int n0 = gx * rows_per_item;                  \
    P_PASSES(TT, n0, min(n0 + rows_per_item, N), P_MATMUL_PASS)     \
  }                                                                 \
  __kernel void NAME(MATMUL_ARGS(F)) {                              \
    NAME##_at(get_global_id(0), get_global_id(1), MATMUL_NAMES(F)); \
  }

// Gated FFN: the gate rows' sums go to h, then the up rows' sums multiply
// their SiLU in place (both passes' accumulators at once would not fit
// the registers).
#define P_GLU_PASS(TT, P, n)                                                        \
  {                                                                                 \
    P_ZERO(TT, P, g)                                                                \
    P_DOT(TT, P, (n) / PANEL, g)                                                    \
    _Pragma("unroll") for (int p = 0; p < P; ++p)                                   \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T)              \
            vstore16(g[p][j], 0, h + (size_t)(t0 + j) * F + (n) + p * PANEL);       \
  }                                                                                 \
  {                                                                                 \
    P_ZERO(TT, P, u)                                                                \
    P_DOT(TT, P, (F + (n)) / PANEL, u)                                              \
    _Pragma("unroll") for (int p = 0; p < P; ++p)                                   \
        _Pragma("unroll") for (int j = 0; j < TT; ++j) if (t0 + j < T) {            \
      __global float* hp = h + (size_t)(t0 + j) * F + (n) + p * PANEL;              \
      const float16 gv = vload16(0, hp);                                            \
      vstore16((float16)(silu_float8(gv.lo), silu_float8(gv.hi)) * u[p][j], 0, hp); \
    }                                                                               \
  }

#define TROUPE_MATMUL_GLU_PANELS(NAME, TT)                       \
  INLINE void NAME##_at(int gx, int gy, GLU_ARGS(F)) {           \
    const int t0 = gy * TT;                                      \
    if (t0 >= T) return;                                         \
    F_SETUP(TT) const int n0 = gx * rows_per_item;               \
    P_PASSES(TT, n0, min(n0 + rows_per_item, F), P_GLU_PASS)     \
  }                                                              \
  __kernel void NAME(GLU_ARGS(F)) {                              \
    NAME##_at(get_global_id(0), get_global_id(1), GLU_NAMES(F)); \
  }

// QKV: a panel is 16 rows of one head (hd a multiple of 16): Q rows go to
// qkv, K and V rows into the paged cache (attention.cl's layout), as
// matmul.cl's QKV kernels store them.  The normal RoPE layout pairs rows
// (2i, 2i + 1), a panel's even and odd lanes; rope_dims a multiple of 16
// rotates whole panels or none.
#define P_QKV_PASS(TT, P, n)                                                             \
  {                                                                                      \
    P_ZERO(TT, P, acc)                                                                   \
    P_DOT(TT, P, (n) / PANEL, acc)                                                       \
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

#define TROUPE_MATMUL_QKV_PANELS(NAME, TT)                       \
  INLINE void NAME##_at(int gx, int gy, QKV_ARGS(F)) {           \
    const int t0 = gy * TT;                                      \
    if (t0 >= T) return;                                         \
    F_SETUP(TT) const int half_rope = rope_dims / 2;             \
    const int stride = (n_head + 2 * n_kv) * hd;                 \
    const int r0 = 2 * gx * rows_per_item;                       \
    const int r_end = min(r0 + 2 * rows_per_item, stride);       \
    QKV_KV_SLOTS(TT, r_end > r0 && (r_end - 1) / hd >= n_head)   \
    P_PASSES(TT, r0, r_end, P_QKV_PASS)                          \
  }                                                              \
  __kernel void NAME(QKV_ARGS(F)) {                              \
    NAME##_at(get_global_id(0), get_global_id(1), QKV_NAMES(F)); \
  }

#define TROUPE_PANELS_FAMILY(TS, TT)                 \
  TROUPE_MATMUL_PANELS(matmul_f32p_##TS, TT)         \
  TROUPE_MATMUL_GLU_PANELS(matmul_glu_f32p_##TS, TT) \
  TROUPE_MATMUL_QKV_PANELS(matmul_qkv_f32p_##TS, TT)

TROUPE_PANELS_FAMILY(t1, 1)
TROUPE_PANELS_FAMILY(t4, 4)
TROUPE_PANELS_FAMILY(tiled, TROUPE_TILE)
