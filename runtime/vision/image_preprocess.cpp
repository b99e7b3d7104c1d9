#include "runtime/vision/image_preprocess.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace troupe {

namespace {

// Weights in fixed point: 32 bits less 8 of pixel and 2 of headroom.
constexpr int k_bits = 22;

// The bicubic kernel Pillow uses (a = -0.5; PyTorch's is -0.75).
double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// For each output pixel of one axis: the first input pixel, how many
// contribute, and their weights in fixed point (k per output pixel).
struct axis_taps {
  int k = 0;
  std::vector<int> first, count;
  std::vector<int32_t> w;
};

axis_taps taps(int in, int out) {
  const double scale = static_cast<double>(in) / out;
  // Downsampling widens the kernel (against aliasing); upsampling keeps it.
  const double fscale = std::max(scale, 1.0);
  const double support = 2.0 * fscale;
  axis_taps t;
  t.k = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  t.w.assign(static_cast<size_t>(out) * t.k, 0);
  std::vector<double> row(t.k);
  for (int o = 0; o < out; ++o) {
    const double centre = (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(centre - support + 0.5));
    const int hi = std::min(in, static_cast<int>(centre + support + 0.5));
    double sum = 0.0;
    for (int i = 0; i < hi - lo; ++i) sum += row[i] = bicubic((i + lo - centre + 0.5) / fscale);
    for (int i = 0; i < hi - lo; ++i) {
      const double v = sum != 0.0 ? row[i] / sum : row[i];
      // Half away from zero, then truncated: Pillow's rounding.
      t.w[static_cast<size_t>(o) * t.k + i] =
          static_cast<int32_t>(v * std::ldexp(1.0, k_bits) + (v < 0 ? -0.5 : 0.5));
    }
    t.first[o] = lo;
    t.count[o] = hi - lo;
  }
  return t;
}

uint8_t clamp8(int32_t v) {
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

// One pass along x (horizontal) or y: every output pixel a weighted sum of
// its taps, with half a unit of rounding, shifted back and clamped.
rgb_image pass(const rgb_image& src, int out, bool horizontal) {
  const axis_taps t = taps(horizontal ? src.width : src.height, out);
  rgb_image dst;
  dst.width = horizontal ? out : src.width;
  dst.height = horizontal ? src.height : out;
  dst.pixels.resize(static_cast<size_t>(dst.width) * dst.height * 3);
  for (int y = 0; y < dst.height; ++y)
    for (int x = 0; x < dst.width; ++x) {
      const int o = horizontal ? x : y;
      const int32_t* w = t.w.data() + static_cast<size_t>(o) * t.k;
      int32_t acc[3] = {1 << (k_bits - 1), 1 << (k_bits - 1), 1 << (k_bits - 1)};
      for (int i = 0; i < t.count[o]; ++i) {
        const int sx = horizontal ? t.first[o] + i : x, sy = horizontal ? y : t.first[o] + i;
        const uint8_t* p = src.pixels.data() + (static_cast<size_t>(sy) * src.width + sx) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += p[c] * w[i];
      }
      uint8_t* d = dst.pixels.data() + (static_cast<size_t>(y) * dst.width + x) * 3;
      for (int c = 0; c < 3; ++c) d[c] = clamp8(acc[c] >> k_bits);
    }
  return dst;
}

}  // namespace

rgb_image resize_bicubic(const rgb_image& src, int width, int height) {
  rgb_image out = src;
  if (width != src.width) out = pass(out, width, true);
  if (height != src.height) out = pass(out, height, false);
  return out;
}

rgb_image fit_square(const rgb_image& img, int side, const uint8_t pad[3]) {
  if (img.width == side && img.height == side) return img;
  const float scale =
      std::min(static_cast<float>(side) / img.width, static_cast<float>(side) / img.height);
  const int w = std::min(static_cast<int>(std::ceil(img.width * scale)), side);
  const int h = std::min(static_cast<int>(std::ceil(img.height * scale)), side);
  const rgb_image fitted = resize_bicubic(img, w, h);
  rgb_image out;
  out.width = out.height = side;
  out.pixels.resize(static_cast<size_t>(side) * side * 3);
  for (size_t i = 0; i < out.pixels.size(); ++i) out.pixels[i] = pad[i % 3];
  const int ox = (side - w) / 2, oy = (side - h) / 2;
  for (int y = 0; y < h; ++y)
    std::copy_n(fitted.pixels.data() + static_cast<size_t>(y) * w * 3, static_cast<size_t>(w) * 3,
                out.pixels.data() + (static_cast<size_t>(y + oy) * side + ox) * 3);
  return out;
}

std::vector<float> encoder_input(const rgb_image& img, const clip_hparams& hp) {
  static constexpr uint8_t llava_pad[3] = {122, 116, 104};
  const rgb_image sq = fit_square(img, hp.image_size, llava_pad);
  const size_t n = static_cast<size_t>(hp.image_size) * hp.image_size;
  std::vector<float> out(3 * n);
  for (size_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      out[c * n + i] = (static_cast<float>(sq.pixels[i * 3 + c]) / 255.0f - hp.mean[c]) / hp.std[c];
  return out;
}

}  // namespace troupe
