#pragma once
// A byte-level regular expression as a DFA, for constrained decoding
// (issue 13, structured output): the whole output must match.  The NFA is
// Thompson's; the DFA is built lazily (a state is a set of NFA states,
// made the first time a byte leads there), so only the states generation
// visits are ever built.
//
// The syntax: literals; escapes \xHH \d \w \s \D \W \S \n \t \r and \ before any
// punctuation; classes [a-z_] and [^"\\]; . (any byte but \n); groups
// ( ) and (?: ); alternation |; quantifiers * + ? {m} {m,} {m,n}.  No
// anchors (the match is always whole), no backreferences, no lookaround.
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

struct regex_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// How deeply groups and quantifiers may nest (a regex_error names it).
inline constexpr int k_regex_max_depth = 256;
// The largest count a {m,n} repeat may name.
inline constexpr int k_regex_max_repeat = 10000;
// The most NFA states a pattern may compile to.
inline constexpr size_t k_regex_max_nfa_states = 200000;
// What following a pattern may cost, past which it is refused as too
// complex (a regex_error) and the DFA lets go of what it built: the NFA
// states its DFA states hold, summed, over its life (its memory: a short
// pattern such as `((.?){100}){100}` made sets of thousands of NFA states
// each, 4 GB for three tokens), and the steps of building them since the
// last renew_work_budget() (its time, on the thread that asks: the
// engine's for one request, or a request check's).
inline constexpr size_t k_regex_max_entries = 2'000'000;
inline constexpr uint64_t k_regex_max_work = 300'000'000;

class regex_dfa {
 public:
  // Throws regex_error naming what it cannot read, when the pattern is
  // too large (max_nfa_states) or nested too deeply (k_regex_max_depth),
  // and when it matches no text at all.
  explicit regex_dfa(const std::string& pattern, size_t max_nfa_states = k_regex_max_nfa_states,
                     uint64_t max_work = k_regex_max_work);

  int start() const { return 0; }
  // The state after `byte`, or -1: no match can continue.
  int step(int state, uint8_t byte);
  int step(int state, const std::string& bytes);  // -1 when any byte is dead
  bool accepting(int state) const { return accept_.at(size_t(state)); }
  // True when no byte continues from `state` (only the end may follow).
  bool final(int state);
  // The fewest bytes that complete a match from `state` (0 where it is
  // accepting; k_unreachable where none can), for closing an output
  // before its token budget runs out.
  int32_t bytes_to_end(int state) const;
  // The largest finite bytes_to_end of any state: a budget at least this
  // large never needs closing.
  int32_t longest_completion() const { return longest_; }
  static constexpr int32_t k_unreachable = INT32_MAX;
  size_t states() const { return sets_.size(); }
  // A new request follows it: the work budget counts from here.  (What
  // it built stays, within the memory budget.)
  void renew_work_budget() { work_ = 0; }
  // Past a budget: it must be built anew.
  bool exhausted() const { return exhausted_; }
  // Bytes its built states hold, about (sets, their index, transitions).
  size_t footprint_bytes() const {
    return entries_ * 2 * sizeof(int) + next_.size() * sizeof(next_[0]);
  }

 private:
  struct nfa_state {
    // Byte transitions: [lo, hi] -> to.
    std::vector<std::array<int, 3>> edges;
    std::vector<int> eps;
  };
  std::vector<nfa_state> nfa_;
  int nfa_start_ = 0, nfa_accept_ = 0;
  std::vector<int32_t> nfa_to_end_;  // per NFA state: the fewest bytes to the accept state
  int32_t longest_ = 0;
  std::vector<int32_t> to_end_;  // per DFA state: bytes_to_end
  size_t max_states_;
  uint64_t max_work_;
  size_t entries_ = 0;      // NFA states held by the DFA's states, summed
  uint64_t work_ = 0;       // steps spent building DFA states and transitions
  bool exhausted_ = false;  // past a budget: every further step throws
  std::vector<uint32_t> seen_;  // closure's marks: stamp_ where seen this call
  uint32_t stamp_ = 0;

  std::vector<std::vector<int>> sets_;      // DFA state -> sorted NFA states
  std::vector<std::array<int, 256>> next_;  // -2: not built yet
  std::vector<bool> accept_;
  std::map<std::vector<int>, int> ids_;

  int dfa_state(std::vector<int> set);
  bool accept_reachable() const;
  void measure_to_end();
  void closure(std::vector<int>& set);
  [[noreturn]] void too_complex();

  friend struct regex_parser;
};

// A regex matching exactly the literal text.
std::string regex_escape(const std::string& text);

}  // namespace troupe
