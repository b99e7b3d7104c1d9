// Draws on the device (step overlap, runtime/engine/step_overlap.hpp):
// argmax_rows makes the greedy draws (which[] lists them), sample_rows
// (below) the sampled ones.  Greedy: the
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
                          __global const int* bias_tok, __global const float* bias_val,
                          __global const int* which) {
  const int k = which[get_global_id(0)];  // the greedy draws (sample_rows makes the others)
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

// ---- Sampled draws: temperature, top-k, top-p, min-p, seeded ----
//
// sample_rows draws the token the host sampler draws (sampler.cpp; a
// penalized draw's row is penalize_rows', penalty.cl) from the same logits, bit for bit: the
// arithmetic is runtime/engine/draw_arith.hpp's, mirrored here function
// by function.  Semantics, with w_i = exp((l_i - max) / T) and integer
// weights W_i = floor(w_i * 2^31) (tokens of weight 0 are never drawn):
// candidates in order of larger logit, then smaller index; top-k keeps the
// first k; min-p keeps w_i >= min_p; top-p keeps the shortest prefix of
// those whose weight reaches top_p of the top-k's weight; the draw point
// r = (bits * total) >> 64 picks the first kept token, in index order,
// whose running weight passes r.
//
// One work-group of DRAW_G items per draw (its local memory 18 KiB,
// within OpenCL's 32 KiB minimum), each item a contiguous chunk
// of the vocabulary.  No sort: the cut of top-k (by count) and of top-p
// (by weight) is found by a radix select over the logits' ordered keys,
// four passes of 8 bits, and ties at the cut are broken by index.

#define DRAW_G 8

float draw_exp_neg(float x) {
  if (!(x >= -80.0f)) return 0.0f;
  const float k = rint(x * 1.44269504f);
  float r = fma(-k, 0.693145752f, x);
  r = fma(-k, 1.42860677e-06f, r);
  float p = 1.38888889e-03f;
  p = fma(p, r, 8.33333333e-03f);
  p = fma(p, r, 4.16666667e-02f);
  p = fma(p, r, 1.66666667e-01f);
  p = fma(p, r, 0.5f);
  p = fma(p, r, 1.0f);
  p = fma(p, r, 1.0f);
  return p * as_float(((int)k + 127) << 23);  // times 2^k, exactly (as ldexp)
}

// draw_exp_neg on 8 lanes: the same operations lane by lane.
float8 draw_exp_neg8(float8 x) {
  const float8 k = rint(x * 1.44269504f);
  float8 r = fma(-k, (float8)(0.693145752f), x);
  r = fma(-k, (float8)(1.42860677e-06f), r);
  float8 p = (float8)(1.38888889e-03f);
  p = fma(p, r, (float8)(8.33333333e-03f));
  p = fma(p, r, (float8)(4.16666667e-02f));
  p = fma(p, r, (float8)(1.66666667e-01f));
  p = fma(p, r, (float8)(0.5f));
  p = fma(p, r, (float8)(1.0f));
  p = fma(p, r, (float8)(1.0f));
  const int8 out = isless(x, (float8)(-80.0f)) | isnan(x);
  const int8 e = (convert_int8(select(k, (float8)(0.0f), out)) + 127) << 23;
  return select(p * as_float8(e), (float8)(0.0f), out);
}

uint draw_weight(float w) { return convert_uint_rtz(w * 2147483648.0f); }

uint draw_key(float v) {
  const uint b = as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

float draw_key_value(uint key) {
  return as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

ulong draw_top_p_mass(ulong total, uint p24) {
  return (total >> 24) * p24 + (((total & 0xFFFFFFul) * p24) >> 24);
}

// Whether token i (its key, weight W and w) survives the cuts so far:
// top-k's, where use_k (tokens after (key_k, idx_k) in order are out), and
// min-p.  (Scalars, not a struct: PoCL's work-item loops lost a private
// struct's fields across barriers.)
int draw_kept(uint key, int i, uint W, float w, int use_k, uint key_k, int idx_k, float min_p) {
  return W > 0 && (!use_k || key > key_k || (key == key_k && i <= idx_k)) && w >= min_p;
}

// Token i's weight in the draw: W where every cut keeps it (top-k's and
// min-p, and top-p's where use_p: tokens after (key_p, idx_p) in order are
// out), else 0.
uint draw_final_weight(__global const float* l, __global const float* w, int i, int use_k,
                       uint key_k, int idx_k, float min_p, int use_p, uint key_p, int idx_p) {
  const uint key = draw_key(l[i]);
  const float wi = w[i];
  const uint W = draw_weight(wi);
  return draw_kept(key, i, W, wi, use_k, key_k, idx_k, min_p) &&
                 (!use_p || key > key_p || (key == key_p && i <= idx_p))
             ? W
             : 0u;
}

// Whether the 8 tokens from i (a multiple of 8 with i + 8 <= the chunk's
// end) all weigh nothing (w = 0: the weights pass stores 0 for most of a
// large vocabulary), so a walk over kept tokens may skip them whole.
int draw_weightless8(__global const float* w, int i) {
  return all(vload8(0, w + i) == (float8)(0.0f));
}

ulong draw_group_sum(ulong x, __local ulong* red) {
  red[get_local_id(0)] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  ulong s = 0;
  for (int j = 0; j < DRAW_G; ++j) s += red[j];
  barrier(CLK_LOCAL_MEM_FENCE);
  return s;
}

// The one item's x that is not -1 (-1 if none): PoCL's work-item loops
// run a store under a condition that varies between items wrongly (items
// whose condition was false wrote too), so a result found by one item
// reaches the group through every item's vote.
int draw_group_pick(int x, __local int* votes) {
  votes[get_local_id(0)] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  int v = -1;
  for (int j = 0; j < DRAW_G; ++j) v = max(v, votes[j]);
  barrier(CLK_LOCAL_MEM_FENCE);
  return v;
}

// The sum of x over the items before this one.
ulong draw_group_before(ulong x, __local ulong* red) {
  const int lid = get_local_id(0);
  red[lid] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  ulong s = 0;
  for (int j = 0; j < lid; ++j) s += red[j];
  barrier(CLK_LOCAL_MEM_FENCE);
  return s;
}

// Adds each bin's per-item counts (hist[bin * DRAW_G + item]) into tot, then
// picks the bin, from the top, where the running measure a first reaches
// target (a grows by the bins above it).
int draw_pick_bin(__local ulong* hist, __local ulong* tot, ulong target, ulong* a) {
  const int lid = get_local_id(0);
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int d = lid; d < 256; d += DRAW_G) {
    ulong t = 0;
    for (int j = 0; j < DRAW_G; ++j) t += hist[d * DRAW_G + j];
    tot[d] = t;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  int chosen = 0, found = 0;
  for (int d = 255; d >= 0; --d) {
    const ulong h = tot[d];
    if (!found && *a + h >= target) {
      chosen = d;
      found = 1;
    }
    if (!found) *a += h;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  return chosen;
}

// The first bin of a select: the token's distance below the maximum in
// eighths of a temperature-scaled logit, 255 the top (every token that
// weighs anything lies within 22 of it).  Monotone in the logit, so a bin
// holds a run of the order; only the device bins, the cut is exact.
int draw_gap_bin(float v, float mx, float inv_t) {
  return 255 - (int)fmin(255.0f, (mx - v) * inv_t * 8.0f);
}

// The key at which the measure of the kept tokens (each counts 1, or its
// weight where by_weight), taken in order from the top, first reaches
// target (which the caller knows they reach); *above: the measure of the
// kept tokens before that key.  The first pass bins the item's whole
// chunk by draw_gap_bin (unless the weights pass, with pass0_done, did);
// the item's kept tokens of the picked bin are listed (in list, from i0,
// *n_list of them, in index order), and a radix select over their keys,
// 8 bits a pass, reads only that list, as draw_nth_tie does.
// *own_above: this item's measure in the bins above the pick.
uint draw_select_key(__global const float* l, __global const float* w, int i0, int i1, float mx,
                     float inv_t, int use_k, uint key_k, int idx_k, float min_p, int by_weight,
                     ulong target, int pass0_done, ulong* above, ulong* own_above,
                     __local ulong* hist, __local ulong* tot, __global int* list, int* n_list) {
  const int lid = get_local_id(0);
  ulong a = 0;
  if (!pass0_done) {
    for (int d = 0; d < 256; ++d) hist[d * DRAW_G + lid] = 0;
    for (int b = i0; b < i1; b += 8) {
      const int e = min(b + 8, i1);
      if (e - b == 8 && draw_weightless8(w, b)) continue;
      for (int i = b; i < e; ++i) {
        const uint W = draw_final_weight(l, w, i, use_k, key_k, idx_k, min_p, 0, 0u, 0);
        if (W > 0) hist[draw_gap_bin(l[i], mx, inv_t) * DRAW_G + lid] += by_weight ? (ulong)W : 1ul;
      }
    }
  }
  const int bin = draw_pick_bin(hist, tot, target, &a);
  ulong mine = 0;
  for (int d = bin + 1; d < 256; ++d) mine += hist[d * DRAW_G + lid];
  *own_above = mine;
  // The list: blocks of 8 with no token in the bin are skipped whole.
  int n = 0;
  int i = i0;
  for (; i + 8 <= i1; i += 8) {
    const float8 v = vload8(0, l + i);
    const int8 in_bin =
        (255 - convert_int8(fmin((float8)(255.0f), (mx - v) * inv_t * 8.0f))) == (int8)(bin);
    if (!any(in_bin)) continue;
    for (int j = i; j < i + 8; ++j) {
      const float wi = w[j];
      if (draw_gap_bin(l[j], mx, inv_t) == bin &&
          draw_kept(draw_key(l[j]), j, draw_weight(wi), wi, use_k, key_k, idx_k, min_p))
        list[i0 + n++] = j;
    }
  }
  for (; i < i1; ++i) {
    const float wi = w[i];
    if (draw_gap_bin(l[i], mx, inv_t) == bin &&
        draw_kept(draw_key(l[i]), i, draw_weight(wi), wi, use_k, key_k, idx_k, min_p))
      list[i0 + n++] = i;
  }
  uint prefix = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    barrier(CLK_LOCAL_MEM_FENCE);  // every item has read its column above
    for (int d = 0; d < 256; ++d) hist[d * DRAW_G + lid] = 0;
    for (int j = 0; j < n; ++j) {
      const int i = list[i0 + j];
      const uint key = draw_key(l[i]);
      if (pass == 0 || (key >> (shift + 8)) == prefix)
        hist[((key >> shift) & 255u) * DRAW_G + lid] += by_weight ? (ulong)draw_weight(w[i]) : 1ul;
    }
    prefix = (prefix << 8) | (uint)draw_pick_bin(hist, tot, target, &a);
  }
  *above = a;
  *n_list = n;
  return prefix;
}

// The index of the j-th (from 1) kept token of key `key`, in index order,
// among the listed ones (draw_select_key's list, which holds them all).
int draw_nth_tie(__global const float* l, __global const int* list, int i0, int n, uint key,
                 ulong j, __local ulong* red, __local int* votes) {
  ulong mine = 0;
  for (int t = 0; t < n; ++t) mine += draw_key(l[list[i0 + t]]) == key ? 1ul : 0ul;
  const ulong before = draw_group_before(mine, red);
  ulong c = before;
  int at = -1;
  const int end = before < j && j <= before + mine ? n : 0;  // only the item holding it
  for (int t = 0; t < end; ++t) {
    const int i = list[i0 + t];
    if (draw_key(l[i]) == key) {
      ++c;
      if (c == j) at = i;
    }
  }
  return draw_group_pick(at, votes);
}

// which[g]: the draw work-group g makes (its logit row rows[which[g]],
// its logit_bias as argmax_rows reads it); fpar[2g..]: its (1 / T, min_p),
// ipar[2g..]: (top_k, top_p * 2^24), bits[g]: its 64 random bits, where
// g is group0 plus the group's id; scratch: 3 * n_vocab floats per
// work-group of the launch.  A row with a NaN draws -1.
__kernel __attribute__((reqd_work_group_size(DRAW_G, 1, 1))) void sample_rows(
    __global const float* logits, int n_vocab, __global const int* rows, __global int* drawn,
    __global const int* bias_off, __global const int* bias_tok, __global const float* bias_val,
    __global const int* which, __global const float* fpar, __global const uint* ipar,
    __global const ulong* bits, __global float* scratch, int group0) {
  const int lid = get_local_id(0);
  const int g = group0 + get_group_id(0);  // the launch's draws start at group0
  const int k = which[g];
  __global float* s = scratch + (size_t)get_group_id(0) * 3 * n_vocab;
  __global float* w = s + n_vocab;
  __global int* list = (__global int*)(w + n_vocab);
  __global const float* l = logits + (size_t)rows[k] * n_vocab;
  __local ulong hist[256 * DRAW_G];
  __local ulong tot[256];
  __local ulong red[DRAW_G];
  __local float redf[DRAW_G];
  __local int votes[DRAW_G];
  const int chunk = (n_vocab + DRAW_G * 8 - 1) / (DRAW_G * 8) * 8;
  const int i0 = min(n_vocab, lid * chunk), i1 = min(n_vocab, i0 + chunk);

  // logit_bias, added as the host sampler adds it.
  const int b0 = bias_off[k], nb = bias_off[k + 1] - b0;
  if (nb > 0) {
    for (int i = i0; i < i1; ++i) s[i] = l[i];
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (lid == 0)
      for (int j = 0; j < nb; ++j) {
        const int t = bias_tok[b0 + j];
        if (t >= 0 && t < n_vocab) s[t] += bias_val[b0 + j];
      }
    barrier(CLK_GLOBAL_MEM_FENCE);
    l = s;
  }

  // The maximum; a NaN refuses the row.  Chunks start at multiples of 8
  // (vector loops), the last item's ends at the vocabulary's end.
  float mx = -INFINITY;
  ulong nan_seen = 0;
  {
    float8 m8 = (float8)(-INFINITY);
    int8 nan8 = (int8)(0);
    int i = i0;
    for (; i + 8 <= i1; i += 8) {
      const float8 v = vload8(0, l + i);
      nan8 |= isnan(v);
      m8 = fmax(m8, v);
    }
    for (; i < i1; ++i) {
      const float v = l[i];
      nan_seen |= isnan(v) ? 1ul : 0ul;
      mx = fmax(mx, v);
    }
    nan_seen |= any(nan8) ? 1ul : 0ul;
    mx = fmax(mx, fmax(fmax(fmax(m8.s0, m8.s1), fmax(m8.s2, m8.s3)),
                       fmax(fmax(m8.s4, m8.s5), fmax(m8.s6, m8.s7))));
  }
  redf[lid] = mx;
  nan_seen = draw_group_sum(nan_seen, red);  // its barrier orders redf too
  for (int j = 0; j < DRAW_G; ++j) mx = fmax(mx, redf[j]);
  if (nan_seen) {
    if (lid == 0) drawn[k] = -1;
    return;
  }
  if (!isfinite(mx)) {  // an infinite maximum: the first of them, as greedy
    if (lid == 0) {
      int first = n_vocab;
      for (int i = n_vocab - 1; i >= 0; --i)
        if (l[i] == mx) first = i;
      drawn[k] = first;
    }
    return;
  }

  const float inv_t = fpar[2 * g], min_p = fpar[2 * g + 1];
  const int top_k = (int)ipar[2 * g];
  const uint p24 = ipar[2 * g + 1];
  // Weights; their count, and the draw's sum where no cut by order
  // follows.  The same pass makes the first histogram of the first select
  // to come: top-k's (tokens of weight by count) or else top-p's (kept
  // tokens by weight).
  const int hist_mode = top_k > 0 ? 1 : p24 < (1u << 24) ? 2 : 0;
  if (hist_mode)
    for (int d = 0; d < 256; ++d) hist[d * DRAW_G + lid] = 0;
  ulong n_weighed = 0, plain = 0, n_live_w = 0;
  {
    ulong8 n8 = (ulong8)(0), s8 = (ulong8)(0), l8 = (ulong8)(0);
    int i = i0;
    for (; i + 8 <= i1; i += 8) {
      const float8 v = vload8(0, l + i);
      const float8 x = (v - mx) * inv_t;
      // Eight tokens more than 22 scaled logits under the maximum weigh
      // W = 0 (e^-22 < 2^-31): they count nowhere, so neither their exp
      // nor their (zero) histogram adds are worth making.  Most of a large
      // vocabulary's blocks are such.
      if (all(isless(x, (float8)(-22.0f)))) {
        vstore8((float8)(0.0f), 0, w + i);
        continue;
      }
      const float8 wi = draw_exp_neg8(x);
      vstore8(wi, 0, w + i);
      const uint8 W = convert_uint8_rtz(wi * 2147483648.0f);
      const long8 live = convert_long8(W > (uint8)(0u));
      const long8 kept = live & convert_long8(isgreaterequal(wi, (float8)(min_p)));
      n8 -= as_ulong8(live);
      s8 += convert_ulong8(W) & as_ulong8(kept);
      l8 += convert_ulong8(W);
      if (hist_mode) {
        const int8 bin = 255 - convert_int8(fmin((float8)(255.0f), (mx - v) * inv_t * 8.0f));
        const ulong8 add = as_ulong8(hist_mode == 1 ? live : kept) &
                           (hist_mode == 1 ? (ulong8)(1ul) : convert_ulong8(W));
        // Unrolled, unconditional (adding 0 for a token that does not count).
        hist[bin.s0 * DRAW_G + lid] += add.s0;
        hist[bin.s1 * DRAW_G + lid] += add.s1;
        hist[bin.s2 * DRAW_G + lid] += add.s2;
        hist[bin.s3 * DRAW_G + lid] += add.s3;
        hist[bin.s4 * DRAW_G + lid] += add.s4;
        hist[bin.s5 * DRAW_G + lid] += add.s5;
        hist[bin.s6 * DRAW_G + lid] += add.s6;
        hist[bin.s7 * DRAW_G + lid] += add.s7;
      }
    }
    for (; i < i1; ++i) {
      const float wi = draw_exp_neg((l[i] - mx) * inv_t);
      w[i] = wi;
      const uint W = draw_weight(wi);
      n_weighed += W > 0 ? 1ul : 0ul;
      plain += W > 0 && wi >= min_p ? (ulong)W : 0ul;
      n_live_w += W;
      if (hist_mode == 1 ? W > 0 : (W > 0 && wi >= min_p))
        hist[draw_gap_bin(l[i], mx, inv_t) * DRAW_G + lid] += hist_mode == 1 ? 1ul : (ulong)W;
    }
    n_weighed += n8.s0 + n8.s1 + n8.s2 + n8.s3 + n8.s4 + n8.s5 + n8.s6 + n8.s7;
    plain += s8.s0 + s8.s1 + s8.s2 + s8.s3 + s8.s4 + s8.s5 + s8.s6 + s8.s7;
    n_live_w += l8.s0 + l8.s1 + l8.s2 + l8.s3 + l8.s4 + l8.s5 + l8.s6 + l8.s7;
  }
  n_weighed = draw_group_sum(n_weighed, red);

  int use_k = 0, idx_k = 0;
  uint key_k = 0;
  if (top_k > 0 && (ulong)top_k < n_weighed) {
    ulong above = 0;
    ulong own = 0;
    int n_list = 0;
    key_k = draw_select_key(l, w, i0, i1, mx, inv_t, 0, 0u, 0, 0.0f, 0, (ulong)top_k, 1, &above, &own, hist,
                            tot, list, &n_list);
    idx_k = draw_nth_tie(l, list, i0, n_list, key_k, (ulong)top_k - above, red, votes);
    use_k = 1;
  }
  int use_p = 0, idx_p = 0;
  uint key_p = 0;
  ulong own_above_p = 0, mine_p = 0;
  if (p24 < (1u << 24)) {
    // Without a top-k cut, the weights pass summed them already.
    ulong mass_k = 0, mass_km = 0;
    for (int b = i0; b < (use_k ? i1 : i0); b += 8) {
      const int e = min(b + 8, i1);
      if (e - b == 8 && draw_weightless8(w, b)) continue;
      for (int i = b; i < e; ++i) {
        mass_k += draw_final_weight(l, w, i, use_k, key_k, idx_k, 0.0f, 0, 0u, 0);
        mass_km += draw_final_weight(l, w, i, use_k, key_k, idx_k, min_p, 0, 0u, 0);
      }
    }
    if (!use_k) {
      mass_k = n_live_w;
      mass_km = plain;
    }
    mass_k = draw_group_sum(mass_k, red);
    mass_km = draw_group_sum(mass_km, red);
    ulong thr = draw_top_p_mass(mass_k, p24);
    if (thr == 0) thr = 1;
    if (thr <= mass_km) {
      ulong above = 0;
      int n_list = 0;
      key_p = draw_select_key(l, w, i0, i1, mx, inv_t, use_k, key_k, idx_k, min_p, 1, thr, hist_mode == 2,
                              &above, &own_above_p, hist, tot, list, &n_list);
      const ulong tie_w = draw_weight(draw_exp_neg((draw_key_value(key_p) - mx) * inv_t));
      const ulong j = (thr - above + tie_w - 1) / tie_w;
      idx_p = draw_nth_tie(l, list, i0, n_list, key_p, j, red, votes);
      use_p = 1;
      // This item's part of the draw: its kept tokens above the listed bin,
      // and the listed ones up to the cut.
      mine_p = own_above_p;
      for (int t = 0; t < n_list; ++t) {
        const int i = list[i0 + t];
        const uint key = draw_key(l[i]);
        if (key > key_p || (key == key_p && i <= idx_p)) mine_p += draw_weight(w[i]);
      }
    }
  }

  // The draw, in index order over the kept tokens: the sums of each
  // item's, then a walk by the item where the draw point falls.
  ulong mine = use_p ? mine_p : plain;
  if (use_k && !use_p) {
    mine = 0;
    for (int b = i0; b < i1; b += 8) {
      const int e = min(b + 8, i1);
      if (e - b == 8 && draw_weightless8(w, b)) continue;
      for (int i = b; i < e; ++i)
        mine += draw_final_weight(l, w, i, use_k, key_k, idx_k, min_p, use_p, key_p, idx_p);
    }
  }
  const ulong total = draw_group_sum(mine, red);
  const ulong before = draw_group_before(mine, red);
  const ulong r = mul_hi(bits[g], total);
  ulong acc = before;
  int at = -1;
  const int end = before <= r && r < before + mine ? i1 : i0;  // only that item walks
  for (int b = i0; b < end; b += 8) {
    const int e = min(b + 8, end);
    if (e - b == 8 && draw_weightless8(w, b)) continue;
    for (int i = b; i < e; ++i) {
      const uint W = draw_final_weight(l, w, i, use_k, key_k, idx_k, min_p, use_p, key_p, idx_p);
      if (at < 0 && acc <= r && r < acc + W) at = i;  // W = 0: never (r < acc + 0 fails)
      acc += W;
    }
  }
  at = draw_group_pick(at, votes);
  if (lid == 0) drawn[k] = at;
}
