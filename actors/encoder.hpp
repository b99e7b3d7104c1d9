#pragma once
// The encoder actor: a vision encoder on its own OpenCL context
// (runtime/device/vision_forward), serving the requests of one service.
// A thin shell: decoding and preprocessing are runtime/vision's, the
// launches vision_forward's.  Detached: an encode holds its thread.
#include <memory>

#include "messages/encoder.hpp"
#include "runtime/device/cl_runtime.hpp"
#include "runtime/vision/clip_model.hpp"

namespace troupe {

// Throws cl_error where the device cannot take the encoder.
encoder_actor spawn_encoder(caf::actor_system& sys, std::shared_ptr<const clip_model> model,
                            cl::device_choice where);

}  // namespace troupe
