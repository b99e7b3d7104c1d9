#pragma once
// Structured output (issue 13) as a regular expression over the output's
// bytes (runtime/text/regex_dfa): a JSON schema, a JSON object of any shape, or
// one of a list of choices.  The JSON is compact (no whitespace between
// tokens) and an object's properties come in the schema's order, all of
// them.  Supported: type (one or a list), properties, items, minItems,
// maxItems, enum, const, minLength, maxLength, anyOf / oneOf (as
// alternatives), local $ref into $defs / definitions (recursive ones unroll
// to the depth limit), a string's format (date, time, date-time, uuid,
// email) or pattern (one whose strings need no JSON escapes), and the
// string, integer, number, boolean, null, array and object types; title,
// description, required, additionalProperties, default, examples,
// $schema, $id and $comment are accepted and have no effect.  Anything
// else (allOf, not, remote $refs, other formats, ...) is refused with an
// error naming it.
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

struct schema_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// How deeply a schema's text may nest before it is parsed at all
// (json_text_nests_deeper: a deep value copied while parsing overflowed the
// stack); schema_regex refuses deeper than 64 after.
constexpr int k_max_schema_text_depth = 100;

std::string schema_regex(const nlohmann::ordered_json& schema);

// Any JSON object (response_format json_object), nested two levels deep.
std::string json_object_regex();

// Exactly one of the choices.
std::string choice_regex(const std::vector<std::string>& choices);

}  // namespace troupe
