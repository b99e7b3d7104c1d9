#include "runtime/device/weight_arena.hpp"

#include <array>

namespace troupe {

namespace {

// A layer's tensors in the table's order; nullptr for the spare slot.
std::array<cl::buffer*, k_arena_slots> slots_of(device_layer& L) {
  return {&L.qkv.q,     &L.qkv.d,     &L.qkv.m,     &L.wo.q,   &L.wo.d,   &L.wo.m,
          &L.gate_up.q, &L.gate_up.d, &L.gate_up.m, &L.down.q, &L.down.d, &L.down.m,
          &L.attn_norm, &L.ffn_norm,  &L.qkv_bias,  nullptr};
}

// Bytes a tensor takes in the arena (zero-sized buffers hold 4 bytes).
size_t footprint(const cl::buffer& b) {
  return b.bytes() == 0 ? 4 : b.bytes();
}

}  // namespace

std::vector<int64_t> pack_layer_weights(cl::context& ctx, std::vector<device_layer>& layers,
                                        cl::buffer& arena) {
  const size_t align = ctx.base_align_bytes();
  auto aligned = [align](size_t n) { return (n + align - 1) / align * align; };
  std::vector<int64_t> offs(layers.size() * k_arena_slots, -1);
  size_t total = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].moe || layers[l].shared) return {};
    const auto slots = slots_of(layers[l]);
    for (int k = 0; k < k_arena_slots; ++k) {
      if (!slots[k] || !*slots[k]) continue;
      offs[l * k_arena_slots + k] = static_cast<int64_t>(total);
      total = aligned(total + footprint(*slots[k]));
    }
  }
  if (total == 0 || total > ctx.max_alloc_bytes()) return {};
  // A device short of memory may refuse the arena: the layers then stay
  // where they are and launch one by one.
  try {
    arena = ctx.alloc(total);
  } catch (const cl::cl_error&) {
    return {};
  }
  // Layer by layer, each copy done before its source is released, so the
  // weights are held about once (the arena's pages are touched as copied).
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto slots = slots_of(layers[l]);
    for (int k = 0; k < k_arena_slots; ++k) {
      if (!slots[k] || !*slots[k]) continue;
      const auto off = static_cast<size_t>(offs[l * k_arena_slots + k]);
      ctx.copy(*slots[k], arena, footprint(*slots[k]), off);
    }
    ctx.finish();
    for (int k = 0; k < k_arena_slots; ++k) {
      if (!slots[k] || !*slots[k]) continue;
      const auto off = static_cast<size_t>(offs[l * k_arena_slots + k]);
      const size_t bytes = slots[k]->bytes();
      *slots[k] = ctx.sub_buffer(arena, off, bytes);
    }
  }
  return offs;
}

}  // namespace troupe
