// Mixture-of-experts routing and combination, as llama.cpp's build_moe_ffn
// computes them for Mixtral-style models (softmax gating, top-k, weights
// renormalised):
//   moe_route    router logits -> each token's n_used experts and weights,
//                and the step's (token, k) assignments grouped by slot
//   moe_combine  the weighted sum of a token's expert outputs, added to the
//                residual stream
// The experts' products in between are matmul.cl's grouped kernels
// (matmul_id_*), one pass over each slot's weights for all of its tokens.
//
// Assignment a = t * n_used + k is token t's k-th expert (k in descending
// probability).  Slots hold experts (device_weights.hpp's device_moe); an
// expert held in several slots (replicated) sends its tokens to them in
// turn, token t to replica t mod n_replicas, so the split is deterministic.

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double sum_t;  // ggml sums the softmax's exponentials in double
#else
typedef float sum_t;
#endif

#define MOE_MAX_EXPERTS 256

// One work-item for the whole step (a few thousand operations: cheaper than
// a second launch).  Outputs:
//   weights[a]        the weight of assignment a
//   slot_off[S + 1]   slot s's assignments are slot_rows[slot_off[s] ..
//   slot_rows[T * K]  slot_off[s + 1]), in token order
//   counts[E]         tokens routed to each expert, added to (the expert
//                     controller's load statistics), from counts + count_base
// `sel` is scratch: the slot of each assignment.
// `norm`: the K weights renormalised to sum to one (Mixtral), or left as
// the softmax gave them (Qwen2-MoE).
__kernel void moe_route(__global const float* logits, int T, int E, int K,
                        __global const int* rep_off, __global const int* rep_slot, int S,
                        __global int* sel, __global float* weights, __global int* slot_off,
                        __global int* slot_rows, __global int* counts, int count_base, int norm) {
  if (get_global_id(0) != 0) return;
  counts += count_base;
  for (int s = 0; s <= S; ++s) slot_off[s] = 0;
  float p[MOE_MAX_EXPERTS];
  for (int t = 0; t < T; ++t) {
    __global const float* l = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = fmax(mx, l[e]);
    sum_t sum = 0;
    for (int e = 0; e < E; ++e) {
      p[e] = exp(l[e] - mx);
      sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; ++e) p[e] *= inv;
    // The K largest, ties to the lower id (ggml's argsort); taken ones are
    // marked by a negative value (probabilities are never negative).
    int chosen[MOE_MAX_EXPERTS];
    float wsum = 0.0f;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;
      chosen[k] = best;
      weights[(size_t)t * K + k] = p[best];
      wsum += p[best];
      p[best] = -1.0f;
    }
    for (int k = 0; k < K; ++k) {
      const size_t a = (size_t)t * K + k;
      if (norm) weights[a] = weights[a] / wsum;
      const int e = chosen[k];
      const int n_rep = rep_off[e + 1] - rep_off[e];
      const int s = rep_slot[rep_off[e] + t % n_rep];
      sel[a] = s;
      slot_off[s + 1] += 1;
      counts[e] += 1;
    }
  }
  // Start offsets, then a stable scatter that leaves slot_off[s] at the end
  // of slot s, then one place to the right.
  int start = 0;
  for (int s = 0; s < S; ++s) {
    const int c = slot_off[s + 1];
    slot_off[s] = start;
    start += c;
  }
  for (int a = 0; a < T * K; ++a) slot_rows[slot_off[sel[a]]++] = a;
  for (int s = S; s > 0; --s) slot_off[s] = slot_off[s - 1];
  slot_off[0] = 0;
}

// x[t][i] += sum over k of weights[t K + k] * y[t K + k][i], summed in k's
// order (llama.cpp adds the weighted expert outputs view by view, then the
// residual).  Where `shared` (Qwen2-MoE), the shared expert's output
// sy[t][i] scaled by sigmoid(sg[t]) is added to that sum before the
// residual, the sigmoid taken as llama.cpp does, silu(g) / g.  One
// work-item per (i, t).
__kernel void moe_combine(__global float* x, __global const float* y,
                          __global const float* weights, int D, int K, __global const float* sy,
                          __global const float* sg, int shared) {
  const int i = get_global_id(0), t = get_global_id(1);
  const size_t a = (size_t)t * K;
  float acc = y[a * D + i] * weights[a];
  for (int k = 1; k < K; ++k) acc += y[(a + k) * D + i] * weights[a + k];
  if (shared) {
    const float g = sg[t];
    acc += sy[(size_t)t * D + i] * ((g / (1.0f + exp(-g))) / g);
  }
  x[(size_t)t * D + i] += acc;
}
