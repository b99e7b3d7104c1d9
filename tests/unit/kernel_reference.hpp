#pragma once
// Plain C++ references for the OpenCL kernels (tests/unit/test_kernels.cpp):
// random weights in GGUF block format, double-precision dot products with
// the matmul kernels' error bound, silu, the paged KV cache geometry, and
// double-precision rope and attention, the latter both exact and with the
// half-precision roundings llama.cpp applies (and the F16 kernel copies).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/model/tensor_type.hpp"

namespace troupe::kernel_ref {

// x rounded to the nearest half (ties to even), as float.
inline float round_half(float x) {
  return half_to_float(float_to_half(x));
}

// Distance between consecutive halves around |x| (2^-24 among subnormals).
inline double half_step(double x) {
  const double ax = std::fabs(x);
  if (ax < 0x1.0p-14) return 0x1.0p-24;
  return std::ldexp(1.0, std::ilogb(ax) - 10);
}

// N rows of K values of type t, as a GGUF file stores them, with random
// contents: F32/F16 values in [-1, 1]; for quantized types random quants,
// scales of either sign and (Q4_1) mins.
inline std::vector<uint8_t> random_matrix(tensor_type t, int K, int N, std::mt19937& rng) {
  std::vector<uint8_t> out(row_bytes(t, K) * static_cast<size_t>(N));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f), scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put_half = [&](size_t at, float f) {
    const uint16_t h = float_to_half(f);
    std::memcpy(&out[at], &h, 2);
  };
  const size_t n = static_cast<size_t>(K) * N;
  if (t == tensor_type::f32) {
    for (size_t i = 0; i < n; ++i) {
      const float v = val(rng);
      std::memcpy(&out[4 * i], &v, 4);
    }
  } else if (t == tensor_type::f16) {
    for (size_t i = 0; i < n; ++i) put_half(2 * i, val(rng));
  } else if (t == tensor_type::bf16) {
    for (size_t i = 0; i < n; ++i) {
      const auto h = static_cast<uint16_t>(std::bit_cast<uint32_t>(val(rng)) >> 16);
      std::memcpy(&out[2 * i], &h, 2);
    }
  } else if (traits_of(t).block_elems == 256) {
    // K-quants: random bytes, then sane halves where the scales sit: Q4_K's
    // and Q5_K's d and dmin lead the super-block, Q6_K's and Q3_K's d ends
    // it, Q2_K's d and dmin end it.
    for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
    const size_t block = traits_of(t).block_bytes;
    auto d = [&](float div) { return (byte(rng) & 1 ? -1.0f : 1.0f) * scale(rng) / div; };
    for (size_t at = 0; at < out.size(); at += block) {
      if (t == tensor_type::q4_k || t == tensor_type::q5_k) {
        put_half(at, d(t == tensor_type::q4_k ? 16 : 32));
        put_half(at + 2, scale(rng) / 16);
      } else if (t == tensor_type::q2_k) {
        put_half(at + block - 4, d(8));
        put_half(at + block - 2, scale(rng) / 8);
      } else {
        put_half(at + block - 2, d(t == tensor_type::q6_k ? 64 : 16));
      }
    }
  } else {
    const size_t block = traits_of(t).block_bytes;
    const bool has_min = t == tensor_type::q4_1 || t == tensor_type::q5_1;
    const size_t header = has_min ? 4 : 2;
    for (size_t b = 0; b < n / 32; ++b) {
      const size_t at = b * block;
      put_half(at, (byte(rng) & 1 ? -1.0f : 1.0f) * scale(rng) / (t == tensor_type::q5_1 ? 2 : 1));
      if (has_min) put_half(at + 2, 0.5f * val(rng));
      for (size_t i = at + header; i < at + block; ++i) out[i] = static_cast<uint8_t>(byte(rng));
    }
  }
  return out;
}

