// The weight arena (runtime/device/weight_arena.hpp): every layer tensor moved
// into one buffer keeps its bytes, its sub-buffer reads as the tensor did,
// and the offset table points at the same bytes in the arena.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "runtime/device/weight_arena.hpp"
#include "tests/unit/gguf_fixture.hpp"

namespace troupe {
namespace {

std::vector<unsigned char> read_all(cl::context& ctx, const cl::buffer& b) {
  std::vector<unsigned char> out(b.bytes());
  ctx.read(b, out.data(), out.size());
  return out;
}

// The layer tensors k_arena_slots lists, in its order (null: none).
std::vector<const cl::buffer*> tensors(const device_layer& L) {
  return {&L.qkv.q,     &L.qkv.d,     &L.qkv.m,     &L.wo.q,   &L.wo.d,   &L.wo.m,
          &L.gate_up.q, &L.gate_up.d, &L.gate_up.m, &L.down.q, &L.down.d, &L.down.m,
          &L.attn_norm, &L.ffn_norm,  &L.qkv_bias,  nullptr};
}

TEST(WeightArena, LayerTensorsKeepTheirBytesAndOffsets) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-weight-arena-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "tiny.gguf").string();
  testing::tiny_llama_options opts;
  opts.matrix_type = tensor_type::q4_1;  // quants, scales and mins
  opts.n_layer = 3;
  testing::make_tiny_llama(opts).write(path);
  const auto model = model_file::open(path);
  std::filesystem::remove_all(dir);

  cl::context ctx;
  auto w = upload_weights(ctx, *model);
  std::vector<std::vector<std::vector<unsigned char>>> before;
  for (const auto& L : w.layers) {
    before.emplace_back();
    for (const cl::buffer* b : tensors(L))
      before.back().push_back(b && *b ? read_all(ctx, *b) : std::vector<unsigned char>{});
  }
  const auto offs = pack_layer_weights(ctx, w.layers, w.arena);
  ASSERT_EQ(offs.size(), w.layers.size() * k_arena_slots);
  ASSERT_TRUE(w.arena);
  const auto arena = read_all(ctx, w.arena);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto now = tensors(w.layers[l]);
    for (int k = 0; k < k_arena_slots; ++k) {
      SCOPED_TRACE("layer " + std::to_string(l) + " tensor " + std::to_string(k));
      const auto off = offs[l * k_arena_slots + k];
      if (!now[k] || !*now[k]) {
        EXPECT_EQ(off, -1);
        continue;
      }
      ASSERT_GE(off, 0);
      EXPECT_EQ(off % static_cast<int64_t>(ctx.base_align_bytes()), 0);
      const auto& want = before[l][k];
      EXPECT_EQ(read_all(ctx, *now[k]), want);
      ASSERT_LE(static_cast<size_t>(off) + want.size(), arena.size());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), arena.begin() + off));
    }
  }
}

}  // namespace
}  // namespace troupe
