#pragma once
// What a pipeline does with a window's stage loads (BanaServe's adaptive
// module migration, the thesis's Algorithm 4-1): the one decision the live
// pipeline (actors/pipeline.cpp) and the simulator (sim/sim_pipeline) both
// take at the end of every window, so the simulator's moves are the live
// ones.  In order:
//   1. a group of KV heads away comes home once its helper is the busier of
//      the two by more than the threshold (the load shifted), or once home
//      pays (head_group_pays_home: the donor's round trips cost more than
//      the group's attention it sheds, as in windows of short contexts);
//      while it is away nothing else moves (a layer move would rebuild a
//      stage the group routes from or to);
//   2. a layer move (plan_layer_move), where one pays;
//   3. else a group of the busiest stage's KV heads (plan_head_move), where
//      attention is a large share of its time (long contexts).
// Nothing moves within cooldown_windows of the last move, but a group
// whose helper is overloaded comes home.  A threshold of 0 turns it all
// off (--pipeline-rebalance 0).
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/device/head_migration.hpp"
#include "runtime/device/layer_migration.hpp"

namespace troupe {

struct head_group_away {
  int32_t donor = -1;
  int32_t helper = -1;
  int32_t heads = 0;
};

struct stage_rebalance_inputs {
  // The stages' window (busy times, passes, attention's share), as
  // plan_layer_move (its stages) and plan_head_move read it.
  head_move_inputs load;
  std::optional<head_group_away> away;  // a group away now
  int windows_since_move = 1 << 30;     // windows ended since the last move ended
  bool layers = true;                   // layer moves considered
  bool heads = true;                    // head moves considered
};

struct stage_rebalance_move {
  std::optional<layer_move> layers;
  std::optional<head_move_plan> heads;
  bool heads_home = false;  // the group away comes home
  bool any() const { return layers || heads || heads_home; }
};

stage_rebalance_move plan_stage_rebalance(const stage_rebalance_inputs& in,
                                          const layer_migration_options& o);

}  // namespace troupe
