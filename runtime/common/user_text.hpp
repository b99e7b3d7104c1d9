#pragma once
// Reading and quoting text a user or client gave (a flag's value, a
// setting in a file or the environment, a field of a request).
//
// Quoting: an error names the value it refuses, but a value may be
// anything: a 50 MB string set through `--config` was echoed whole into
// the error and the log (found by a careless-user probe), and control
// bytes in it would reach the terminal.  `quoted_value` keeps the first bytes,
// says how many there were, and shows control bytes as \xNN.
//
// (Not `quoted`: ADL would pick std::quoted for a std::string.)
//
// Numbers: the whole text as a number, nothing before or after it (no
// sign a type cannot hold, no spaces, no "12abc"), spelled once here for
// the flags, the settings and the shell.  Header-only: the client
// library links no runtime.
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>

namespace troupe {

// `v` between single quotes, at most `keep` bytes of it, control bytes
// and DEL as \xNN; a longer value ends with "... (N bytes)" after the
// quote.
inline std::string quoted_value(std::string_view v, size_t keep = 80) {
  std::string out = "'";
  size_t shown = v.size() > keep ? keep : v.size();
  // Cut at a character's start, so a clipped UTF-8 value stays UTF-8 (an
  // error text may go out as JSON, whose strict dump throws on it).
  while (shown > 0 && shown < v.size() && (static_cast<unsigned char>(v[shown]) & 0xC0) == 0x80)
    --shown;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  if (shown < v.size()) out += "... (" + std::to_string(v.size()) + " bytes)";
  return out;
}

// The whole of `text` as a number of type T (decimal, nothing else in
// it); false, with `out` untouched, when it is not one or T cannot hold
// it.
template <class T>
bool whole_text_as(std::string_view text, T& out) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return false;
  out = v;
  return true;
}

// `text` as a TCP port in [0, 65535], or -1.
inline long port_number(std::string_view text) {
  long p = -1;
  return whole_text_as(text, p) && p >= 0 && p <= 65535 ? p : -1;
}

}  // namespace troupe