// The N x K matrix of `bytes` as floats, row by row, via dequantize_row.
inline std::vector<float> dequantize(tensor_type t, const std::vector<uint8_t>& bytes, int K,
                                     int N) {
  std::vector<float> out(static_cast<size_t>(K) * N);
  const size_t rb = row_bytes(t, K);
  for (int r = 0; r < N; ++r)
    dequantize_row(t, bytes.data() + r * rb, out.data() + static_cast<size_t>(r) * K, K);
  return out;
}

// w . x over K values in double, with sum |w_j x_j| (what bounds the
// rounding error of a float evaluation).
struct dot_result {
  double dot, mag;
};

inline dot_result dot(const float* w, const float* x, int K) {
  dot_result r{0.0, 0.0};
  for (int j = 0; j < K; ++j) {
    const double p = static_cast<double>(w[j]) * x[j];
    r.dot += p;
    r.mag += std::fabs(p);
  }
  return r;
}

// Error bound of the matmul kernels' float dot product (float16 partial
// sums, fma) for a dot product of magnitude mag.
inline double dot_tol(double mag) {
  return 2e-5 * mag + 1e-6;
}

inline double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

// Error bound of silu(g) * u evaluated in float from a g and a u that are
// off by up to eg and eu: |silu'| < 1.1 everywhere, plus a few float
// roundings of the result.
inline double glu_tol(double g, double eg, double u, double eu) {
  const double su = std::fabs(silu(g));
  return 1.1 * eg * (std::fabs(u) + eu) + (su + 1.1 * eg) * eu + 1e-6 * su * std::fabs(u) + 1e-7;
}

// As kernels/attention.cl says: V is vcache[layer][page][kv_head][slot][head_dim],
// K is transposed within a page, kcache[layer][page][kv_head][head_dim][slot].
struct kv_geometry {
  int n_layer, n_pages, n_kv, page_size, hd;

  size_t elems() const { return static_cast<size_t>(n_layer) * n_pages * n_kv * page_size * hd; }
  size_t block(int layer, int page, int g) const {
    return ((static_cast<size_t>(layer) * n_pages + page) * n_kv + g) * page_size * hd;
  }
  // Value d of slot `slot`: in the V cache, and in the K cache.
  size_t v_offset(int layer, int page, int g, int slot, int d) const {
    return block(layer, page, g) + static_cast<size_t>(slot) * hd + d;
  }
  size_t k_offset(int layer, int page, int g, int slot, int d) const {
    return block(layer, page, g) + static_cast<size_t>(d) * page_size + slot;
  }
};

// A batch of rows over several sequences with shuffled page tables.
// Sequence s has rows at positions first_pos[s] .. first_pos[s] + n_rows[s] - 1.
struct paged_batch {
  std::vector<int32_t> pos, row_seq, pt, pt_off;
  std::vector<std::vector<int>> pages;  // per sequence, in position order

  int rows() const { return static_cast<int>(pos.size()); }
  int page_of(int row, int page_size) const { return pages[row_seq[row]][pos[row] / page_size]; }
};

// Pages come from a random permutation of 0..n_pages-1 (so they are neither
// contiguous nor ordered); tables are stored in reverse sequence order after
// a junk entry, so pt_off is neither zero-based nor increasing.
inline paged_batch make_batch(const std::vector<int>& first_pos, const std::vector<int>& n_rows,
                              int page_size, int n_pages, std::mt19937& rng) {
  paged_batch b;
  std::vector<int> free(n_pages);
  for (int i = 0; i < n_pages; ++i) free[i] = i;
  std::shuffle(free.begin(), free.end(), rng);
  size_t next = 0;
  const size_t n_seq = first_pos.size();
  b.pages.resize(n_seq);
  for (size_t s = 0; s < n_seq; ++s) {
    const int need = (first_pos[s] + n_rows[s] - 1) / page_size + 1 + static_cast<int>(s % 2);
    for (int i = 0; i < need; ++i) b.pages[s].push_back(free.at(next++));
    for (int r = 0; r < n_rows[s]; ++r) {
      b.pos.push_back(first_pos[s] + r);
      b.row_seq.push_back(static_cast<int32_t>(s));
    }
  }
  b.pt_off.resize(n_seq);
  b.pt.push_back(-1);
  for (size_t s = n_seq; s-- > 0;) {
    b.pt_off[s] = static_cast<int32_t>(b.pt.size());
    b.pt.insert(b.pt.end(), b.pages[s].begin(), b.pages[s].end());
  }
  return b;
}

