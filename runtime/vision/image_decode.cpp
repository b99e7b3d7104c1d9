#include "runtime/vision/image_decode.hpp"

#include <stb_image.h>

#include <cstring>
#include <memory>

namespace troupe {

namespace {

// Only PNG and JPEG reach stb: its other formats (GIF, PSD, HDR, PIC, PNM,
// TGA) are a surface no client needs.
bool is_png(std::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0;
}
bool is_jpeg(std::string_view b) {
  return b.size() >= 3 && std::memcmp(b.data(), "\xff\xd8\xff", 3) == 0;
}

// stb's reason, where it gave one (for a header it tried every format's).
std::string failure() {
  const char* why = stbi_failure_reason();
  return why && *why ? why : "no reason given";
}

}  // namespace

rgb_image decode_image(std::string_view bytes) {
  if (bytes.empty()) throw image_error("the image is empty");
  if (bytes.size() > k_max_image_bytes)
    throw image_error("the image is " + std::to_string(bytes.size()) + " bytes; at most " +
                      std::to_string(k_max_image_bytes) + " are taken");
  if (!is_png(bytes) && !is_jpeg(bytes)) throw image_error("the image is neither PNG nor JPEG");
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int len = static_cast<int>(bytes.size());
  int w = 0, h = 0, channels = 0;
  if (!stbi_info_from_memory(data, len, &w, &h, &channels))
    throw image_error(std::string("the image is damaged or truncated (") + failure() + ")");
  if (w <= 0 || h <= 0 || w > k_max_image_side || h > k_max_image_side ||
      int64_t{w} * h > k_max_image_pixels)
    throw image_error("the image is " + std::to_string(w) + "x" + std::to_string(h) +
                      " pixels; each side must be 1 to " + std::to_string(k_max_image_side) +
                      " and the whole at most " + std::to_string(k_max_image_pixels));
  std::unique_ptr<stbi_uc, void (*)(void*)> px(
      stbi_load_from_memory(data, len, &w, &h, &channels, 3), stbi_image_free);
  if (!px) throw image_error(std::string("the image is damaged or truncated (") + failure() + ")");
  rgb_image out;
  out.width = w;
  out.height = h;
  out.pixels.assign(px.get(), px.get() + static_cast<size_t>(w) * h * 3);
  return out;
}

}  // namespace troupe
