#pragma once
// Layer migration between pipeline stages (BanaServe's adaptive module
// migration, the thesis's Algorithm 4-1, layer level; REFERENCES.md): when
// one stage is busier than the others, move a contiguous run of layers at
// its boundary to the lighter neighbour, so the pipeline's slowest stage,
// which sets its throughput, gets faster.  A plain function of the stages'
// measured busy times; the pipeline actor (actors/pipeline.hpp) runs it
// over each window of steps and carries out its moves.
//
// The rule: a stage is overloaded when its busy time exceeds the mean by
// more than `threshold` (the hysteresis: small imbalances are left alone).
// Moving k layers from it (the donor) to a neighbour (the receiver) takes
// k x c off the one and puts k x c on the other, with c the per-layer time
// of the cheaper of the two (a stage's busy time also holds work that does
// not move with its layers, the last stage's classifier above all: its
// per-layer figure overstates what a layer costs).  The k that makes the
// busier of the two least is taken; the move must pay for itself: the
// slowest stage's predicted gain, over `horizon_s` of serving, above the
// move's cost (the pause while weights and KV move, `move_cost_s` per
// layer).  Every stage keeps one layer at least.
#include <cstdint>
#include <optional>
#include <vector>

namespace troupe {

struct stage_load {
  int32_t layers = 0;
  double busy_s = 0;  // over the window
};

struct layer_migration_options {
  double threshold = 0.1;     // over the mean busy time, as a share of it
  double window_s = 1;        // the window the busy times cover (wall time)
  double horizon_s = 60;      // how long a gain is counted on
  double move_cost_s = 0.05;  // the pause per layer moved (weights and KV)
  // The pause per layer for moving every KV head's share of the pages (no
  // weights); a group of g of n_kv heads pays g / n_kv of it.  troupe
  // measured 5 ms a layer for 1 of SmolLM2's 3 heads over 216 pages.
  double head_move_cost_s = 0.015;
  // Windows after a move (of layers or heads, either way) before the next:
  // the busy times a move is planned on are one window's, and the window
  // after a move shows its estimate's error, which without a pause the
  // rule chases back and forth (plan_stage_rebalance).
  int cooldown_windows = 5;
  double min_gain = 0.02;  // the slowest stage's predicted gain, as a share
};

struct layer_move {
  int32_t from = 0;  // the donor stage
  int32_t to = 0;    // the receiver (from - 1 or from + 1)
  int32_t layers = 0;
  double gain = 0;  // the slowest stage's predicted busy time saved, as a share
};

// None when the stages are balanced within the threshold or no move pays.
std::optional<layer_move> plan_layer_move(const std::vector<stage_load>& stages,
                                          const layer_migration_options& o);

}  // namespace troupe