// The dimensions rotation pair i < rope_dims/2 of a head turns: (2i, 2i+1),
// or with neox (i, i + rope_dims/2).  Dimensions from rope_dims on are not
// rotated.
struct rope_dims_pair {
  int i0, i1;
};

inline rope_dims_pair rope_pair(int i, int rope_dims, bool neox) {
  return neox ? rope_dims_pair{i, i + rope_dims / 2} : rope_dims_pair{2 * i, 2 * i + 1};
}

// Error bound of the angle p * base^(-2i/rope_dims) as troupe::rope_table
// computes it in float the way ggml does (powf for the step, then up to 32
// float multiplications, each off by half an ulp; then cosf and sinf), in
// radians: |rotated error| <= rope_angle_tol(p) * (|v[i0]| + |v[i1]|).
inline double rope_angle_tol(int p) {
  return 4e-6 * p + 4e-6;
}

// Rotates the pairs of v[0..rope_dims) at position p, pair i by
// p * base^(-2i/rope_dims), as matmul_qkv_* does to q and k heads.
inline void rope(double* v, int rope_dims, double theta_base, bool neox, int p) {
  const int half = rope_dims / 2;
  for (int i = 0; i < half; ++i) {
    const double theta = p * std::pow(theta_base, -2.0 * i / rope_dims);
    const double c = std::cos(theta), s = std::sin(theta);
    const auto [i0, i1] = rope_pair(i, rope_dims, neox);
    const double x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * c - x1 * s;
    v[i1] = x0 * s + x1 * c;
  }
}

// Attention of one query head over keys/values k(j), v(j) (float[hd], as
// stored in the cache), positions 0..last.
//   exact:     softmax(scale * q.k) . v in double.
//   llama_f16: llama.cpp's numerics with a half KV cache: q rounded to
//              half, scores q.k * scale, probabilities normalized then
//              rounded to half, no renormalization.  Where a probability
//              sits so close to a half rounding boundary that float
//              arithmetic may round it the other way, the difference that
//              makes times |v| is added to slack[i].
// out[i] and slack[i] (zeroed here) hold hd values.
template <class KeyFn, class ValFn>
void attention(const float* q, int hd, int last, double scale, KeyFn k, ValFn v, bool llama_f16,
               double* out, double* slack, int first = 0) {
  std::vector<double> qd(hd), s(last + 1);
  for (int i = 0; i < hd; ++i) qd[i] = llama_f16 ? round_half(q[i]) : q[i];
  double m = -INFINITY;
  for (int j = first; j <= last; ++j) {
    const float* kj = k(j);
    double d = 0.0;
    for (int i = 0; i < hd; ++i) d += qd[i] * kj[i];
    s[j] = d * scale;
    m = std::max(m, s[j]);
  }
  double l = 0.0;
  for (int j = first; j <= last; ++j) l += std::exp(s[j] - m);
  for (int i = 0; i < hd; ++i) out[i] = slack[i] = 0.0;
  for (int j = first; j <= last; ++j) {
    const double p = std::exp(s[j] - m) / l;
    double pr = p, flip = 0.0;
    if (llama_f16) {
      constexpr double rel = 3e-5;  // float error bound of the kernel's p
      pr = round_half(static_cast<float>(p));
      flip = round_half(static_cast<float>(p * (1 + rel))) -
             round_half(static_cast<float>(p * (1 - rel)));
    }
    const float* vj = v(j);
    for (int i = 0; i < hd; ++i) {
      out[i] += pr * vj[i];
      slack[i] += std::fabs(flip * vj[i]);
    }
  }
}

}  // namespace troupe::kernel_ref
