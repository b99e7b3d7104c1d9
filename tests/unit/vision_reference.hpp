#pragma once
// The vision encoder in plain C++ loops, as llama.cpp's LLaVA graph
// computes it (tools/make_vision_fixture.py's numpy encode() says the same
// in numpy): the reference kernels/vision.cl is tested against.
#include <cmath>
#include <vector>

#include "runtime/device/gelu_table.hpp"
#include "runtime/model/tensor_type.hpp"
#include "runtime/vision/clip_model.hpp"

namespace troupe::vision_reference {

inline float half_round(float v) {
  return half_to_float(float_to_half(v));
}

// y = x w^T + b, x rows x w.cols.
inline std::vector<float> linear(const std::vector<float>& x, int rows, const clip_tensor& w,
                                 const clip_tensor& b) {
  std::vector<float> y(static_cast<size_t>(rows) * w.rows);
  for (int r = 0; r < rows; ++r)
    for (int64_t o = 0; o < w.rows; ++o) {
      double s = b.empty() ? 0.0 : b.data[o];
      for (int64_t i = 0; i < w.cols; ++i) s += double(x[r * w.cols + i]) * w.data[o * w.cols + i];
      y[r * w.rows + o] = static_cast<float>(s);
    }
  return y;
}

inline std::vector<float> layer_norm(const std::vector<float>& x, int rows, const clip_tensor& w,
                                     const clip_tensor& b, float eps) {
  const size_t D = w.data.size();
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (size_t i = 0; i < D; ++i) mean += x[r * D + i];
    mean /= double(D);
    for (size_t i = 0; i < D; ++i) var += (x[r * D + i] - mean) * (x[r * D + i] - mean);
    const double scale = 1.0 / std::sqrt(var / double(D) + eps);
    for (size_t i = 0; i < D; ++i)
      y[r * D + i] = static_cast<float>((x[r * D + i] - mean) * scale * w.data[i] + b.data[i]);
  }
  return y;
}

// ggml's tabulated activations: the value rounded to half, looked up.
inline void activate(std::vector<float>& x, vision_activation act) {
  static const auto gelu = gelu_half_table(), quick = gelu_quick_half_table();
  for (float& v : x) {
    if (act == vision_activation::gelu)
      v = v <= -10.0f ? 0.0f : v >= 10.0f ? v : half_to_float(gelu[float_to_half(v)]);
    else if (act == vision_activation::gelu_quick)
      v = half_to_float(quick[float_to_half(v)]);
    else
      v = v / (1.0f + std::exp(-v));
  }
}

inline std::vector<float> encode(const clip_model& m, const std::vector<float>& input) {
  const auto& hp = m.hp;
  const int S = hp.image_size, P = hp.patch_size, G = hp.patches_per_side(), D = hp.n_embd;
  const int n_patch = hp.n_patches(), n_pos = hp.n_positions(), H = hp.n_head, hd = hp.head_dim();
  // Patches as rows in (channel, y, x) order, pixels and kernel rounded to
  // half (ggml's im2col).
  std::vector<float> cols(static_cast<size_t>(n_patch) * 3 * P * P);
  for (int p = 0; p < n_patch; ++p)
    for (int c = 0; c < 3; ++c)
      for (int ky = 0; ky < P; ++ky)
        for (int kx = 0; kx < P; ++kx)
          cols[(static_cast<size_t>(p) * 3 + c) * P * P + ky * P + kx] = half_round(
              input[(static_cast<size_t>(c) * S + (p / G) * P + ky) * S + (p % G) * P + kx]);
  clip_tensor kernel = m.patch_w;
  for (float& v : kernel.data) v = half_round(v);
  std::vector<float> x = linear(cols, n_patch, kernel, m.patch_b);
  // The class token after the patches (llama.cpp's order), then positions.
  x.insert(x.end(), m.class_embd.data.begin(), m.class_embd.data.end());
  for (size_t i = 0; i < x.size(); ++i) x[i] += m.pos_embd.data[i];
  if (!m.pre_ln_w.empty()) x = layer_norm(x, n_pos, m.pre_ln_w, m.pre_ln_b, hp.eps);
  for (const auto& L : m.layers) {
    auto h = layer_norm(x, n_pos, L.ln1_w, L.ln1_b, hp.eps);
    const auto q = linear(h, n_pos, L.q_w, L.q_b), k = linear(h, n_pos, L.k_w, L.k_b),
               v = linear(h, n_pos, L.v_w, L.v_b);
    std::vector<float> a(x.size());
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < n_pos; ++i) {
        std::vector<double> s(n_pos);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < n_pos; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += double(q[i * D + hh * hd + e]) * k[j * D + hh * hd + e];
          s[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += e = std::exp(e - mx);
        for (int e = 0; e < hd; ++e) {
          double o = 0;
          for (int j = 0; j < n_pos; ++j) o += s[j] / sum * v[j * D + hh * hd + e];
          a[i * D + hh * hd + e] = static_cast<float>(o);
        }
      }
    const auto o = linear(a, n_pos, L.o_w, L.o_b);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = layer_norm(x, n_pos, L.ln2_w, L.ln2_b, hp.eps);
    auto u = linear(h, n_pos, L.up_w, L.up_b);
    activate(u, hp.act);
    const auto d = linear(u, n_pos, L.down_w, L.down_b);
    for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
  }
  if (!m.post_ln_w.empty()) x = layer_norm(x, n_pos, m.post_ln_w, m.post_ln_b, hp.eps);
  // Rows 1..n_patches with a class token (llama.cpp drops the first patch).
  const int first = m.class_embd.empty() ? 0 : 1;
  std::vector<float> feats(x.begin() + static_cast<size_t>(first) * D,
                           x.begin() + static_cast<size_t>(first + n_patch) * D);
  auto mid = linear(feats, n_patch, m.mm0_w, m.mm0_b);
  activate(mid, vision_activation::gelu);
  return linear(mid, n_patch, m.mm2_w, m.mm2_b);
}

}  // namespace troupe::vision_reference
