#pragma once
// A small Jinja interpreter for the chat templates models ship
// (`tokenizer.chat_template`), for the templates whose family
// chat_template.cpp does not recognise.  It covers what chat templates
// use, with the environment Hugging Face renders them in (trim_blocks and
// lstrip_blocks on):
//   - text, {{ expr }}, {% stmt %}, {# comment #}, whitespace control (-);
//   - if / elif / else, for (tuple targets, loop.index/index0/first/last/
//     length/revindex, an inline `if` filter, for-else, break, continue),
//     set (names, namespace attributes, set blocks), filter blocks, macros,
//     generation;
//   - literals (strings, numbers, true/false/none, lists, dicts), names,
//     attributes, subscripts and slices, calls, the operators of Jinja
//     (+ - * / // % **, ~, comparisons, in / not in, and / or / not,
//     x if c else y);
//   - filters trim, length/count, upper, lower, capitalize, title, tojson,
//     string, int, float, abs, round, first, last, join, default/d, items,
//     list, reverse, replace, safe, selectattr, rejectattr, map(attribute=),
//     unique, sort, indent; tests defined, undefined, none, string, number,
//     integer, float, boolean, mapping, iterable, sequence, true, false,
//     odd, even, equalto/eq/==, ne, in;
//   - functions raise_exception, namespace, range, dict, strftime_now, and
//     string / dict / list methods (strip, lstrip, rstrip, split,
//     startswith, endswith, upper, lower, replace, title, find, format
//     with plain fields, get, items, keys, values, append).
// Anything else fails with a std::runtime_error naming the line: a
// template is run exactly or refused, never approximated.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace troupe::jinja {

using value = nlohmann::ordered_json;

struct node;

class program {
 public:
  // Parses a template; throws std::runtime_error("jinja: line N: ...").
  explicit program(const std::string& source);
  // Renders it with the variables of `context` (an object); throws
  // std::runtime_error for an error at run time, raise_exception included.
  std::string render(const value& context) const;

 private:
  std::shared_ptr<const node> body_;
};

}  // namespace troupe::jinja
