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

// Debian's stb_image (2.27) trusts a JPEG Huffman table's symbol counts:
// a table of more than 256 symbols writes past its arrays (upstream fixed
// it in 2.28; the image fuzz target found it).  Every DHT segment is
// checked here first, those between scans too (progressive JPEGs define
// tables there).  False for a table that is too large, overruns its
// segment or is cut off; other truncation is left to stb to report.
bool jpeg_tables_fit(std::string_view b) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(b[i]); };
  size_t at = 2;  // after SOI
  while (at + 4 <= b.size()) {
    if (byte(at) != 0xFF) {  // entropy-coded data: on to the next marker
      ++at;
      continue;
    }
    const uint8_t m = byte(at + 1);
    if (m == 0xFF) {  // fill
      ++at;
      continue;
    }
    if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // stuffed zero, TEM, RSTn
      at += 2;
      continue;
    }
    if (m == 0xD9) return true;  // EOI
    const size_t len = size_t{byte(at + 2)} << 8 | byte(at + 3);
    // A cut table: stb would read its counts on past the end of the file.
    if (m == 0xC4 && at + 2 + len > b.size()) return false;
    if (len < 2 || at + 2 + len > b.size()) return true;
    if (m == 0xC4) {
      const size_t end = at + 2 + len;
      for (size_t p = at + 4; p < end;) {
        if (p + 17 > end) return false;
        size_t n = 0;
        for (size_t i = 1; i <= 16; ++i) n += byte(p + i);
        if (n > 256 || p + 17 + n > end) return false;
        p += 17 + n;
      }
    }
    at += 2 + len;
  }
  return true;
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
  if (is_jpeg(bytes) && !jpeg_tables_fit(bytes))
    throw image_error("the image is damaged (a JPEG Huffman table is too large)");
  auto check_size = [](int64_t w, int64_t h) {
    if (w <= 0 || h <= 0 || w > k_max_image_side || h > k_max_image_side ||
        w * h > k_max_image_pixels)
      throw image_error("the image is " + std::to_string(w) + "x" + std::to_string(h) +
                        " pixels; each side must be 1 to " + std::to_string(k_max_image_side) +
                        " and the whole at most " + std::to_string(k_max_image_pixels));
  };
  // A PNG's size is read from its header first: stb refuses one too large
  // for its own arithmetic (about 2^30 bytes of pixels) with a reason that
  // names no size.
  if (is_png(bytes) && bytes.size() >= 24 && bytes.substr(12, 4) == "IHDR") {
    auto be32 = [&](size_t i) {
      return (int64_t{static_cast<uint8_t>(bytes[i])} << 24) |
             (int64_t{static_cast<uint8_t>(bytes[i + 1])} << 16) |
             (int64_t{static_cast<uint8_t>(bytes[i + 2])} << 8) |
             int64_t{static_cast<uint8_t>(bytes[i + 3])};
    };
    check_size(be32(16), be32(20));
  }
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int len = static_cast<int>(bytes.size());
  int w = 0, h = 0, channels = 0;
  if (!stbi_info_from_memory(data, len, &w, &h, &channels))
    throw image_error(std::string("the image is damaged or truncated (") + failure() + ")");
  check_size(w, h);
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
