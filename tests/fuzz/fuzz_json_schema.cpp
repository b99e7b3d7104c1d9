// Structured output (runtime/text/json_schema_regex): the input, parsed as JSON
// (non-JSON is discarded), is a response_format JSON schema; schema_regex's
// regex is then compiled by regex_dfa, as the request actor does.  An
// array of strings is also tried as guided_choice.  schema_error is
// schema_regex's error channel; from regex_dfa only its limits (pattern too
// large, too many states, nested too deeply) may refuse what schema_regex
// wrote: a syntax error there is a finding (bad escaping).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/common/json_depth.hpp"
#include "runtime/text/json_schema_regex.hpp"
#include "runtime/text/regex_dfa.hpp"

namespace {

bool is_limit(const troupe::regex_error& e) {
  const std::string what = e.what();
  return what.find("too large") != std::string::npos ||
         what.find("too many states") != std::string::npos ||
         what.find("nested deeper") != std::string::npos;
}

void compile(const std::string& pattern) {
  try {
    troupe::regex_dfa dfa(pattern);
    int state = dfa.start();
    for (const char c : std::string("{\"a\":[1,\"x\"]}")) {
      state = dfa.step(state, static_cast<uint8_t>(c));
      if (state < 0) break;
    }
  } catch (const troupe::regex_error& e) {
    if (!is_limit(e)) {
      std::fprintf(stderr, "regex_dfa refused schema output: %s\n", e.what());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As a guided_json schema is parsed (actors/generate_check): bounded first.
  const auto schema = troupe::parse_json_within<nlohmann::ordered_json>(
      std::string_view(reinterpret_cast<const char*>(data), size), troupe::k_max_schema_text_depth);
  if (schema.is_discarded()) return 0;
  try {
    compile(troupe::schema_regex(schema));
  } catch (const troupe::schema_error&) {
  }
  if (schema.is_array()) {
    std::vector<std::string> choices;
    for (const auto& c : schema)
      if (c.is_string()) choices.push_back(c.get<std::string>());
    try {
      compile(troupe::choice_regex(choices));
    } catch (const troupe::schema_error&) {
    }
  }
  return 0;
}
