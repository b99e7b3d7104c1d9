// Greedy draws on the device (step overlap, runtime/engine/step_overlap.hpp): the
// token of draw k is the first maximum of logit row rows[k], -1 where the
// row holds a NaN: what the host sampler's greedy path picks, or refuses.
// The next step's embedding reads drawn[] (token_at), so it can be
// enqueued before this step's logits reach the host.  One work-item per
// draw; sixteen lanes each keep their first maximum, then the largest
// value wins with the smallest index among equals.
//
// OpenAI's logit_bias: draw k's biased tokens are bias_tok[bias_off[k] ..
// bias_off[k + 1]) (sorted, distinct) with bias_val beside them; the draw
// is the first maximum of logit + bias, as the host sampler adds them.
// The unbiased maximum stands unless its token is biased; then the first
// maximum of the unbiased tokens is found again (one pass, skipping the
// biased ones); the biased tokens' sums then compete with it.

// Whether `t` is among the sorted toks[0, n).
int biased(__global const int* toks, int n, int t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (toks[mid] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && toks[lo] == t;
}

__kernel void argmax_rows(__global const float* logits, int n_vocab, __global const int* rows,
                          __global int* drawn, __global const int* bias_off,
                          __global const int* bias_tok, __global const float* bias_val) {
  const int k = get_global_id(0);
  __global const float* l = logits + (size_t)rows[k] * n_vocab;
  const int n16 = n_vocab / 16 * 16;
  int best_i = 0;
  float best_v = l[0];
  int nan_seen = 0;
  if (n16 > 0) {
    float16 bv = vload16(0, l);
    int16 bi = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int16 nan_lanes = isnan(bv);
    for (int i = 16; i < n16; i += 16) {
      const float16 v = vload16(0, l + i);
      nan_lanes |= isnan(v);
      const int16 better = isgreater(v, bv);  // strict: a lane keeps its first maximum
      bv = select(bv, v, better);
      bi = select(bi, (int16)(i) + (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                  better);
    }
    nan_seen = any(nan_lanes);
    const float lanes_v[16] = {bv.s0, bv.s1, bv.s2, bv.s3, bv.s4, bv.s5, bv.s6, bv.s7,
                               bv.s8, bv.s9, bv.sa, bv.sb, bv.sc, bv.sd, bv.se, bv.sf};
    const int lanes_i[16] = {bi.s0, bi.s1, bi.s2, bi.s3, bi.s4, bi.s5, bi.s6, bi.s7,
                             bi.s8, bi.s9, bi.sa, bi.sb, bi.sc, bi.sd, bi.se, bi.sf};
    best_v = lanes_v[0];
    best_i = lanes_i[0];
    for (int j = 1; j < 16; ++j)
      if (lanes_v[j] > best_v || (lanes_v[j] == best_v && lanes_i[j] < best_i)) {
        best_v = lanes_v[j];
        best_i = lanes_i[j];
      }
  }
  for (int i = n16; i < n_vocab; ++i) {
    const float v = l[i];
    if (isnan(v)) nan_seen = 1;
    if (v > best_v) {
      best_v = v;
      best_i = i;
    }
  }
  const int b0 = bias_off[k], nb = bias_off[k + 1] - b0;
  if (nan_seen || nb == 0) {
    drawn[k] = nan_seen ? -1 : best_i;
    return;
  }
  __global const int* toks = bias_tok + b0;
  __global const float* vals = bias_val + b0;
  if (biased(toks, nb, best_i)) {
    best_i = -1;
    for (int i = 0; i < n_vocab; ++i)
      if (!biased(toks, nb, i) && (best_i < 0 || l[i] > best_v)) {
        best_v = l[i];
        best_i = i;
      }
  }
  for (int j = 0; j < nb; ++j) {
    const int t = toks[j];
    if (t >= n_vocab) continue;
    const float v = l[t] + vals[j];
    if (best_i < 0 || v > best_v || (v == best_v && t < best_i)) {
      best_v = v;
      best_i = t;
    }
  }
  drawn[k] = best_i;
}
