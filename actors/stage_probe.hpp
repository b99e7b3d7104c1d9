#pragma once
// What HELR layer placement (runtime/device/layer_placement) needs to know
// of a pipeline stage's device, measured on the stage itself (issue 35):
// how long one token takes through one of its layers, how long a message
// takes there and back (the link: hidden states cross as messages through
// the pipeline), and the device's memory.
#include <caf/all.hpp>
#include <cstdint>

#include "messages/device.hpp"

namespace troupe {

struct stage_probe {
  double seconds_per_layer = 0;  // one token through one layer
  double round_trip_s = 0;       // a message to the stage and its answer
  uint64_t memory_bytes = 0;     // the device's (OpenCL global memory)
};

// Runs `reps` one-token forward passes on `stage` (its `layers` layers; a
// first stage reads a token, a later one hidden states of `n_embd`
// floats) and as many info round trips, and keeps the fastest of each.
// The passes write the KV of page 0 at position 0: call it before the
// pipeline serves (no sequence holds a page yet; every sequence writes a
// position before it reads it).  Throws std::runtime_error naming the
// stage's failure.
stage_probe probe_stage(caf::actor_system& sys, const device_actor& stage, int32_t layers,
                        int32_t n_embd, bool takes_tokens, int reps = 5);

}  // namespace troupe
