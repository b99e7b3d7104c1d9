#pragma once
// A pipeline-parallel device (issue 35's pipelined instances): the model's
// layers split into contiguous stages, each a device actor on its own
// slice of the device with its layers' weights and their part of the KV
// arena.  The pipeline speaks the device protocol itself, so an instance
// drives it as it drives one device: a step's sequences go through the
// stages as micro-batches (runtime/engine/micro_batch.hpp), hidden states
// travelling between them as messages; page reads and writes gather and
// scatter every stage's part of each page.
#include <memory>

#include "messages/device.hpp"
#include "runtime/device/llama_forward.hpp"

namespace troupe {

// The layers of stage i of n over a model of `layers` layers: an equal
// split, [first, end), the earlier stages taking one fewer where it does
// not divide.
std::pair<int, int> stage_layers(int layers, int n, int i);

// Spawns opts.pipeline_stages stage devices (spawn_device each, loading its
// layers) and the pipeline over them.  Each stage runs on its own slice of
// opts.device (its compute units split equally) where the device can be
// split so, with one compute unit per stage at least (and, for a slice,
// evenly); otherwise every stage shares the device (a GPU whose driver
// does not partition it, for one).  Every
// stage's arena holds the same pages (opts.n_pages, or as many as
// opts.kv_bytes holds for the whole model).  Throws, before the pipeline
// exists, where a stage does not load, or for more stages than layers or a
// mixture-of-experts model.
device_actor spawn_pipeline(caf::actor_system& sys, std::shared_ptr<const model_file> model,
                            const engine_options& opts);

}  // namespace troupe
