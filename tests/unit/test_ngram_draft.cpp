// Prompt-lookup drafting (runtime/engine/ngram_draft): what follows the latest
// earlier occurrence of the longest matching suffix.
#include <gtest/gtest.h>

#include "runtime/engine/ngram_draft.hpp"

namespace troupe {
namespace {

std::vector<int32_t> draft(const std::vector<int32_t>& t, int max_draft = 4, int max_ngram = 3) {
  return propose_ngram_draft(t, ngram_options{max_draft, max_ngram, 1});
}

TEST(NgramDraft, ProposesWhatFollowedTheSuffixBefore) {
  // ... 5 6 7 8 9 ... 5 6 -> 7 8 9 (cut at max_draft)
  EXPECT_EQ(draft({1, 5, 6, 7, 8, 9, 2, 5, 6}), (std::vector<int32_t>{7, 8, 9, 2}));
  EXPECT_EQ(draft({1, 5, 6, 7, 8, 9, 2, 5, 6}, 2), (std::vector<int32_t>{7, 8}));
}

TEST(NgramDraft, LongerSuffixesWinAndTheLatestOccurrenceFirst) {
  // Suffix "3 4": occurs twice, followed by 9 (earlier) and by 7 (later).
  EXPECT_EQ(draft({3, 4, 9, 0, 3, 4, 7, 1, 3, 4}, 1), (std::vector<int32_t>{7}));
  // "2 4" matches only once as a 2-gram; "4" alone matches later (-> 8),
  // but the longer match is preferred (-> 5).
  EXPECT_EQ(draft({2, 4, 5, 4, 8, 2, 4}, 1), (std::vector<int32_t>{5}));
}

TEST(NgramDraft, NothingWhenNothingRepeatsOrWhenOff) {
  EXPECT_TRUE(draft({1, 2, 3, 4, 5}).empty());
  EXPECT_TRUE(draft({}).empty());
  EXPECT_TRUE(draft({7}).empty());
  EXPECT_TRUE(draft({1, 2, 1, 2}, 0).empty());
  // The draft ends where the tokens end: a match just before the suffix
  // proposes the suffix's own start.
  EXPECT_EQ(draft({9, 9}), (std::vector<int32_t>{9}));
}

}  // namespace
}  // namespace troupe
