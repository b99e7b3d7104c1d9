#pragma once
// UTF-8 and the little of the Unicode character database the tokenizers
// need: letter / number / whitespace classes (as \p{L}, \p{N}, \s see them).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::unicode {

enum class cpt_class : uint8_t { other, letter, number, whitespace };

// Class of a code point (Unicode 15.1, matching llama.cpp's tables).
cpt_class classify(uint32_t cp);
bool is_whitespace(uint32_t cp);

// Marks a byte that is not part of a valid UTF-8 sequence; decode_next
// returns invalid_base + byte so it stays distinguishable from any scalar.
inline constexpr uint32_t invalid_base = 0x110000;
inline bool is_invalid(uint32_t cp) {
  return cp >= invalid_base;
}

// Decodes the code point at text[pos] and advances pos.  A malformed,
// overlong, surrogate or truncated sequence consumes one byte and yields
// invalid_base + that byte.
uint32_t decode_next(std::string_view text, size_t& pos);

// Appends the UTF-8 form of cp (invalid_base + b appends the raw byte b).
void append_utf8(std::string& out, uint32_t cp);
std::string to_utf8(uint32_t cp);

// Length of the complete, valid UTF-8 sequence starting at text[pos]:
//   > 0  the sequence is valid and that long,
//   0    the bytes so far are a valid but incomplete prefix (text ends early),
//   < 0  text[pos] does not start a valid sequence.
int valid_sequence_length(std::string_view text, size_t pos);

inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";  // U+FFFD

// The text with every byte that is not part of a valid UTF-8 sequence
// replaced by U+FFFD: for protobuf string fields (which a strict parser
// refuses otherwise) filled with text from outside, such as a decoder's
// reason that quotes the bytes of a damaged file.
std::string scrub_utf8(std::string_view text);

// True when text is well-formed UTF-8.
bool is_valid_utf8(std::string_view text);

namespace detail {
extern const uint32_t category_ranges[];
extern const size_t category_ranges_size;
}  // namespace detail

}  // namespace troupe::unicode
