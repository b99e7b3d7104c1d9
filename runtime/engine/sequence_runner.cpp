#include "runtime/engine/sequence_runner.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

void linear_pages::reserve(sequence_slot& s, int32_t tokens) {
  const int32_t need = (tokens + page_size_ - 1) / page_size_;
  while (static_cast<int32_t>(s.pages.size()) < need) {
    if (next_ >= n_pages_)
      throw std::runtime_error("KV arena full: " + std::to_string(n_pages_) + " pages of " +
                               std::to_string(page_size_) + " tokens; raise --kv-mb");
    s.pages.push_back(next_++);
  }
}

std::vector<float> feed_tokens(const forward_fn& fwd, linear_pages& pages, sequence_slot& seq,
                               const std::vector<int32_t>& tokens, int max_rows, bool all_logits) {
  std::vector<float> out;
  size_t done = 0;
  while (done < tokens.size()) {
    const int n = static_cast<int>(std::min<size_t>(max_rows, tokens.size() - done));
    pages.reserve(seq, seq.length + n);
    forward_batch b;
    b.tokens.assign(tokens.begin() + done, tokens.begin() + done + n);
    for (int i = 0; i < n; ++i) b.positions.push_back(seq.length + i);
    b.seqs.push_back({0, n, seq.pages});
    const bool last_chunk = done + n == tokens.size();
    if (all_logits)
      for (int i = 0; i < n; ++i) b.logit_rows.push_back(i);
    else if (last_chunk)
      b.logit_rows.push_back(n - 1);
    auto r = fwd(b);
    if (all_logits)
      out.insert(out.end(), r.logits.begin(), r.logits.end());
    else if (last_chunk)
      out = std::move(r.logits);
    seq.length += n;
    done += n;
  }
  return out;
}

}  // namespace troupe
