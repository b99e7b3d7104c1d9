// Penalized draws (runtime/device/draw_penalties.hpp): each penalized
// draw's logit row is copied into a row of its own (copy_rows), where its
// logit_bias and penalties are applied as the host sampler applies them
// (penalize_rows); argmax_rows and sample_rows then draw from that row.

// Row src[j] into row dst[j]: item (i, j) copies logit i.
__kernel void copy_rows(__global float* logits, int n_vocab, __global const int* src,
                        __global const int* dst) {
  const int i = get_global_id(0), j = get_global_id(1);
  if (i < n_vocab) logits[(size_t)dst[j] * n_vocab + i] = logits[(size_t)src[j] * n_vocab + i];
}

// runtime/engine/draw_arith.hpp's penalize, operation for operation.
float draw_penalize(float v, int count, float rep, float inv_rep, float freq, float pres) {
  if (rep != 1.0f) v = v > 0 ? v * inv_rep : v * rep;
  return v - fma((float)count, freq, pres);
}

// One item per penalized draw j: its entries (token, count, bias) in
// token order, the bias added first, then the penalty where the token
// occurs in the window; the draw's input token counted once more (a draw
// of the step before, still in drawn[], where input is negative).
__kernel void penalize_rows(__global float* logits, int n_vocab, __global const int* dst,
                            __global const int* input, __global const float* par,
                            __global const int* off, __global const int* tok,
                            __global const int* cnt, __global const int* has_bias,
                            __global const float* bias, __global const int* drawn) {
  const int j = get_global_id(0);
  __global float* l = logits + (size_t)dst[j] * n_vocab;
  const int ref = input[j];
  const int t_in = ref == INT_MIN ? -1 : (ref >= 0 ? ref : max(drawn[-1 - ref], 0));
  const float rep = par[4 * j], inv_rep = par[4 * j + 1], freq = par[4 * j + 2],
              pres = par[4 * j + 3];
  int found = 0;
  for (int e = off[j]; e < off[j + 1]; ++e) {
    const int t = tok[e];
    if (t >= 0 && t < n_vocab) {
      const int c = cnt[e] + (t == t_in ? 1 : 0);
      found |= t == t_in;
      float v = l[t];
      if (has_bias[e]) v += bias[e];
      if (c > 0) v = draw_penalize(v, c, rep, inv_rep, freq, pres);
      l[t] = v;
    }
  }
  if (!found && t_in >= 0 && t_in < n_vocab)
    l[t_in] = draw_penalize(l[t_in], 1, rep, inv_rep, freq, pres);
}
