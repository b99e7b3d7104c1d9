// troupe::regex_dfa (runtime/text/regex_dfa): the input is a pattern, then the
// bytes after its first NUL (or the pattern's own first bytes) are stepped
// through the DFA.  regex_error is the documented error channel (syntax,
// size, depth, too many DFA states); anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/text/regex_dfa.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string pattern = input.substr(0, nul);
  const std::string text =
      nul == std::string::npos ? pattern.substr(0, 16) : input.substr(nul + 1, 64);
  try {
    troupe::regex_dfa dfa(pattern);
    int state = dfa.start();
    (void)dfa.accepting(state);
    for (const char c : text) {
      (void)dfa.final(state);
      state = dfa.step(state, static_cast<uint8_t>(c));
      if (state < 0) break;
      (void)dfa.accepting(state);
    }
    if (state >= 0) (void)dfa.step(dfa.start(), text);
  } catch (const troupe::regex_error&) {
  }
  return 0;
}
