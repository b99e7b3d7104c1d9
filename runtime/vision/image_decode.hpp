#pragma once
// Image bytes (PNG or JPEG, as a client sends them) to 8-bit RGB pixels,
// with stb_image, the decoder llama.cpp's multimodal path uses: the same
// file gives the same pixels there and here.  Input is hostile until
// decoded: its size, format and dimensions are checked before any pixel
// memory is allocated.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// An image troupe refuses, and why (the client's error, never a crash).
struct image_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct rgb_image {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3, rows top to bottom
};

// Limits on what a request may send: encoded bytes, and pixels per side.
constexpr size_t k_max_image_bytes = 20u << 20;
constexpr int k_max_image_side = 8192;
// Pixels, from the header before decoding: a few KB of PNG can claim 8192
// x 8192 zeros, seconds of the encoder's time.
constexpr int64_t k_max_image_pixels = 4096 * 4096;

// Decodes PNG or JPEG bytes (alpha and grey become RGB).  Throws
// image_error for anything else, a damaged file, or one past the limits.
rgb_image decode_image(std::string_view bytes);

}  // namespace troupe
