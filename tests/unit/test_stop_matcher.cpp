// Stop strings over streamed text deltas (runtime/text/stop_matcher.hpp): matches
// that span deltas, overlapping stops, non-ASCII stops, and a randomized run
// checking that any split of a text into deltas gives the same output as
// matching on the whole text.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/text/stop_matcher.hpp"
#include "runtime/text/unicode.hpp"

namespace troupe {
namespace {

struct outcome {
  std::string text;
  bool stopped = false;
  std::string matched;
  bool operator==(const outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const outcome& o) {
  return os << "{\"" << o.text << "\", " << (o.stopped ? "stopped on \"" + o.matched + "\"" : "")
            << "}";
}

// The specification on a whole text: the first prefix of the text that
// contains a stop string ends with one; the longest stop ending there wins
// and the output is what precedes it.
outcome match_whole(std::string_view text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    const std::string* best = nullptr;
    for (const auto& s : stops)
      if (s.size() <= end && text.substr(end - s.size(), s.size()) == s &&
          (best == nullptr || s.size() > best->size()))
        best = &s;
    if (best != nullptr) return {std::string(text.substr(0, end - best->size())), true, *best};
  }
  return {std::string(text), false, ""};
}

// Streams the deltas through a matcher (flushing at the end unless stopped).
outcome match_stream(const std::vector<std::string>& deltas,
                     const std::vector<std::string>& stops) {
  stop_matcher m(stops);
  outcome o;
  for (const auto& d : deltas) {
    auto r = m.push(d);
    o.text += r.emit;
    if (r.stopped) {
      o.stopped = true;
      o.matched = r.matched;
      return o;
    }
  }
  o.text += m.flush();
  return o;
}

TEST(StopMatcher, RefusesEmptyStopStrings) {
  EXPECT_THROW(stop_matcher({""}), std::invalid_argument);
  EXPECT_THROW(stop_matcher({"END", ""}), std::invalid_argument);
  EXPECT_NO_THROW(stop_matcher({}));
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  stop_matcher m({});
  auto r = m.push("hello");
  EXPECT_EQ(r.emit, "hello");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.push("").emit, "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopInsideOneDelta) {
  stop_matcher m({"END"});
  auto r = m.push("Hello END world");
  EXPECT_EQ(r.emit, "Hello ");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "END");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, TextThatCannotStartAStopIsEmittedAtOnce) {
  stop_matcher m({"END"});
  auto r = m.push("Hello world");
  EXPECT_EQ(r.emit, "Hello world");
  EXPECT_EQ(m.pending_bytes(), 0u);
  r = m.push(" E");
  EXPECT_EQ(r.emit, " ");
  EXPECT_EQ(m.pending_bytes(), 1u);
  r = m.push("N");
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(m.pending_bytes(), 2u);
  // A false alarm: the held-back text comes out with the next delta.
  r = m.push("Xs");
  EXPECT_EQ(r.emit, "ENXs");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.pending_bytes(), 0u);
}

TEST(StopMatcher, StopSpanningManyDeltas) {
  stop_matcher m({"<|im_end|>"});
  const std::vector<std::pair<std::string, std::string>> steps = {
      {"The answer<", "The answer"}, {"|", ""}, {"im", ""}, {"_e", ""}, {"nd", ""}};
  for (const auto& [delta, emit] : steps) {
    auto r = m.push(delta);
    EXPECT_EQ(r.emit, emit) << delta;
    EXPECT_FALSE(r.stopped) << delta;
  }
  auto r = m.push("|>\nmore");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "<|im_end|>");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  stop_matcher m({"###"});
  auto r = m.push("###tail");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "###");

  stop_matcher m2({"###"});
  EXPECT_EQ(m2.push("#").emit, "");
  EXPECT_EQ(m2.push("#").emit, "");
  r = m2.push("#");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcher, AfterStoppingNothingMoreComesOut) {
  stop_matcher m({"x"});
  EXPECT_TRUE(m.push("abxcd").stopped);
  auto r = m.push("more text");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "x");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FlushReturnsHeldBackText) {
  stop_matcher m({"END"});
  EXPECT_EQ(m.push("hi EN").emit, "hi ");
  EXPECT_EQ(m.flush(), "EN");
  EXPECT_EQ(m.pending_bytes(), 0u);
  EXPECT_FALSE(m.stopped());
  // The matcher goes on afterwards.
  auto r = m.push("xEND");
  EXPECT_EQ(r.emit, "x");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcher, RepeatedPrefixCharacters) {
  // "aaab" against "aab": after each "a" at most two can still be a start.
  stop_matcher m({"aab"});
  EXPECT_EQ(m.push("a").emit, "");
  EXPECT_EQ(m.push("a").emit, "");
  EXPECT_EQ(m.push("a").emit, "a");
  EXPECT_EQ(m.pending_bytes(), 2u);
  auto r = m.push("b");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(match_stream({"a", "a", "a", "b"}, {"aab"}), (outcome{"a", true, "aab"}));
}

