#pragma once
// A regular-expression constraint over a model's tokens (issue 13,
// structured output): which tokens may come next in each state of the
// regex's DFA, computed once per state from the tokens' bytes and kept.
// A token is allowed when all its bytes continue a possible match; an
// end-of-generation token only where the output may end.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/text/regex_dfa.hpp"

namespace troupe {

class token_constraint {
 public:
  // Throws regex_error for a pattern it cannot use.
  token_constraint(const std::string& regex,
                   std::shared_ptr<const std::vector<std::string>> token_bytes,
                   std::vector<int32_t> eog_tokens);

  int start() const { return dfa_.start(); }
  // 1 where the token may come next in `state`.
  const std::vector<uint8_t>& allowed(int state);
  // The state after `token`, or -1 when it was not allowed.
  int advance(int state, int32_t token);
  // The state after a whole token sequence (an imported or recovered
  // sequence's generated tokens), or -1.
  int replay(const std::vector<int32_t>& tokens);
  bool may_end(int state) const { return state >= 0 && dfa_.accepting(state); }
  bool is_end(int32_t token) const;

 private:
  regex_dfa dfa_;
  std::shared_ptr<const std::vector<std::string>> bytes_;
  std::vector<int32_t> eog_;
  std::unordered_map<int, std::vector<uint8_t>> masks_;
};

}  // namespace troupe
