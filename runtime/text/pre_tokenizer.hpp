#pragma once
// The pre-tokenizers of byte-level BPE vocabularies: the regex each
// vocabulary names (GGUF `tokenizer.ggml.pre`) cuts text into words before
// BPE merges bytes inside a word.  The regexes need \p{L} and \p{N}, which
// std::regex lacks, so they are matched by hand over classified code points,
// as llama.cpp's own hand-written splitters do:
//   gpt2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   smollm:  \p{N} first (every digit its own piece), then gpt2 on the rest.
//   llama3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2:   llama3 with \p{N} (one digit a piece) for \p{N}{1,3}.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/text/unicode.hpp"

namespace troupe {

enum class pre_tokenizer { gpt2, digits_then_gpt2, llama3, qwen2 };

struct pre_tokenizer_kind {
  pre_tokenizer split;
  // llama.cpp's ignore_merges: a word that is itself a token is taken
  // whole, without merging (Llama 3's vocabularies).
  bool whole_words;
};

// The splitter for a vocabulary's `tokenizer.ggml.pre` name; throws naming
// the supported ones for any other.
pre_tokenizer_kind pre_tokenizer_for(const std::string& pre);

struct cpt_span {
  uint32_t cp;
  unicode::cpt_class cls;
  size_t begin, end;  // byte offsets in the text
};

// The lengths, in code points, of the words covering cps, in order.
std::vector<size_t> split_words(pre_tokenizer split, const std::vector<cpt_span>& cps);

}  // namespace troupe
