#pragma once
// The device actor: owns an OpenCL context, the model's weights on it and
// the KV arena, and runs forward passes.  Spawned detached, since it blocks
// on OpenCL events and must not stall CAF's scheduler.
#include <memory>

#include "messages/device.hpp"
#include "runtime/device/llama_forward.hpp"

namespace troupe {

// Loads the model onto the device in its constructor path; a failure to
// load (bad OpenCL setup, unsupported model) is thrown to the caller of
// spawn_device, before any actor exists.
device_actor spawn_device(caf::actor_system& sys, std::shared_ptr<const model_file> model,
                          const engine_options& opts);

}  // namespace troupe
