// out[t] = row token_at(tokens, drawn, t) of the embedding table,
// dequantized to F32.
// One work-item per (block of 32 values, token).

#define TROUPE_EMBED(NAME, LOAD)                                                                   \
  __kernel void NAME(__global const uchar* wq, __global const float* wd, __global const float* wm, \
                     __global const int* tokens, __global const int* drawn, __global float* out,   \
                     int K) {                                                                      \
    const int b = get_global_id(0);                                                                \
    const int t = get_global_id(1);                                                                \
    const int nb = K / QK;                                                                         \
    if (b >= nb) return;                                                                           \
    float16 lo, hi;                                                                                \
    LOAD(wq, wd, wm, K, nb, token_at(tokens, drawn, t), b, &lo, &hi);                              \
    __global float* o = out + (size_t)t * K + b * QK;                                              \
    vstore16(lo, 0, o);                                                                            \
    vstore16(hi, 1, o);                                                                            \
  }

TROUPE_EMBED(embed_f32, load_f32)
TROUPE_EMBED(embed_f16, load_f16)
TROUPE_EMBED(embed_q4_0, load_q4_0)
TROUPE_EMBED(embed_q4_1, load_q4_1)
TROUPE_EMBED(embed_q8_0, load_q8_0)
TROUPE_EMBED(embed_ku6, load_ku6)
TROUPE_EMBED(embed_q5_1, load_q5_1)
TROUPE_EMBED(embed_bf16, load_bf16)
TROUPE_EMBED(embed_q5_0, load_q5_0)
