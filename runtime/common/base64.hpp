#pragma once
// Base64 (RFC 4648, with padding) through OpenSSL's EVP blocks: etcd's
// keys and values, OpenAI's base64 embeddings, images sent as data URLs.
// Header-only: the client library links no runtime (it links OpenSSL).
#include <openssl/evp.h>

#include <climits>
#include <optional>
#include <string>
#include <string_view>

namespace troupe {

inline std::string to_base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// The bytes of `text`, or nothing where it is not base64 (a length that is
// not a multiple of 4, a character outside the alphabet, misplaced padding).
inline std::optional<std::string> from_base64(std::string_view text) {
  if (text.empty()) return std::string();
  if (text.size() % 4 != 0 || text.size() > INT_MAX) return std::nullopt;
  std::string out(3 * (text.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the padding's zero bytes too.
  size_t len = static_cast<size_t>(n);
  if (text.back() == '=') --len;
  if (text.size() >= 2 && text[text.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

}  // namespace troupe
