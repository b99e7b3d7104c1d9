#include "runtime/engine/ngram_draft.hpp"

#include <algorithm>

namespace troupe {

std::vector<int32_t> propose_ngram_draft(std::span<const int32_t> tokens, const ngram_options& o) {
  const int len = static_cast<int>(tokens.size());
  if (o.max_draft <= 0) return {};
  for (int n = std::min(o.max_ngram, len - 1); n >= std::max(o.min_ngram, 1); --n) {
    const auto suffix = tokens.subspan(len - n);
    // The most recent occurrence first: nearby text predicts best.  An
    // occurrence must be followed by at least one token.
    for (int i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int from = i + n;
      const int to = std::min(len, from + o.max_draft);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

}  // namespace troupe
