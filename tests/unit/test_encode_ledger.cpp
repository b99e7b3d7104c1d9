// The vision encoder's books (runtime/vision/encode_ledger): the queue
// bound, withdrawals of ended requests' images, and the cache of recent
// encodes by image bytes.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "runtime/vision/encode_ledger.hpp"

using namespace troupe;

namespace {
// n distinct image keys starting at `first`.
std::vector<size_t> keys(size_t first, size_t n) {
  std::vector<size_t> k;
  for (size_t i = 0; i < n; ++i) k.push_back(first + i);
  return k;
}
}  // namespace

TEST(EncodeLedger, DistinctImagesPastTheBoundAreRefusedAndTakingFreesRoom) {
  encode_ledger books(4, 1 << 20);
  EXPECT_TRUE(books.admit(1, keys(100, 3)));
  EXPECT_FALSE(books.admit(2, keys(200, 2)));  // 3 + 2 > 4
  EXPECT_TRUE(books.admit(2, keys(200, 1)));
  EXPECT_EQ(books.snapshot().distinct, 4);
  EXPECT_EQ(books.snapshot().refused, 1u);
  // The same images again (the n choices of one request): free.
  EXPECT_TRUE(books.admit(3, keys(100, 3)));
  EXPECT_TRUE(books.admit(4, {200, 200, 200}));
  EXPECT_EQ(books.snapshot().waiting, 10);
  EXPECT_EQ(books.snapshot().distinct, 4);
  EXPECT_TRUE(books.take(1));
  EXPECT_EQ(books.snapshot().distinct, 4);  // image 100 still waits for request 3
  EXPECT_TRUE(books.take(3));
  EXPECT_EQ(books.snapshot().distinct, 3);
  EXPECT_TRUE(books.admit(5, keys(300, 1)));  // room again
  EXPECT_TRUE(books.admit(6, {}));
  // A cached image does not count either.
  books.remember("cached image", std::vector<float>(4, 1.f));
  EXPECT_TRUE(books.admit(7, {encode_ledger::key("cached image")}));
  EXPECT_FALSE(books.admit(8, keys(400, 1)));
}

TEST(EncodeLedger, AWithdrawnRequestsWaitingImagesAreSkipped) {
  encode_ledger books(16, 0);
  ASSERT_TRUE(books.admit(7, keys(1, 3)));
  ASSERT_TRUE(books.admit(8, keys(10, 1)));
  EXPECT_TRUE(books.take(7));  // taken before the request ended: encoded
  books.withdraw(7);
  books.withdraw(99);  // never admitted: nothing
  EXPECT_FALSE(books.take(7));
  EXPECT_FALSE(books.take(7));
  EXPECT_TRUE(books.take(8));
  const auto s = books.snapshot();
  EXPECT_EQ(s.skipped, 2u);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.distinct, 0);
  // The id may come again (a new request): its images are wanted.
  ASSERT_TRUE(books.admit(7, keys(1, 1)));
  EXPECT_TRUE(books.take(7));
}

TEST(EncodeLedger, TheCacheAnswersTheSameBytesAndDropsTheLeastRecentPastItsBudget) {
  // Each entry: 100 bytes of image + 25 floats = 200 bytes; room for 2.
  encode_ledger books(16, 450);
  const std::string a(100, 'a'), b(100, 'b'), c(100, 'c');
  const std::vector<float> ra(25, 1.f), rb(25, 2.f), rc(25, 3.f);
  EXPECT_FALSE(books.cached(a));
  books.remember(a, ra);
  books.remember(b, rb);
  ASSERT_TRUE(books.cached(a));  // a is now the most recent
  EXPECT_EQ(*books.cached(a), ra);
  books.remember(c, rc);  // past the budget: b, the least recent, goes
  EXPECT_FALSE(books.cached(b));
  EXPECT_EQ(*books.cached(c), rc);
  EXPECT_EQ(*books.cached(a), ra);
  // Same size, one byte different: not a hit.
  std::string a2 = a;
  a2[50] = 'x';
  EXPECT_FALSE(books.cached(a2));
  const auto s = books.snapshot();
  EXPECT_EQ(s.cache_bytes, 400u);
  EXPECT_EQ(s.encoded, 3u);
  EXPECT_EQ(s.cache_hits, 4u);
  // An entry over the whole budget is not kept; a budget of 0 keeps none.
  books.remember(std::string(1000, 'z'), ra);
  EXPECT_FALSE(books.cached(std::string(1000, 'z')));
  encode_ledger none(16, 0);
  none.remember(a, ra);
  EXPECT_FALSE(none.cached(a));
}

TEST(EncodeLedger, RequestsAndTheEncoderMayUseItFromSeveralThreads) {
  encode_ledger books(1 << 20, 1 << 20);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const uint64_t owner = t * 10000 + i;
        ASSERT_TRUE(books.admit(owner, {owner * 2, owner * 2 + 1}));
        if (i % 3 == 0) books.withdraw(owner);
        books.take(owner);
        books.take(owner);
        const std::string img(16, static_cast<char>('a' + i % 7));
        if (!books.cached(img)) books.remember(img, std::vector<float>(4, 1.f));
      }
    });
  for (auto& t : ts) t.join();
  const auto s = books.snapshot();
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.distinct, 0);
  EXPECT_EQ(s.skipped, 4u * 2 * 667);
  EXPECT_LE(s.cache_bytes, 7u * (16 + 16));
}
