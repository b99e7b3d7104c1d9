// Penalized draws (runtime/device/draw_penalties.hpp): each penalized
// draw's logit row is copied into a row of its own, where its logit_bias
// and penalties are applied as the host sampler applies them; argmax_rows
// and sample_rows then draw from that row.

// runtime/engine/draw_arith.hpp's penalize, operation for operation.
float draw_penalize(float v, int count, float rep, float inv_rep, float freq, float pres) {
  const float m = rep == 1.0f ? 1.0f : (v > 0 ? inv_rep : rep);
  return fma(v, m, -fma((float)count, freq, pres));
}

// Logits each item copies and penalizes.
#define PEN_CHUNK 64

// Item (c, j): logits [c * PEN_CHUNK, +PEN_CHUNK) of draw j, from row
// src[j] into row dst[j], then the draw's entries (token, count, bias; in
// token order) that fall there: the bias added first, then the penalty
// where the token occurs in the window, the draw's input token counted
// once more (a draw of the step before, still in drawn[], where input is
// negative; k_no_input, INT_MIN: none).
__kernel void penalize_rows(__global float* logits, int n_vocab, __global const int* src,
                            __global const int* dst, __global const int* input,
                            __global const float* par, __global const int* off,
                            __global const int* tok, __global const int* cnt,
                            __global const int* has_bias, __global const float* bias,
                            __global const int* drawn) {
  const int c = get_global_id(0), j = get_global_id(1);
  const int i0 = c * PEN_CHUNK;
  if (i0 >= n_vocab) return;
  const int i1 = min(i0 + PEN_CHUNK, n_vocab);
  __global const float* s = logits + (size_t)src[j] * n_vocab;
  __global float* l = logits + (size_t)dst[j] * n_vocab;
  for (int i = i0; i < i1; ++i) l[i] = s[i];
  const int ref = input[j];
  const int t_in = ref == INT_MIN ? -1 : (ref >= 0 ? ref : max(drawn[-1 - ref], 0));
  const float rep = par[4 * j], inv_rep = par[4 * j + 1], freq = par[4 * j + 2],
              pres = par[4 * j + 3];
  // The first entry at or after i0.
  int lo = off[j], hi = off[j + 1];
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (tok[mid] < i0)
      lo = mid + 1;
    else
      hi = mid;
  }
  int found = 0;
  for (int e = lo; e < off[j + 1] && tok[e] < i1; ++e) {
    const int t = tok[e];
    const int k = cnt[e] + (t == t_in ? 1 : 0);
    found |= t == t_in;
    float v = l[t];
    if (has_bias[e]) v += bias[e];
    if (k > 0) v = draw_penalize(v, k, rep, inv_rep, freq, pres);
    l[t] = v;
  }
  if (!found && t_in >= i0 && t_in < i1)
    l[t_in] = draw_penalize(l[t_in], 1, rep, inv_rep, freq, pres);
}
