#include "runtime/engine/perplexity.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe {

perplexity_result perplexity(const forward_fn& fwd, int n_pages, int page_size,
                             const std::vector<int32_t>& tokens, int n_ctx, int32_t bos,
                             int max_rows, const std::function<void(int, int, double)>& progress) {
  if (n_ctx < 4) throw std::invalid_argument("context must be at least 4 tokens");
  const int n_chunks = static_cast<int>(tokens.size() / n_ctx);
  if (n_chunks == 0)
    throw std::invalid_argument("text has " + std::to_string(tokens.size()) +
                                " tokens, fewer than one chunk of " + std::to_string(n_ctx));
  const int per_call = std::max(1, max_rows / n_ctx);
  const int first = n_ctx / 2;
  perplexity_result res;
  double total = 0.0;
  linear_pages pages(n_pages, page_size);
  for (int c0 = 0; c0 < n_chunks; c0 += per_call) {
    const int nc = std::min(per_call, n_chunks - c0);
    pages.reset();
    forward_batch b;
    for (int c = 0; c < nc; ++c) {
      const size_t start = static_cast<size_t>(c0 + c) * n_ctx;
      sequence_slot slot;
      pages.reserve(slot, n_ctx);
      const int row0 = static_cast<int>(b.tokens.size());
      for (int i = 0; i < n_ctx; ++i) {
        b.tokens.push_back(i == 0 && bos >= 0 ? bos : tokens[start + i]);
        b.positions.push_back(i);
      }
      b.seqs.push_back({row0, n_ctx, slot.pages});
      for (int i = first; i < n_ctx - 1; ++i) b.logit_rows.push_back(row0 + i);
    }
    auto r = fwd(b);
    const size_t V = static_cast<size_t>(r.n_vocab);
    const int per_chunk = n_ctx - 1 - first;
    for (int c = 0; c < nc; ++c) {
      const size_t start = static_cast<size_t>(c0 + c) * n_ctx;
      for (int k = 0; k < per_chunk; ++k) {
        const float* lg = r.logits.data() + (static_cast<size_t>(c) * per_chunk + k) * V;
        const float mx = *std::max_element(lg, lg + V);
        double sum = 0.0;
        for (size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(lg[v] - mx));
        const int32_t target = tokens[start + first + k + 1];
        total += (mx + std::log(sum)) - lg[target];
        ++res.scored;
      }
      ++res.chunks;
      if (progress) progress(res.chunks, n_chunks, std::exp(total / res.scored));
    }
  }
  res.nll = total / res.scored;
  res.ppl = std::exp(res.nll);
  return res;
}

}  // namespace troupe
