#pragma once
// KV-head migration's trigger (BanaServe's attention-level migration, the
// thesis's Algorithm 4-1 at head level; runtime/device/head_group.hpp is
// the mechanism): a plain function of the stages' measured busy times over
// a window, as plan_layer_move is for layers.
//
// The rule: the busiest stage (the donor) must exceed the stages' mean busy
// time by more than the threshold (the hysteresis).  Moving g of its n_kv
// KV heads to another stage (the helper: the least busy) takes g / n_kv of
// the donor's attention time off it and puts it on the helper (scaled by
// the helper's speed against the donor's, from their per-layer times), but
// the donor then waits for a round trip per layer and pass (`trip_s`): the
// g that makes the busier of the two least is taken, and the move must pay
// for itself: a gain of min_gain at least, and the gain over the horizon
// above the pause (head_move_cost_s per layer, for the group's share).
//
// The attention's share of a stage's time is not measured: it is estimated
// from the window's mean context by multiply-accumulates (attention_share),
// which counts a weight's product as dear as an attention product.
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/device/layer_migration.hpp"

namespace troupe {

struct head_move_inputs {
  std::vector<stage_load> stages;
  int32_t n_kv = 0;            // KV heads per layer
  double attention_share = 0;  // of a stage's busy time, its attention's
  double trip_s = 0.0006;      // the donor's wait per layer and pass with a group away
  int64_t steps = 0;           // passes over the stages in the window (micro-batches)
};

struct head_move_plan {
  int32_t from = 0;  // the donor
  int32_t to = 0;    // the helper
  int32_t heads = 0;
  double gain = 0;  // the slowest stage's predicted busy time saved, as a share
};

// None when the stages are balanced within the threshold or no group pays.
std::optional<head_move_plan> plan_head_move(const head_move_inputs& in,
                                             const layer_migration_options& o);

// The pause for moving `heads` of n_kv KV heads' pages of `layers` layers:
// the group's share of head_move_cost_s a layer.
inline double head_move_pause_s(const layer_migration_options& o, int32_t layers, int32_t heads,
                                int32_t n_kv) {
  return n_kv > 0 ? o.head_move_cost_s * layers * heads / n_kv : 0.0;
}

// Whether the group of `heads` KV heads that stage `donor` has away on
// stage `helper` should come home: with it home, the busier of the two
// would be less busy by min_gain at least.  The window's donor time holds
// its round trips (trip_s per layer and pass) and its own heads' attention
// (attention_share of the rest, for n_kv - heads heads), from which the
// group's is estimated; at home the trips go and the group's attention
// comes back, and the helper sheds the same work (its speed unknown: as
// the donor's).
bool head_group_pays_home(const head_move_inputs& in, int32_t donor, int32_t helper, int32_t heads,
                          const layer_migration_options& o);

// Attention's share of a layer's multiply-accumulates for a row at mean
// context `context`: 2 x n_head x head_dim x context against the layer's
// weights (QKV, output, gated FFN).
double attention_share(int n_embd, int n_head, int n_kv, int head_dim, int n_ff, double context);

}  // namespace troupe
