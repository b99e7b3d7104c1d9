#include "runtime/text/unicode.hpp"

#include <algorithm>

namespace troupe::unicode {

bool is_whitespace(uint32_t cp) {
  // The White_Space property (PropList.txt): what \s matches.
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

cpt_class classify(uint32_t cp) {
  if (is_whitespace(cp)) return cpt_class::whitespace;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return cpt_class::letter;
    if (cp >= '0' && cp <= '9') return cpt_class::number;
    return cpt_class::other;
  }
  if (cp >= 0x110000) return cpt_class::other;
  // Last range whose first code point is <= cp.
  const uint32_t* begin = detail::category_ranges;
  const uint32_t* end = begin + detail::category_ranges_size;
  const uint32_t key = (cp << 2) | 3;
  const uint32_t* it = std::upper_bound(begin, end, key);
  switch (it[-1] & 3) {
    case 1:
      return cpt_class::letter;
    case 2:
      return cpt_class::number;
    default:
      return cpt_class::other;
  }
}

int valid_sequence_length(std::string_view text, size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) return 1;
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (pos + i >= text.size()) return 0;
    const auto b = static_cast<unsigned char>(text[pos + i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return -1;
  }
  return len;
}

uint32_t decode_next(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  const int len = valid_sequence_length(text, pos);
  if (len <= 0) {
    ++pos;
    return invalid_base + b0;
  }
  uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  pos += len;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (is_invalid(cp)) {
    out += static_cast<char>(cp - invalid_base);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string to_utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const int len = valid_sequence_length(text, pos);
    if (len <= 0) return false;
    pos += len;
  }
  return true;
}

std::string scrub_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t cp = decode_next(text, pos);
    if (is_invalid(cp))
      out += replacement_character;
    else
      append_utf8(out, cp);
  }
  return out;
}

}  // namespace troupe::unicode
