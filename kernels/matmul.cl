// y[t][n] (+)= sum_k W[n][k] * x[t][k] for every weight type.
// One work-item computes one output row n for a tile of TT consecutive
// tokens, so each weight block is decoded once per TT tokens (prefill) and
// the decode path (TT = 1) does no redundant arithmetic.  `accumulate`
// adds into y: the residual add fused into the output projections.

#define TROUPE_MATMUL(NAME, LOAD, TT)                                                         \
  __kernel void NAME(__global const uchar* wq, __global const half* wd,                        \
                     __global const half* wm, __global const float* x, __global float* y,      \
                     int K, int N, int T, int ldy, int accumulate) {                           \
    const int n = get_global_id(0);                                                            \
    const int t0 = get_global_id(1) * TT;                                                      \
    if (n >= N || t0 >= T) return;                                                             \
    const int nb = K / QK;                                                                     \
    __global const float* xs[TT];                                                              \
    float16 acc[TT];                                                                           \
    for (int j = 0; j < TT; ++j) {                                                             \
      xs[j] = x + (size_t)min(t0 + j, T - 1) * K;                                              \
      acc[j] = (float16)0.0f;                                                                  \
    }                                                                                          \
    for (int b = 0; b < nb; ++b) {                                                             \
      float16 lo, hi;                                                                          \
      LOAD(wq, wd, wm, K, nb, n, b, &lo, &hi);                                                 \
      for (int j = 0; j < TT; ++j) {                                                           \
        acc[j] = fma(lo, vload16(0, xs[j] + b * QK), acc[j]);                                  \
        acc[j] = fma(hi, vload16(1, xs[j] + b * QK), acc[j]);                                  \
      }                                                                                        \
    }                                                                                          \
    for (int j = 0; j < TT && t0 + j < T; ++j) {                                               \
      size_t i = (size_t)(t0 + j) * ldy + n;                                                   \
      float r = hsum16(acc[j]);                                                                \
      y[i] = accumulate ? y[i] + r : r;                                                        \
    }                                                                                          \
  }

TROUPE_MATMUL(matmul_f32_t1, load_f32, 1)
TROUPE_MATMUL(matmul_f32_t4, load_f32, 4)
TROUPE_MATMUL(matmul_f16_t1, load_f16, 1)
TROUPE_MATMUL(matmul_f16_t4, load_f16, 4)
TROUPE_MATMUL(matmul_q4_0_t1, load_q4_0, 1)
TROUPE_MATMUL(matmul_q4_0_t4, load_q4_0, 4)
TROUPE_MATMUL(matmul_q4_1_t1, load_q4_1, 1)
TROUPE_MATMUL(matmul_q4_1_t4, load_q4_1, 4)
TROUPE_MATMUL(matmul_q8_0_t1, load_q8_0, 1)
TROUPE_MATMUL(matmul_q8_0_t4, load_q8_0, 4)