TEST(StopMatcher, OverlappingStops) {
  const std::vector<std::string> stops = {"ab", "abc", "bc"};
  // "ab" completes first, even though "abc" might follow.
  EXPECT_EQ(match_stream({"xab"}, stops), (outcome{"x", true, "ab"}));
  EXPECT_EQ(match_stream({"xa", "bc"}, stops), (outcome{"x", true, "ab"}));
  EXPECT_EQ(match_stream({"xb", "c"}, stops), (outcome{"x", true, "bc"}));
  EXPECT_EQ(match_stream({"xa", "c"}, stops), (outcome{"xac", false, ""}));
  // Several stops ending at the same place: the longest one.
  EXPECT_EQ(match_stream({"xa", "bc"}, {"bc", "abc"}), (outcome{"x", true, "abc"}));
  EXPECT_EQ(match_stream({"xabc"}, {"c", "bc", "abc"}), (outcome{"x", true, "abc"}));
  // A stop inside a longer one ends first.
  EXPECT_EQ(match_stream({"xa", "b", "c"}, {"abc", "b"}), (outcome{"xa", true, "b"}));
  // Holding back: "a" may start "ab"/"abc"; "b" may start "bc".
  stop_matcher m(stops);
  auto r = m.push("za");
  EXPECT_EQ(r.emit, "z");
  EXPECT_EQ(m.pending_bytes(), 1u);
  r = m.push("zb");
  EXPECT_EQ(r.emit, "az");
  EXPECT_EQ(m.pending_bytes(), 1u);
  r = m.push("z");
  EXPECT_EQ(r.emit, "bz");
  EXPECT_EQ(m.pending_bytes(), 0u);
}

TEST(StopMatcher, NonAsciiStops) {
  // U+672C U+8A9E, three bytes each.
  stop_matcher m({"\u672c\u8a9e", "\U0001F6D1"});
  auto r = m.push("\u65e5\u672c");
  EXPECT_EQ(r.emit, "\u65e5");
  EXPECT_EQ(m.pending_bytes(), 3u);
  r = m.push("\u8a9e\u3067\u3059");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "\u672c\u8a9e");

  EXPECT_EQ(match_stream({"caf\u00e9 ", "\U0001F6D1", " x"}, {"\U0001F6D1"}),
            (outcome{"caf\u00e9 ", true, "\U0001F6D1"}));
  // Sharing a lead byte with a stop is not a prefix of it.
  EXPECT_EQ(match_stream({"\u00e9", "\u00e8"}, {"\u00e9t\u00e9"}),
            (outcome{"\u00e9\u00e8", false, ""}));
  EXPECT_EQ(match_stream({"\u00e9", "t", "\u00e9!"}, {"\u00e9t\u00e9"}),
            (outcome{"", true, "\u00e9t\u00e9"}));
}

// Longest tail of text that is a proper prefix of some stop.
size_t longest_partial(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const auto& s : stops)
    for (size_t len = 1; len < s.size() && len <= text.size(); ++len)
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len))
        best = std::max(best, len);
  return best;
}

TEST(StopMatcher, RandomSplitsMatchWholeText) {
  // Characters of 1 to 4 bytes, few enough that stops occur often.
  const std::vector<std::string> alphabet = {"a", "b", "c", "\u00e9", "\u20ac", "\U0001F600"};
  std::mt19937 rng(1234);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int stopped_count = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::string> stops(pick(1, 4));
    for (auto& s : stops) {
      const int len = pick(1, 5);
      for (int i = 0; i < len; ++i) s += alphabet[pick(0, int(alphabet.size()) - 1)];
    }
    std::vector<std::string> chars(pick(0, 40));
    for (auto& c : chars) c = alphabet[pick(0, iter % 2 ? 2 : int(alphabet.size()) - 1)];
    std::string text;
    for (const auto& c : chars) text += c;

    // Random deltas of whole characters (as the incremental decoder gives),
    // empty deltas included.
    std::vector<std::string> deltas;
    for (size_t i = 0; i < chars.size();) {
      const size_t n = std::min<size_t>(pick(0, 4), chars.size() - i);
      std::string d;
      for (size_t j = 0; j < n; ++j) d += chars[i + j];
      deltas.push_back(d);
      i += n;
    }

    const outcome want = match_whole(text, stops);
    stop_matcher m(stops);
    outcome got;
    std::string seen;  // text pushed so far
    for (const auto& d : deltas) {
      seen += d;
      auto r = m.push(d);
      ASSERT_TRUE(unicode::is_valid_utf8(r.emit));
      got.text += r.emit;
      if (r.stopped) {
        got.stopped = true;
        got.matched = r.matched;
        break;
      }
      // Only what could still start a stop string is held back.
      ASSERT_EQ(m.pending_bytes(), longest_partial(seen, stops)) << seen;
      ASSERT_EQ(got.text.size() + m.pending_bytes(), seen.size());
    }
    if (!got.stopped) got.text += m.flush();
    ASSERT_EQ(got, want) << "text \"" << text << "\" iteration " << iter;
    stopped_count += got.stopped;
  }
  // Both outcomes are well represented.
  EXPECT_GT(stopped_count, 4000);
  EXPECT_LT(stopped_count, 16000);
}

}  // namespace
}  // namespace troupe
