// The KV blob (runtime/engine/kv_blob.hpp): round trip, every geometry mismatch
// named, damaged bytes refused; and seeded sampling that needs no state
// carried (a seeded sequence draws the same after a move or a recompute).
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "runtime/engine/kv_blob.hpp"
#include "runtime/engine/sampler.hpp"

namespace troupe {
namespace {

kv_geometry stories_geometry() {
  return {"stories15m:abc", 6, 6, 48, 16, "f16"};
}

kv_blob sample_blob() {
  kv_blob b;
  b.geometry = stories_geometry();
  for (int i = 0; i < 37; ++i) b.tokens.push_back(100 + i);
  b.n_prompt = 5;
  b.pages.resize(3 * b.geometry.page_bytes());
  std::mt19937 rng(7);
  for (auto& x : b.pages) x = static_cast<uint8_t>(rng());
  return b;
}

TEST(KvBlob, RoundTrips) {
  const kv_blob b = sample_blob();
  EXPECT_EQ(b.geometry.page_bytes(), 2u * 6 * 6 * 48 * 16 * 2);
  const auto bytes = encode_kv_blob(b);
  const kv_blob d = decode_kv_blob(bytes);
  EXPECT_EQ(geometry_mismatch(d.geometry, b.geometry), "");
  EXPECT_EQ(d.tokens, b.tokens);
  EXPECT_EQ(d.n_prompt, b.n_prompt);
  EXPECT_EQ(d.pages, b.pages);
}

TEST(KvBlob, EveryMismatchIsNamed) {
  const kv_geometry here = stories_geometry();
  auto with = [&](auto edit) {
    kv_geometry g = here;
    edit(g);
    return geometry_mismatch(g, here);
  };
  EXPECT_EQ(with([](kv_geometry& g) { g.model_fingerprint = "smollm2:def"; }),
            "model fingerprint: the blob has 'smollm2:def', this instance 'stories15m:abc'");
  EXPECT_EQ(with([](kv_geometry& g) { g.n_layers = 30; }),
            "n_layers: the blob has 30, this instance 6");
  EXPECT_EQ(with([](kv_geometry& g) { g.n_kv_heads = 3; }),
            "n_kv_heads: the blob has 3, this instance 6");
  EXPECT_EQ(with([](kv_geometry& g) { g.head_dim = 64; }),
            "head_dim: the blob has 64, this instance 48");
  EXPECT_EQ(with([](kv_geometry& g) { g.page_size = 32; }),
            "page_size: the blob has 32, this instance 16");
  EXPECT_EQ(with([](kv_geometry& g) { g.dtype = "f32"; }),
            "dtype: the blob has 'f32', this instance 'f16'");
}

TEST(KvBlob, DamagedBytesAreRefused) {
  auto bytes = encode_kv_blob(sample_blob());
  auto refused = [](std::vector<uint8_t> b, const std::string& what) {
    try {
      decode_kv_blob(b);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const kv_blob_error& e) {
      EXPECT_NE(std::string(e.what()).find("KV blob"), std::string::npos) << e.what();
    }
  };
  refused({}, "empty");
  refused({0xc1, 0x00}, "not msgpack");
  refused(std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 2), "truncated");
  kv_blob short_pages = sample_blob();
  short_pages.pages.resize(short_pages.pages.size() - 1);
  try {
    decode_kv_blob(encode_kv_blob(short_pages));
    ADD_FAILURE() << "accepted pages that do not match the header";
  } catch (const kv_blob_error& e) {
    EXPECT_NE(std::string(e.what()).find("3 pages"), std::string::npos) << e.what();
  }
  kv_blob bad_prompt = sample_blob();
  bad_prompt.n_prompt = 99;
  EXPECT_THROW(decode_kv_blob(encode_kv_blob(bad_prompt)), kv_blob_error);
}

TEST(SamplerState, ASeededSequenceDrawsTheSameAfterAMove) {
  sampling_params p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  std::vector<int32_t> history = {1, 2, 3};
  sampler here(p);
  for (int i = 0; i < 10; ++i) history.push_back(here.sample(logits, history).token);
  // Move (or recompute after a loss): a fresh sampler elsewhere, nothing
  // carried but the tokens, draws the same.
  sampler there(p);
  auto h2 = history;
  std::set<int32_t> seen;
  for (int i = 0; i < 20; ++i) {
    const int32_t a = here.sample(logits, history).token;
    const int32_t b = there.sample(logits, h2).token;
    ASSERT_EQ(a, b) << "draw " << i;
    seen.insert(a);
    history.push_back(a);
    h2.push_back(b);
  }
  EXPECT_GT(seen.size(), 2u);  // it does sample, not argmax
  // Another seed draws another sequence.
  p.seed = 43;
  sampler other(p);
  std::vector<int32_t> h3 = {1, 2, 3}, h4 = {1, 2, 3};
  sampling_params same_as_before;
  same_as_before.temperature = p.temperature;
  same_as_before.seed = 42;
  sampler again(same_as_before);
  int differ = 0;
  for (int i = 0; i < 20; ++i) {
    const int32_t a = other.sample(logits, h3).token, b = again.sample(logits, h4).token;
    differ += a != b;
    h3.push_back(a);
    h4.push_back(b);
  }
  EXPECT_GT(differ, 0);
}

TEST(SamplerState, UniformDrawsCoverTheUnitInterval) {
  double lo = 1, hi = 0, sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = seeded_uniform(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    lo = std::min(lo, u), hi = std::max(hi, u), sum += u;
  }
  EXPECT_LT(lo, 0.01);
  EXPECT_GT(hi, 0.99);
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace troupe
