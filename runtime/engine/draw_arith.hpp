#pragma once
// The arithmetic of a sampled draw, written so that the host sampler
// (runtime/engine/sampler.cpp) and the device's (kernels/draw.cl,
// sample_rows) compute the very same bits: a seeded request draws the same
// token wherever it is drawn.  Every float operation here is one IEEE
// operation rounded to nearest (a product, a difference, an explicit fma,
// rint, ldexp), which OpenCL and C++ both round exactly; no library exp
// (libm's and OpenCL's differ in the last place), no contraction, no sum
// whose order could differ.  Weights are then integers, and integer sums
// are the same in any order.  kernels/draw.cl mirrors each function under
// a draw_ prefix (its exp multiplies by 2^k built from bits where this
// one calls ldexp: both exact, so the same); change both or neither.
#include <cmath>
#include <cstdint>

namespace troupe::draw {

// exp(x) for x <= 0, to about 2 ulp: Cody-Waite reduction by ln 2 and a
// degree-6 polynomial.  Below -80 (far under any weight that counts) it is 0.
inline float exp_neg(float x) {
  if (!(x >= -80.0f)) return 0.0f;  // also NaN
  const float k = std::rint(x * 1.44269504f);
  float r = std::fma(-k, 0.693145752f, x);  // ln 2, high part (exact product)
  r = std::fma(-k, 1.42860677e-06f, r);     // ln 2, low part
  float p = 1.38888889e-03f;                // 1/720
  p = std::fma(p, r, 8.33333333e-03f);      // 1/120
  p = std::fma(p, r, 4.16666667e-02f);      // 1/24
  p = std::fma(p, r, 1.66666667e-01f);      // 1/6
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, static_cast<int>(k));
}

// A token's weight: exp((logit - max) / T) in units of 2^-31, truncated.
// The most likely token weighs exactly 2^31; one under 2^-31 of it, 0:
// it is never drawn.
inline uint32_t weight(float w) {
  return static_cast<uint32_t>(w * 2147483648.0f);
}

// The order of candidates: larger logit first, smaller index among equal
// logits.  The key is the float's bits made monotone (and -0 below +0).
inline uint32_t order_key(float v) {
  uint32_t b;
  static_assert(sizeof b == sizeof v);
  __builtin_memcpy(&b, &v, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// A penalized logit (llama.cpp's order: the repetition penalty, then
// count x frequency + presence subtracted), for a token seen `count` > 0
// times in the window.  A positive logit is multiplied by inv_rep, the
// float nearest 1 / repetition_penalty, rather than divided: OpenCL lets
// a division round differently from the host's.  The product and the
// difference are one fma (rounded once), so no compiler can fuse them on
// one side only (-cl-mad-enable, or GCC's contraction on the host).
inline float penalize(float v, int32_t count, float rep, float inv_rep, float freq, float pres) {
  const float m = rep == 1.0f ? 1.0f : (v > 0 ? inv_rep : rep);
  return std::fma(v, m, -std::fma(static_cast<float>(count), freq, pres));
}

// top_p as a fraction of 2^24.
inline uint32_t top_p_fixed(float top_p) {
  return top_p >= 1.0f ? (1u << 24) : static_cast<uint32_t>(top_p * 16777216.0f);
}

// The mass a top-p prefix must reach: total * p24 / 2^24, rounded down,
// without overflowing 64 bits (total < 2^50).
inline uint64_t top_p_mass(uint64_t total, uint32_t p24) {
  return (total >> 24) * p24 + (((total & 0xFFFFFFu) * p24) >> 24);
}

// The 64 random bits of a draw: splitmix64 of the seed and the position
// (the sequence's length when it samples).
inline uint64_t seeded_bits(uint64_t seed, uint64_t position) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(mix(seed) ^ position);
}

// Where the draw lands in [0, total): the high half of bits * total.
inline uint64_t draw_point(uint64_t bits, uint64_t total) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * total) >> 64);
}

}  // namespace troupe::draw
