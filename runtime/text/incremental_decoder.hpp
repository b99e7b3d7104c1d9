#pragma once
// Streams generated tokens as text.  A token may end in the middle of a
// UTF-8 character (byte tokens, GPT-2 byte pieces of an emoji); the decoder
// holds such a tail back until the character is complete, so every delta it
// returns is valid UTF-8 and the deltas concatenate to decode(tokens).
#include <cstdint>
#include <string>

#include "runtime/text/tokenizer.hpp"

namespace troupe {

class incremental_decoder {
 public:
  // The tokenizer must outlive the decoder.  special: control tokens show
  // as their text (see tokenizer::token_bytes).
  explicit incremental_decoder(const tokenizer& tok, bool special = false)
      : tok_(&tok), special_(special) {}

  // Text that became complete with this token (possibly "").  Bytes that can
  // never form a valid character come out as U+FFFD right away.
  std::string push(int32_t id);
  // Everything still held back; an unfinished character becomes U+FFFD.
  // The decoder is then empty and can go on.
  std::string flush();

  // Bytes held back, waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const tokenizer* tok_;
  bool special_;
  std::string pending_;  // at most 3 bytes: a valid but incomplete prefix
};

}  // namespace troupe
