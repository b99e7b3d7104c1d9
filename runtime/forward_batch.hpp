#pragma once
// One step's work for the device: the new tokens of several sequences,
// flattened into rows (continuous batching without padding), each sequence
// with the page table its KV lives in.
#include <cstdint>
#include <vector>

namespace troupe {

struct forward_seq {
  int32_t first_row = 0;  // its rows are [first_row, first_row + n_rows)
  int32_t n_rows = 0;
  std::vector<int32_t> pages;  // page table, covering positions 0..last row's position
};

struct forward_batch {
  std::vector<int32_t> tokens;     // one per row
  std::vector<int32_t> positions;  // one per row
  std::vector<forward_seq> seqs;
  std::vector<int32_t> logit_rows;  // rows whose logits come back, in this order
};

struct forward_result {
  int32_t n_vocab = 0;
  std::vector<float> logits;  // logit_rows.size() x n_vocab
};

}  // namespace troupe
