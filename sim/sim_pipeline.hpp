#pragma once
// Pipelined instances in the cluster simulator (issue 35): each instance's
// layers split over `stages` devices of its own, each device slowed at
// times by a load it does not control (co-tenants: a skewed load that
// shifts from device to device), and, with migration, moved between
// stages by the pipeline's own rule (runtime/device/layer_migration
// plan_layer_move) at every window, each move pausing the instance; with
// head migration, a group of a stage's KV heads attends on another stage
// (runtime/device/head_migration plan_head_move), both by the live
// pipeline's one window rule (runtime/device/stage_rebalance).
//
// The cost of a step: the cost model gives one device's time for the
// whole model (`whole_ms`); stage s takes the share of its layers (the
// last stage also the classifier, `classifier_layers` layers' worth),
// times its device's slowdown now.  The step's sequences go through as
// `stages` micro-batches (the pipeline's), so the step lasts
//   sum_s stage_s / M + (M - 1) * max_s stage_s / M,     M = stages,
// the first micro-batch crossing every stage and the others following at
// the slowest stage's pace.  With g of n_kv KV heads of stage d attending
// on stage h, g / n_kv of d's attention (attention_share of its layers'
// time, by the step's mean context and the model's shape) runs on h at h's
// speed, and d waits a round trip (`trip_ms`) per layer and micro-batch.
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/device/layer_migration.hpp"

namespace troupe {

struct sim_pipeline_config {
  int32_t stages = 1;  // 1: instances are not pipelined
  int32_t layers = 30;
  double classifier_layers = 8;
  bool migration = false;       // layer moves
  bool head_migration = false;  // KV-head moves
  layer_migration_options migration_opts;
  // The model's shape, for attention's share of a layer (SmolLM2's).
  int32_t n_embd = 576, n_head = 9, n_kv = 3, head_dim = 64, n_ff = 1536;
  double trip_ms = 0.6;  // the donor's wait per layer and micro-batch with a group away
  // The skewed, shifting load: a `loaded_share` of the devices runs
  // `load_skew` times slower; which ones changes every `load_shift_s`.
  double load_skew = 1;
  double loaded_share = 0.25;
  double load_shift_s = 60;
};

struct sim_pipeline {
  std::vector<int32_t> layers;  // per stage
  std::vector<double> busy_s;   // per stage, over the window
  // A move's pause ends at this time (s): a step that starts before then
  // waits for it (an instance idle meanwhile loses nothing).
  double pause_until_s = 0;
  // A group of KV heads away: its donor stage, its helper, its size (0: none).
  int32_t heads_donor = -1, heads_helper = -1, heads_away = 0;
  int windows_since_move = 1 << 30;
  // The window's micro-batch passes, rows and their summed contexts.
  int64_t passes = 0, rows = 0;
  double context = 0;
};

// What a window did.
struct sim_rebalance {
  int32_t layers_moved = 0;
  int32_t heads_moved = 0;  // a group sent away
  bool heads_home = false;
  double pause_ms = 0;
};

// Stages with equal shares of the layers (the pipeline's stage_layers);
// throws std::invalid_argument for fewer layers than stages.
sim_pipeline make_sim_pipeline(const sim_pipeline_config& c);

// How many times slower device `device` runs at time `t` (1 or load_skew).
double device_slowdown(const sim_pipeline_config& c, uint64_t device, double t);

// One step of an instance whose devices are first_device.. first_device +
// stages - 1 (`rows` rows attending over `context` positions in all): its
// time in ms, the stages' busy times added, the rest of a move's pause
// charged where the step starts within it.
double pipeline_step_ms(sim_pipeline& p, const sim_pipeline_config& c, uint64_t first_device,
                        double whole_ms, double t, int64_t rows = 0, double context = 0);

// The end of a window at time `now` (s): with migration, the move
// plan_stage_rebalance finds on the window's busy times, applied (its pause
// from now on: a step that starts within it waits for the rest); the
// window starts again.
sim_rebalance pipeline_window(sim_pipeline& p, const sim_pipeline_config& c, double window_s,
                              double now = 0);

}  // namespace troupe
