#pragma once
// Drives single sequences through a forward function page by page: the
// plain path `troupe generate`, `troupe perplexity` and the engine
// benchmark use, where one client owns the whole KV arena.  (The serving
// path schedules many sequences with runtime/engine/engine in the instance
// actor.)
#include <functional>
#include <vector>

#include "runtime/engine/forward_batch.hpp"

namespace troupe {

using forward_fn = std::function<forward_result(const forward_batch&)>;

struct sequence_slot {
  std::vector<int32_t> pages;  // page table
  int32_t length = 0;          // tokens whose KV is stored
};

// Hands out pages 0..n_pages-1 in order, to tools that own the arena.
class linear_pages {
 public:
  linear_pages(int n_pages, int page_size) : n_pages_(n_pages), page_size_(page_size) {}
  // Grows the slot's page table to hold `tokens` positions; throws
  // std::runtime_error when the arena is full.
  void reserve(sequence_slot& s, int32_t tokens);
  void reset() { next_ = 0; }
  int page_size() const { return page_size_; }

 private:
  int n_pages_, page_size_, next_ = 0;
};

// Appends tokens to a sequence in chunks of at most max_rows per forward
// call; returns the logits of the last token (or of every token when
// all_logits is set, concatenated).
std::vector<float> feed_tokens(const forward_fn& fwd, linear_pages& pages, sequence_slot& seq,
                               const std::vector<int32_t>& tokens, int max_rows, bool all_logits);

}  // namespace troupe
