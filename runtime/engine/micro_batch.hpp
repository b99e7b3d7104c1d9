#pragma once
// Micro-batches for pipeline parallelism (actors/pipeline.hpp): a step's
// sequences split into groups that flow through the stages one after the
// other, so stage 2 runs group k while stage 1 runs group k+1.  Attention
// reads only a row's own sequence, so splitting by sequence changes no
// result: each group is a forward_batch of its own, and the groups'
// results merge back into the step's, in the step's order.  Pure
// functions.
#include <cstdint>
#include <vector>

#include "runtime/engine/forward_batch.hpp"

namespace troupe {

// Where one of the step's outputs (a logit row, a hidden row, a presample
// draw) is in the micro-batches: group, and index within that group's.
struct micro_index {
  int32_t group = 0;
  int32_t index = 0;
};

struct micro_split {
  std::vector<forward_batch> groups;
  std::vector<micro_index> logits;  // per logit row of the step
  std::vector<micro_index> hidden;  // per hidden row
  std::vector<micro_index> drawn;   // per presample row
  std::vector<micro_index> rows;    // per row of the step: its group and row there
};

// Splits b into at most n groups of whole sequences (fewer where b has
// fewer sequences; one for n <= 1).  Sequence s goes to group
// preferred[s] % n where it has a preference (>= 0; the pipeline keeps a
// sequence in the group whose draw its placeholder takes, so the next
// step's group waits only for that one); the others, in b's order, each to
// the group with the fewest rows so far.  Empty groups are dropped (the
// numbers close up, in order).  Each group keeps b's step; its
// rows are its sequences' rows, the sequences in b's order.  b's
// placeholders are left to the caller (the groups have none; `rows` says
// where each placeholder row went).  Every row must be in exactly one
// sequence; throws std::invalid_argument otherwise.
micro_split split_micro_batches(const forward_batch& b, int n,
                                const std::vector<int32_t>& preferred = {});

// The step's result from its groups' results (one per group, in order):
// logits, hidden rows and draws in the step's order; device_ms the sum of
// the groups'.  Throws std::invalid_argument where a group's result is
// short of what its batch asked.
forward_result merge_micro_results(const micro_split& s, std::vector<forward_result>& results);

}  // namespace troupe
