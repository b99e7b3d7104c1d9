#pragma once
// A regular-expression constraint over a model's tokens (issue 13,
// structured output): which tokens may come next in each state of the
// regex's DFA, computed once per state from the tokens' bytes and kept.
// A token is allowed when all its bytes continue a possible match; an
// end-of-generation token only where the output may end.
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/text/regex_dfa.hpp"

namespace troupe {

// The most bytes of token masks one constraint keeps cached.
inline constexpr size_t k_mask_budget_bytes = size_t{128} << 20;

class token_constraint {
 public:
  // Throws regex_error for a pattern it cannot use.
  token_constraint(const std::string& regex,
                   std::shared_ptr<const std::vector<std::string>> token_bytes,
                   std::vector<int32_t> eog_tokens, size_t mask_budget = k_mask_budget_bytes);

  int start() const { return dfa_.start(); }
  // 1 where the token may come next in `state`.
  const std::vector<uint8_t>& allowed(int state);
  // The same, for a sequence that may generate at most `tokens_left` more
  // tokens, this one included: only tokens after which the match can
  // still be completed (one byte a token at worst) and the end token fit
  // in what is left, so the output closes before max_tokens cuts it
  // (json_object's unbounded strings included).  Where none fit, the
  // tokens that come nearest to the end.
  const std::vector<uint8_t>& allowed(int state, int32_t tokens_left);
  // The state after `token`, or -1 when it was not allowed.
  int advance(int state, int32_t token);
  // The state after a whole token sequence (an imported or recovered
  // sequence's generated tokens), or -1.
  int replay(const std::vector<int32_t>& tokens);
  bool may_end(int state) const { return state >= 0 && dfa_.accepting(state); }
  bool is_end(int32_t token) const;
  // A new request follows it (regex_dfa::renew_work_budget); whether it
  // passed a budget and must be built anew.
  void renew_work_budget() { dfa_.renew_work_budget(); }
  bool exhausted() const { return dfa_.exhausted(); }
  // Bytes it holds, about: its automaton and the token masks it cached.
  size_t footprint_bytes() const { return dfa_.footprint_bytes() + mask_bytes(); }
  size_t mask_bytes() const { return (masks_.size() + 3 * closing_.size()) * bytes_->size(); }

 private:
  regex_dfa dfa_;
  std::shared_ptr<const std::vector<std::string>> bytes_;
  std::vector<int32_t> eog_;
  size_t mask_budget_;
  std::unordered_map<int, std::vector<uint8_t>> masks_;
  // Per state, for the last tokens of a budget: each allowed token's bytes
  // to the end after it (k_far beyond), its largest, and the last budget
  // mask made (reused while the budget stays the same).
  static constexpr uint16_t k_far = UINT16_MAX;
  struct closing {
    std::vector<uint16_t> after;
    int32_t most = 0;
    int32_t budget = INT32_MIN;  // (room may be negative: none made yet)
    std::vector<uint8_t> mask;
  };
  std::unordered_map<int, closing> closing_;
};

}  // namespace troupe
