#include "runtime/text/incremental_decoder.hpp"

#include "runtime/text/unicode.hpp"

namespace troupe {

std::string incremental_decoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id, special_);
  std::string out;
  out.reserve(pending_.size());
  size_t pos = 0;
  while (pos < pending_.size()) {
    const int len = unicode::valid_sequence_length(pending_, pos);
    if (len == 0) break;  // a character still being spelled: wait for more
    if (len < 0) {
      out += unicode::replacement_character;
      ++pos;
      continue;
    }
    out.append(pending_, pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
  }
  pending_.erase(0, pos);
  return out;
}

std::string incremental_decoder::flush() {
  // What is left is one incomplete prefix; it will never be completed.
  std::string out = pending_.empty() ? std::string() : std::string(unicode::replacement_character);
  pending_.clear();
  return out;
}

}  // namespace troupe
