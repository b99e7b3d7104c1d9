#pragma once
// Stop strings over a stream of text deltas (the UTF-8 pieces an
// incremental_decoder returns).  A stop string may span any number of
// deltas; the matcher holds back only the tail of the text that could still
// be the start of a stop string and hands everything else out at once.
//
// Semantics, the same however the text is split into deltas: the stream
// stops at the first point where the text so far contains a stop string.
// The match is the stop string that ends there (the longest one if several
// do), and the output is the text before it; the stop string itself and
// anything after it are dropped.  The output therefore never contains a stop
// string.  Matching is on bytes; with valid UTF-8 stops and deltas every emit
// is valid UTF-8 (a stop can only begin on a character boundary).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class stop_matcher {
 public:
  // Throws std::invalid_argument if a stop string is empty.  No stops: every
  // delta passes straight through.
  explicit stop_matcher(std::vector<std::string> stops);

  struct result {
    std::string emit;      // text that is now certain to be output (possibly "")
    bool stopped = false;  // a stop string matched; the stream is over
    std::string matched;   // which one, when stopped
  };

  // Once stopped, further pushes emit nothing and report the same match.
  result push(std::string_view delta);
  // End of the stream without a match: the held-back text, which is then
  // output after all.  Empty once stopped.  The matcher is then empty and can
  // go on (held-back text is never matched against later deltas).
  std::string flush();

  bool stopped() const { return stopped_; }
  // Bytes held back as the possible start of a stop string.
  size_t pending_bytes() const { return held_.size(); }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a proper prefix of some stop string; contains no stop
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace troupe
