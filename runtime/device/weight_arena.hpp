#pragma once
// The dense layers' weights in one device buffer (an arena), each tensor a
// sub-buffer of it, so that one kernel launch reaches every layer: a whole
// step in one launch (kernels/layer.cl's step_*).  Kernels that take a
// tensor's own buffer run on the sub-buffers unchanged.
#include <cstdint>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/device_weights.hpp"

namespace troupe {

// Offsets per layer in the table pack_layer_weights returns (layer.cl's
// ARENA_SLOTS): qkv, wo, gate/up, down (quants, scales, mins each), the
// attention and FFN norms, the QKV bias (-1: none), one spare.
inline constexpr int k_arena_slots = 16;

// Moves the layers' tensors into `arena` (allocated here) and returns each
// tensor's byte offset in it, k_arena_slots per layer.  Returns an empty
// table, and moves nothing, where they do not fit one allocation or a
// layer has experts.
std::vector<int64_t> pack_layer_weights(cl::context& ctx, std::vector<device_layer>& layers,
                                        cl::buffer& arena);

}  // namespace troupe
