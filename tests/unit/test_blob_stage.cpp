// Direct KV transfer's receiving side (runtime/kvstore/blob_stage.hpp) and
// the blob header a first chunk is checked against: chunks in order make
// the blob, anything else is refused with the reason, and what arrives
// from the network stays bounded.
#include <gtest/gtest.h>

#include <random>

#include "runtime/engine/kv_blob.hpp"
#include "runtime/kvstore/blob_stage.hpp"

namespace troupe {
namespace {

kv_geometry geometry() {
  return {"stories15m:abc", 6, 6, 48, 16, "f16"};
}

std::vector<uint8_t> blob_bytes(kv_geometry g, int tokens) {
  kv_blob b;
  b.geometry = std::move(g);
  for (int i = 0; i < tokens; ++i) b.tokens.push_back(100 + i);
  b.n_prompt = tokens / 2;
  b.pages.resize(size_t((tokens + 15) / 16) * b.geometry.page_bytes());
  std::mt19937 rng(3);
  for (auto& x : b.pages) x = static_cast<uint8_t>(rng());
  return encode_kv_blob(b);
}

std::span<const uint8_t> part(const std::vector<uint8_t>& v, size_t at, size_t n) {
  return {v.data() + at, std::min(n, v.size() - at)};
}

using clock_type = blob_stage::clock;

TEST(BlobHeader, TheFirstBytesNameTheGeometry) {
  const auto bytes = blob_bytes(geometry(), 40);
  EXPECT_EQ(geometry_mismatch(peek_kv_blob_geometry(part(bytes, 0, 200)), geometry()), "");
  EXPECT_THROW(peek_kv_blob_geometry(part(bytes, 0, 20)), kv_blob_error);  // cut in the header
  std::vector<uint8_t> junk(300, 0x42);
  EXPECT_THROW(peek_kv_blob_geometry(junk), kv_blob_error);
  EXPECT_THROW(peek_kv_blob_geometry(std::span<const uint8_t>{}), kv_blob_error);
}

TEST(BlobStage, ChunksInOrderMakeTheBlob) {
  const auto bytes = blob_bytes(geometry(), 40);
  blob_stage stage(geometry(), bytes.size(), std::chrono::seconds(30));
  const auto now = clock_type::now();
  uint64_t id = 0;
  const size_t chunk = 1000;
  for (size_t at = 0; at < bytes.size(); at += chunk)
    ASSERT_EQ(stage.add(id, at, bytes.size(), part(bytes, at, chunk), now), "") << at;
  EXPECT_NE(id, 0u);
  auto got = stage.take(id);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, bytes);
  EXPECT_FALSE(stage.take(id).has_value());  // taken once
  EXPECT_EQ(stage.open(), 0u);
}

TEST(BlobStage, RefusesWhatDoesNotFit) {
  const auto bytes = blob_bytes(geometry(), 40);
  const auto now = clock_type::now();
  blob_stage stage(geometry(), bytes.size(), std::chrono::seconds(30));
  uint64_t id = 0;
  // Larger than the arena could hold.
  EXPECT_NE(stage.add(id, 0, bytes.size() + 1, part(bytes, 0, 1000), now), "");
  // Another model's blob, refused at its first chunk.
  auto other = geometry();
  other.model_fingerprint = "smollm2:def";
  const auto theirs = blob_bytes(other, 40);
  id = 0;
  EXPECT_NE(stage.add(id, 0, theirs.size(), part(theirs, 0, 1000), now).find("model fingerprint"),
            std::string::npos);
  // Not a blob.
  std::vector<uint8_t> junk(1000, 7);
  id = 0;
  EXPECT_NE(stage.add(id, 0, 1000, junk, now), "");
  // A first chunk that is not at 0.
  id = 0;
  EXPECT_NE(stage.add(id, 5, bytes.size(), part(bytes, 0, 1000), now), "");
  EXPECT_EQ(stage.open(), 0u);
}

TEST(BlobStage, AChunkOutOfOrderDropsItsTransfer) {
  const auto bytes = blob_bytes(geometry(), 40);
  const auto now = clock_type::now();
  blob_stage stage(geometry(), bytes.size(), std::chrono::seconds(30));
  uint64_t id = 0;
  ASSERT_EQ(stage.add(id, 0, bytes.size(), part(bytes, 0, 1000), now), "");
  EXPECT_NE(stage.add(id, 2000, bytes.size(), part(bytes, 2000, 1000), now), "");  // a gap
  EXPECT_EQ(stage.open(), 0u);
  EXPECT_NE(stage.add(id, 1000, bytes.size(), part(bytes, 1000, 1000), now), "");  // gone
  // Past the total it announced.
  id = 0;
  ASSERT_EQ(stage.add(id, 0, 1500, part(bytes, 0, 1000), now), "");
  EXPECT_NE(stage.add(id, 1000, 1500, part(bytes, 1000, 1000), now), "");
  // An incomplete transfer is not imported.
  id = 0;
  ASSERT_EQ(stage.add(id, 0, bytes.size(), part(bytes, 0, 1000), now), "");
  EXPECT_FALSE(stage.take(id).has_value());
}

TEST(BlobStage, OpenTransfersAreBoundedAndExpire) {
  const auto bytes = blob_bytes(geometry(), 40);
  auto now = clock_type::now();
  blob_stage stage(geometry(), bytes.size(), std::chrono::seconds(30));
  uint64_t a = 0, b = 0, c = 0;
  ASSERT_EQ(stage.add(a, 0, bytes.size(), part(bytes, 0, 1000), now), "");
  ASSERT_EQ(stage.add(b, 0, bytes.size(), part(bytes, 0, 1000), now), "");
  // Two full-size blobs in progress hold all the room there is.
  EXPECT_NE(stage.add(c, 0, bytes.size(), part(bytes, 0, 1000), now), "");
  // Resting past the ttl, they are dropped, and the room is free again.
  now += std::chrono::seconds(31);
  c = 0;
  EXPECT_EQ(stage.add(c, 0, bytes.size(), part(bytes, 0, 1000), now), "");
  EXPECT_EQ(stage.dropped(), 2u);
  EXPECT_EQ(stage.open(), 1u);
  EXPECT_NE(stage.add(a, 1000, bytes.size(), part(bytes, 1000, 1000), now), "");
}

}  // namespace
}  // namespace troupe
