// The Jinja interpreter (runtime/text/jinja) on the constructs chat
// templates use, each against what Jinja2 (with Hugging Face's trim_blocks
// and lstrip_blocks) renders; real models' templates against llama.cpp's
// renderings are in test_chat_template.cpp.
#include <gtest/gtest.h>

#include "runtime/text/jinja.hpp"

namespace troupe {
namespace {

using jinja::value;

std::string render(const std::string& source, const value& ctx = value::object()) {
  return jinja::program(source).render(ctx);
}

std::string error_of(const std::string& source, const value& ctx = value::object()) {
  try {
    render(source, ctx);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, TextOutputsAndLiterals) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("{{ 'a' + \"b\" ~ 3 }}"), "ab3");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 3 }}"),
            "7 3 1 3.5 8");
  EXPECT_EQ(render("{{ true }} {{ none }} {{ [1, 'x'] }} {{ {'k': 1} }} {{ 1.0 }}"),
            "True None [1, 'x'] {'k': 1} 1.0");
  EXPECT_EQ(render("{{ undefined_name }}|"), "|");
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}{{ 'c' if not x }}", {{"x", false}}), "bc");
  EXPECT_EQ(render("{# a comment #}x"), "x");
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // blanks before a block tag on its own line go.
  EXPECT_EQ(render("{% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("x {%- if true -%} y {%- endif -%} z"), "xyz");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // expressions keep their newline
  EXPECT_EQ(render("{{ '}}' }}"), "}}");              // a closer inside a string is text
}

TEST(Jinja, LoopsAndLoopVariables) {
  const value ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}"
                   "{% endfor %}",
                   ctx),
            "1a,2b,3c");
  EXPECT_EQ(
      render("{% for x in xs if x != 'b' %}{{ loop.index0 }}/{{ loop.length }}{% endfor %}", ctx),
      "0/21/2");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(
      render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", ctx),
      "a");
  EXPECT_EQ(render("{% for x in xs[::-1] %}{{ x }}{% endfor %}{{ xs[1:] }}{{ xs[-1] }}", ctx),
            "cba['b', 'c']c");
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}"), "012");
}

TEST(Jinja, PrecedenceAndLoopScopesAsJinja2) {
  EXPECT_EQ(render("{{ 'Turn ' + 1 ~ ':' }}"), "Turn 1:");  // ~ binds tighter than +
  // A set in a loop body starts from the outer value on every pass.
  EXPECT_EQ(render("{% set x = 0 %}{% for m in [1, 2, 3] %}{% set x = x + 1 %}{{ x }}{% endfor %}"),
            "111");
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
}

TEST(Jinja, SetNamespacesAndScopes) {
  // A set inside a loop stays in the loop; a namespace carries it out.
  EXPECT_EQ(render("{% set n = 0 %}{% for x in [1, 2] %}{% set n = n + x %}{% endfor %}{{ n }}"),
            "0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}"
                   "{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set s %}in {{ 'block' }}{% endset %}[{{ s }}]"), "[in block]");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(render("{{ '  hi  ' | trim }}|{{ 'ab' | upper }}|{{ [1, 2] | length }}"), "hi|AB|2");
  EXPECT_EQ(render("{{ {'a': [1, 'x'], 'b': none} | tojson }}"),
            "{\"a\": [1, \"x\"], \"b\": null}");
  EXPECT_EQ(render("{{ {'a': 1} | tojson(indent=2) }}"), "{\n  \"a\": 1\n}");
  EXPECT_EQ(render("{{ ['a', 'b'] | join(', ') }}|{{ x | default('d') }}|{{ [3, 1] | first }}"),
            "a, b|d|3");
  const value msgs = {
      {"messages", {{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "u"}}}}};
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content')"
                   " | list }}",
                   msgs),
            "['u']");
  EXPECT_EQ(render("{{ x is defined }}{{ x is not none }}{{ 'a' is string }}{{ 3 is odd }}"
                   "{{ {} is mapping }}{{ 'b' in 'abc' }}{{ 'z' not in ['a'] }}"),
            "FalseTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith('ab') }}|"
                   "{{ {'k': 1}.get('k') }}{{ {'k': 1}.get('z', 9) }}|{{ 'Hi'.lower() }}"),
            "a b|['a', 'b']|True|19|hi");
}

// Integer dictionary keys, as ByteDance Seed-OSS's template builds and reads
// them: they stay integers in loops, lookups, `in`, repr and dictsort, and
// tojson writes them as text (Python's json.dumps); insertion order is kept.
TEST(Jinja, IntegerDictionaryKeys) {
  const std::string gears = "{% set g = {512: 128, 0: 0, 'x': 1} %}";
  EXPECT_EQ(render(gears + "{{ g[512] }}{{ g[0] }}{{ g['512'] is defined }}{{ g.get(7, 9) }}"),
            "1280False9");
  EXPECT_EQ(render(gears + "{{ 512 in g }}{{ '512' in g }}{{ g }}"),
            "TrueFalse{512: 128, 0: 0, 'x': 1}");
  EXPECT_EQ(render("{% set g = {16: 'b', 2: 'a'} %}{% for k, v in g | dictsort %}"
                   "{{ k + 1 }}{{ v }}{% endfor %}|{% for k in g %}{{ k * 2 }},{% endfor %}|"
                   "{{ g.keys() | list }}|{{ g | tojson }}"),
            "3a17b|32,4,|[16, 2]|{\"16\": \"b\", \"2\": \"a\"}");
  // The first gear at or above a budget, as the template finds it.
  EXPECT_EQ(render("{% set g = {0: 0, 512: 128, 1024: 256} %}{% set ns = namespace(i=none) %}"
                   "{% for k, v in g | dictsort %}{% if ns.i is none and b <= k %}"
                   "{% set ns.i = v %}{% endif %}{% endfor %}{{ ns.i }}",
                   {{"b", 600}}),
            "256");
}

