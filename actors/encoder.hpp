#pragma once
// The encoder actor: a vision encoder on its own OpenCL context
// (runtime/device/vision_forward), serving the requests of one service.
// A thin shell: decoding and preprocessing are runtime/vision's, the
// launches vision_forward's.  Detached: an encode holds its thread.
#include <memory>

#include "messages/encoder.hpp"
#include "runtime/device/cl_runtime.hpp"
#include "runtime/service/metrics.hpp"
#include "runtime/vision/clip_model.hpp"
#include "runtime/vision/encode_ledger.hpp"

namespace troupe {

// Throws cl_error where the device cannot take the encoder.  The ledger
// bounds, withdraws and caches its work (shared with the request actors;
// null: unbounded, no cache); `metrics` (may be null) gets its figures
// after every image (the request actors add theirs at admission).
encoder_actor spawn_encoder(caf::actor_system& sys, std::shared_ptr<const clip_model> model,
                            cl::device_choice where, std::shared_ptr<encode_ledger> ledger,
                            std::shared_ptr<metrics_registry> metrics);

// The ledger's figures as troupe_encoder_* series.
void record_encoder(metrics_registry& m, const encode_ledger::stats& s);

}  // namespace troupe