// Filter blocks (Jinja2's {% filter %}: the body's text through the
// filters) and Python's str.format with plain fields, as firefunction-v2's
// and Hunyuan 3's templates use them; a format spec is refused.
TEST(Jinja, FilterBlocksAndStrFormat) {
  EXPECT_EQ(render("{% filter trim %}\n  a {{ x }}  \n{% endfilter %}|", {{"x", 1}}), "a 1|");
  EXPECT_EQ(render("{% set s %}{% filter upper | replace('B', 'b') %}ab{% endfilter %}{% endset %}"
                   "[{{ s }}]"),
            "[Ab]");
  EXPECT_EQ(render("{% filter indent(2) %}x\ny{% endfilter %}"), "x\n  y");
  // The body has a scope of its own (Jinja2's): its sets stay inside.
  EXPECT_EQ(render("{% set y = 1 %}{% filter trim %}{% set y = 2 %}{{ y }}{% endfilter %}{{ y }}"),
            "21");
  EXPECT_EQ(render("{{ '{}|'.format(nosuch) }}"), "|");  // Undefined formats as ""
  EXPECT_EQ(render("{{ '<{}|{}>'.format('a', 2) }} {{ '{1}{0}{0}'.format('x', 'y') }} "
                   "{{ '{{{n}}}'.format(n='k') }} {{ '{}'.format([1]) }}"),
            "<a|2> yxx {k} [1]");
  EXPECT_NE(error_of("{{ '{:>4}'.format(1) }}").find("only {}, {N} and {name}"), std::string::npos);
  EXPECT_NE(error_of("{{ '{}{}'.format(1) }}").find("too few arguments"), std::string::npos);
  EXPECT_NE(error_of("{{ '{}{0}'.format(1) }}").find("mixed"), std::string::npos);
  EXPECT_NE(error_of("{{ '{'.format(1) }}").find("unclosed"), std::string::npos);
  EXPECT_NE(error_of("{{ '}'.format(1) }}").find("single '}'"), std::string::npos);
  EXPECT_NE(error_of("{{ '{n}'.format(m=1) }}").find("no argument named 'n'"), std::string::npos);
  EXPECT_NE(error_of("{% filter nosuch %}x{% endfilter %}").find("unsupported filter 'nosuch'"),
            std::string::npos);
  EXPECT_NE(error_of("{% filter trim %}x").find("line 1"), std::string::npos);  // never closed
}

TEST(Jinja, MacrosAndRaiseException) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('Ann') }} {{ greet('Bo', punct='?') }}"),
            "Hi Ann! Hi Bo?");
  EXPECT_NE(error_of("{{ raise_exception('roles must alternate') }}").find("roles must alternate"),
            std::string::npos);
}

TEST(Jinja, ErrorsNameTheLine) {
  EXPECT_NE(error_of("ok\n{% if x %}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{{ 'open }}").find("never closed"), std::string::npos);
  EXPECT_NE(error_of("{% while x %}x{% endwhile %}").find("unsupported statement 'while'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("unsupported filter 'nosuchfilter'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{% for x in 3 %}{% endfor %}").find("not iterable"), std::string::npos);
}

// A template is the model file's, but a hostile one must not crash or
// hang the server: nesting, recursion, chains and sizes are bounded.
TEST(Jinja, HostileTemplatesAreRefusedNotCrashed) {
  // Found by a review: filters on filters inside recursing macros, values
  // nested or doubled without end, a wrapping slice step, a wrapping
  // repetition, a loop that never ends, a huge indent.
  std::string filters;
  for (int i = 0; i < 2000; ++i) filters += "|string";
  EXPECT_NE(error_of("{% macro m() %}{{ m()" + filters + " }}{% endmacro %}{{ m() }}")
                .find("nested deeper than 256"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                     "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}")
                .find("nested deeper than 64"),
            std::string::npos);
  EXPECT_NE(error_of("{% set x = [] %}{% for i in range(40) %}{% set _ = x.append(x) %}"
                     "{% endfor %}")
                .find("over a million values"),
            std::string::npos);
  EXPECT_EQ(render("{{ 'ab'[1::9223372036854775807] }}"), "b");
  EXPECT_NE(error_of("{{ 'abcd' * 4611686018427387904 }}").find("16 MiB"), std::string::npos);
  EXPECT_EQ(render("{{ '' * 9223372036854775807 }}"), "");
  EXPECT_NE(error_of("{% for a in range(1000000) %}{% for b in range(1000000) %}{% endfor %}"
                     "{% endfor %}")
                .find("2 million steps"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [[1]] | tojson(indent=1000000000) }}").find("indent outside 0..64"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}")
                .find("nested deeper than 200"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '-') + "1 }}").find("over 4096 tokens"),
            std::string::npos);
  EXPECT_NE(
      error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("nested deeper than 256"),
      std::string::npos);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if 1 %}";
  EXPECT_NE(error_of(ifs).find("blocks nested deeper than 200"), std::string::npos);
  EXPECT_NE(error_of("{{ 'ab' * 100000000000 }}").find("over 16 MiB"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(1000000000000) %}{% endfor %}").find("over a million"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}").find("16 MiB"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe
