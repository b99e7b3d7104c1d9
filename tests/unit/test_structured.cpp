// Structured output (issue 13): the byte-level regex DFA, JSON schemas and
// choices as regexes, and the token mask built from a vocabulary's bytes.
// A random walk over the tokens the mask allows must always find a token
// and always end in a valid output.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "runtime/text/json_schema_regex.hpp"
#include "runtime/text/regex_dfa.hpp"
#include "runtime/text/token_constraint.hpp"

namespace troupe {
namespace {

bool matches(regex_dfa& d, const std::string& s) {
  const int st = d.step(d.start(), s);
  return st >= 0 && d.accepting(st);
}

TEST(RegexDfa, MatchesWholeOutputsOnly) {
  regex_dfa phone(R"(\([0-9]{3}\) [0-9]{3}-[0-9]{4})");
  EXPECT_TRUE(matches(phone, "(123) 456-7890"));
  EXPECT_FALSE(matches(phone, "(123) 456-789"));
  EXPECT_FALSE(matches(phone, "(123) 456-78901"));
  regex_dfa words("(cat|dog)s?|[^a-z]+");
  EXPECT_TRUE(matches(words, "dogs"));
  EXPECT_TRUE(matches(words, "cat"));
  EXPECT_TRUE(matches(words, "42!"));
  EXPECT_FALSE(matches(words, "cow"));
  regex_dfa classes(R"(\d+\.\w*\s?\x41{2,})");
  EXPECT_TRUE(matches(classes, "12.ab_ AAA"));
  EXPECT_FALSE(matches(classes, "12.ab_ A"));
  for (const char* bad : {"(ab", "a{3,1}", "*a", "[b-a]", "^a", R"(\q)"})
    EXPECT_THROW(regex_dfa{bad}, regex_error) << bad;
}

// Classes, '.', and quantifiers are of characters, not bytes (a probe got
// "áěěěě" from [一-鿿]{3,10}, "中\xe4" from 中{2}, and invalid UTF-8 from '.'):
// every text a pattern accepts is valid UTF-8 whose characters it names.
TEST(RegexDfa, ClassesAndQuantifiersTakeWholeCharacters) {
  regex_dfa han("[一-鿿]{3,10}");
  EXPECT_TRUE(matches(han, "中文字"));
  EXPECT_TRUE(matches(han, "中文字中文字中文字中"));
  EXPECT_FALSE(matches(han, "中文"));
  EXPECT_FALSE(matches(han, "áěěěě"));
  EXPECT_FALSE(matches(han, "中文\xe5\xad"));  // a character cut short
  regex_dfa twice("中{2}");
  EXPECT_TRUE(matches(twice, "中中"));
  EXPECT_FALSE(matches(twice, "中\xad"));
  EXPECT_FALSE(matches(twice, "中"));
  regex_dfa cyrillic("[а-я]{2,8}");
  EXPECT_TRUE(matches(cyrillic, "привет"));
  EXPECT_FALSE(matches(cyrillic, "еѰ"));  // U+0470 is past я (U+044F)
  regex_dfa any(".{2}");
  EXPECT_TRUE(matches(any, "aé"));
  EXPECT_TRUE(matches(any, "😀中"));
  EXPECT_FALSE(matches(any, "\xc3\xa9\xff"));
  EXPECT_FALSE(matches(any, "a\xc3"));
  EXPECT_FALSE(matches(any, "\xed\xa0\x80\x41"));  // a surrogate's encoding
  EXPECT_FALSE(matches(any, "a\n"));
  regex_dfa not_quote(R"([^"a]+)");
  EXPECT_TRUE(matches(not_quote, "bé😀"));
  EXPECT_FALSE(matches(not_quote, "b\x80"));
  EXPECT_FALSE(matches(not_quote, "ba"));
  regex_dfa not_digit(R"(\D\W)");
  EXPECT_TRUE(matches(not_digit, "é!"));
  EXPECT_FALSE(matches(not_digit, "\xc3!"));
  // Every range's UTF-8 sequences, at the encoded lengths' edges.
  regex_dfa edges("[\u007f-\u0080][\u07ff-\u0800][\uffff-\U00010000][\U0010fffe-\U0010ffff]");
  EXPECT_TRUE(matches(edges, "\u007f\u07ff\uffff\U0010fffe"));
  EXPECT_TRUE(matches(edges, "\u0080\u0800\U00010000\U0010ffff"));
  EXPECT_FALSE(matches(edges, "\u0081\u0800\U00010000\U0010ffff"));
  // \x80-\xff stay bytes where written so (the schema's own UTF-8 rules).
  regex_dfa bytes(R"([\xc2-\xdf][\x80-\xbf])");
  EXPECT_TRUE(matches(bytes, "é"));
  for (const char* bad : {"[^\\x80]", "[é-\\xff]", "\xff", "[\xc3]"})
    EXPECT_THROW(regex_dfa{bad}, regex_error) << bad;
}

// Issue 31: 50,000 nested groups, or a byte under 100,000 stacked
// quantifiers, overflowed the stack (the server died with SIGSEGV).  Now a
// regex_error names the limit, and the depth just under it still compiles.
TEST(RegexDfa, DeepNestingIsRefusedNamingTheLimit) {
  auto message = [](const std::string& pattern) {
    try {
      regex_dfa d(pattern);
    } catch (const regex_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string limit = "nested deeper than " + std::to_string(k_regex_max_depth);
  const std::string groups = std::string(50000, '(') + "a" + std::string(50000, ')');
  EXPECT_NE(message(groups).find(limit), std::string::npos) << message(groups).substr(0, 200);
  EXPECT_LT(message(groups).size(), 300u) << "the error quotes the pattern's start only";
  const std::string stars = "a" + std::string(100000, '*');
  EXPECT_NE(message(stars).find(limit), std::string::npos);
  const std::string mixed = std::string(20000, '(') + "a" + std::string(20000, ')');
  EXPECT_NE(message(mixed).find(limit), std::string::npos);
  const int ok = k_regex_max_depth;
  regex_dfa deepest(std::string(size_t(ok), '(') + "ab" + std::string(size_t(ok), ')'));
  EXPECT_TRUE(matches(deepest, "ab"));
  regex_dfa stacked("a" + std::string(size_t(ok), '?'));
  EXPECT_TRUE(matches(stacked, "a"));
  EXPECT_TRUE(matches(stacked, ""));
  EXPECT_NE(message(std::string(size_t(ok) + 1, '(') + "a" + std::string(size_t(ok) + 1, ')'))
                .find(limit),
            std::string::npos);
}

// A pattern whose language is empty can never be met: refused at compile
// time, not by the engine mid-request.
TEST(RegexDfa, APatternMatchingNothingIsRefused) {
  for (const char* empty : {R"([^\s\S])", R"(a[^\s\S]b)", R"(([^\s\S])+)"})
    EXPECT_THROW(regex_dfa{empty}, regex_error) << empty;
  // An empty class under '*' or '?' still lets the empty string through.
  regex_dfa optional(R"(a[^\s\S]*)");
  EXPECT_TRUE(matches(optional, "a"));
}

// A short pattern whose DFA states each hold thousands of NFA states
// (a probe's `((.?){100}){100}` took 4 GB and a minute for three tokens)
// is refused once it passes the budgets, and lets go of what it built; a
// long but cheap one is followed to its end.
TEST(RegexDfa, AnAutomatonPastItsBudgetIsRefusedAndLetGo) {
  regex_dfa costly("(.*[a-m].{12}|((.?){100}){100})");
  std::string why;
  size_t peak = 0;
  try {
    for (int i = 0; i < 5000; ++i) {
      int st = costly.start();
      for (int n = 0; n < 64 && st >= 0; ++n) st = costly.step(st, uint8_t('a' + (i * 7 + n) % 26));
      peak = std::max(peak, costly.footprint_bytes());
    }
  } catch (const regex_error& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("too complex"), std::string::npos) << why;
  EXPECT_LE(peak, 2 * sizeof(int) * k_regex_max_entries + (64u << 20));
  EXPECT_TRUE(costly.exhausted());
  EXPECT_THROW(costly.step(costly.start(), uint8_t('a')), regex_error);

  regex_dfa bounded(".{0,3000}");
  EXPECT_TRUE(matches(bounded, std::string(3000, 'x')));
  EXPECT_FALSE(matches(bounded, std::string(3001, 'x')));
  // In a schema, the request check's smaller work budget refuses it at once.
  std::string schema_why;
  try {
    schema_regex(nlohmann::ordered_json::parse(
        R"j({"type":"string","pattern":"^([a-z]*[a-m][a-z]{8}|(([a-z]?){50}){20})"})j"));
  } catch (const schema_error& e) {
    schema_why = e.what();
  }
  EXPECT_NE(schema_why.find(std::to_string(k_regex_max_work / 5) + " steps"), std::string::npos)
      << schema_why;
}

TEST(JsonSchemaRegex, AcceptsValidAndRefusesInvalidJson) {
  auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
      "pet": {"type": "object", "properties": {"kind": {"const": "cat"}, "ok": {"type": "boolean"}}},
      "note": {"type": ["string", "null"]}
    }})");
  regex_dfa d(schema_regex(schema));
  EXPECT_TRUE(matches(
      d,
      R"({"name":"Al","age":-3,"score":1.5e3,"tags":["a","b"],"pet":{"kind":"cat","ok":true},"note":null})"));
  EXPECT_TRUE(matches(
      d,
      R"({"name":"","age":0,"score":2,"tags":[],"pet":{"kind":"cat","ok":false},"note":"x\"y"})"));
  // Order, lengths, enums and types are enforced.
  EXPECT_FALSE(matches(d, R"({"age":1,"name":"Al"})"));
  EXPECT_FALSE(matches(
      d,
      R"({"name":"123456789","age":1,"score":1,"tags":[],"pet":{"kind":"cat","ok":true},"note":null})"));
  EXPECT_FALSE(matches(
      d,
      R"({"name":"A","age":1.5,"score":1,"tags":[],"pet":{"kind":"cat","ok":true},"note":null})"));
  EXPECT_FALSE(matches(
      d,
      R"({"name":"A","age":1,"score":1,"tags":["c"],"pet":{"kind":"cat","ok":true},"note":null})"));
  EXPECT_FALSE(matches(
      d,
      R"({"name":"A","age":01,"score":1,"tags":[],"pet":{"kind":"cat","ok":true},"note":null})"));
  for (const char* unsupported :
       {R"({"type":"string","pattern":"a\"+"})", R"({"$ref":"#/x"})", R"({"allOf":[]})",
        R"({"type":"string","format":"ipv6"})", R"({"$ref":"https://x.example/s.json"})"}) {
    try {
      schema_regex(nlohmann::ordered_json::parse(unsupported));
      ADD_FAILURE() << unsupported << " was accepted";
    } catch (const schema_error& e) {
      const std::string key =
          nlohmann::ordered_json::parse(unsupported).items().begin().key() == "type"
              ? std::next(nlohmann::ordered_json::parse(unsupported).items().begin()).key()
              : nlohmann::ordered_json::parse(unsupported).items().begin().key();
      EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
    }
  }
  regex_dfa obj(json_object_regex());
  EXPECT_TRUE(matches(obj, R"({"a":1,"b":{"c":"d"},"e":[1,"x",null]})"));
  EXPECT_TRUE(matches(obj, "{}"));
  EXPECT_FALSE(matches(obj, "[1]"));
  regex_dfa choice(choice_regex({"yes", "no", "a.b"}));
  EXPECT_TRUE(matches(choice, "a.b"));
  EXPECT_FALSE(matches(choice, "axb"));
  EXPECT_FALSE(matches(choice, "yesno"));
}

// Issue 34: what pydantic's nested models and constrained strings emit.
TEST(JsonSchemaRegex, RefsFormatsAndPatterns) {
  // Nested models as $defs, a list of them, and an optional one.
  auto schema = nlohmann::ordered_json::parse(R"({
    "$defs": {
      "Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "born": {"type": "string", "format": "date"}}},
      "Id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}
    },
    "type": "object",
    "properties": {
      "id": {"$ref": "#/$defs/Id"},
      "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}, "maxItems": 2},
      "best": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
      "key": {"type": "string", "format": "uuid"},
      "mail": {"type": "string", "format": "email"},
      "at": {"type": "string", "format": "date-time"},
      "code": {"type": "string", "pattern": "x[0-9]+"}
    }})");
  regex_dfa d(schema_regex(schema));
  const std::string tail =
      R"("key":"123e4567-e89b-12d3-a456-426614174000","mail":"a.b@c.org","at":"2026-11-26T10:00:00Z","code":"ax12y"})";
  EXPECT_TRUE(matches(
      d, R"({"id":"AB-123","pets":[{"kind":"cat","born":"2020-02-29"}],"best":null,)" + tail));
  EXPECT_TRUE(
      matches(d, R"({"id":"ZZ-000","pets":[],"best":{"kind":"dog","born":"1999-12-31"},)" + tail));
  EXPECT_FALSE(matches(d, R"({"id":"AB-12","pets":[],"best":null,)" + tail));    // pattern
  EXPECT_FALSE(matches(d, R"({"id":"xAB-123","pets":[],"best":null,)" + tail));  // anchored
  EXPECT_FALSE(matches(
      d, R"({"id":"AB-123","pets":[{"kind":"cat","born":"2020-13-01"}],"best":null,)" + tail));
  // An unanchored pattern may have any characters around its match.
  auto code = [&](const std::string& c) {
    return R"({"id":"AB-123","pets":[],"best":null,"key":"123e4567-e89b-12d3-a456-426614174000","mail":"a@b.io","at":"2026-11-26T10:00:00+01:00","code":")" +
           c + "\"}";
  };
  EXPECT_TRUE(matches(d, code("x1")));
  EXPECT_FALSE(matches(d, code("no digits")));
  // A recursive model unrolls to the depth limit; deeper is refused by name.
  auto tree = nlohmann::ordered_json::parse(R"({
    "$defs": {"Node": {"type": "object", "properties": {
      "v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 1}}}},
    "$ref": "#/$defs/Node"})");
  regex_dfa t(schema_regex(tree));
  EXPECT_TRUE(matches(t, R"({"v":1,"kids":[{"v":2,"kids":[]}]})"));
  auto branching = nlohmann::ordered_json::parse(R"({
    "$defs": {"N": {"type": "object", "properties": {
      "l": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]},
      "r": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}}}},
    "$ref": "#/$defs/N"})");
  // Two recursive branches a level: bounded by the depth and the regex's
  // size, compiled or refused, never unbounded.
  try {
    regex_dfa b(schema_regex(branching));
    EXPECT_TRUE(matches(b, R"({"l":{"l":null,"r":null},"r":null})"));
  } catch (const std::invalid_argument& e) {
    SUCCEED() << e.what();
  }
  auto endless = nlohmann::ordered_json::parse(R"({
    "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
    "$ref": "#/$defs/N"})");
  EXPECT_THROW(schema_regex(endless), schema_error);  // no finite instance at all
  // Patterns whose strings would need JSON escapes, and lengths beside a
  // pattern, are refused rather than producing invalid JSON.
  for (const char* bad :
       {R"({"type":"string","pattern":"^.*$"})", R"({"type":"string","pattern":"^[^a]$"})",
        R"({"type":"string","pattern":"^a$","maxLength":3})"})
    EXPECT_THROW(schema_regex(nlohmann::ordered_json::parse(bad)), schema_error) << bad;
  // Lists that admit nothing are refused, not compiled to an empty match.
  for (const char* none : {R"({"type":[]})", R"({"enum":[]})", R"({"anyOf":[]})"})
    EXPECT_THROW(schema_regex(nlohmann::ordered_json::parse(none)), schema_error) << none;
}

// A vocabulary of every single byte, some longer pieces, a control token
// with no bytes, and an end token.
std::shared_ptr<std::vector<std::string>> vocabulary() {
  auto v = std::make_shared<std::vector<std::string>>();
  for (int b = 0; b < 256; ++b) v->push_back(std::string(1, char(b)));
  for (const char* piece : {"{\"", "\":", "\",\"", "true", "false", "null", "name", "12", "\"}",
                            "ab", "cat", "},", "\"a\"", "[\"", "\"]"})
    v->push_back(piece);
  v->push_back("");  // a control token
  v->push_back("");  // the end token
  return v;
}

TEST(TokenConstraint, TheMaskNeverRemovesEveryTokenAndWalksEndValid) {
  auto vocab = vocabulary();
  const int32_t end = int32_t(vocab->size() - 1);
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6},
      "n": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "cat"]}, "maxItems": 2},
      "ok": {"type": "boolean"}}})");
  for (const std::string& pattern :
       {schema_regex(schema), json_object_regex(), choice_regex({"yes", "no"}),
        std::string(R"(\([0-9]{3}\) [0-9]{3}-[0-9]{4})")}) {
    // The second time with room for four masks: those cached are dropped
    // and made again as the walks come back to their states.
    for (const size_t budget : {k_mask_budget_bytes, 4 * vocab->size()}) {
      token_constraint c(pattern, vocab, {end}, budget);
      regex_dfa check(pattern);
      std::mt19937 rng(7);
      for (int walk = 0; walk < 200; ++walk) {
        int state = c.start();
        std::string out;
        bool ended = false;
        for (int step = 0; step < 400 && !ended; ++step) {
          const auto& allow = c.allowed(state);
          std::vector<int32_t> ok;
          for (size_t t = 0; t < allow.size(); ++t)
            if (allow[t]) ok.push_back(int32_t(t));
          ASSERT_FALSE(ok.empty()) << "no token allowed after '" << out << "' for " << pattern;
          EXPECT_FALSE(allow[vocab->size() - 2]) << "a control token was allowed";
          // Prefer to go on, so walks reach deep states; end when asked to.
          int32_t t = ok[rng() % ok.size()];
          if (c.may_end(state) && rng() % 4 == 0) t = end;
          if (t == end) {
            ASSERT_TRUE(c.may_end(state));
            ended = true;
            break;
          }
          out += (*vocab)[size_t(t)];
          state = c.advance(state, t);
          ASSERT_GE(state, 0);
        }
        if (!ended) continue;  // a long walk: fine, it was valid at every step
        EXPECT_TRUE(matches(check, out)) << out;
        if (pattern == schema_regex(schema) || pattern == json_object_regex()) {
          EXPECT_FALSE(nlohmann::json::parse(out, nullptr, false).is_discarded()) << out;
        }
      }
      EXPECT_LE(c.mask_bytes(), budget) << pattern;
    }
  }
  token_constraint c(choice_regex({"yes", "no"}), vocab, {end});
  EXPECT_EQ(c.replay({int32_t('n'), int32_t('o')}) >= 0, true);
  EXPECT_LT(c.replay({int32_t('x')}), 0);
}

TEST(RegexDfa, BytesToEndAreTheShortestCompletion) {
  regex_dfa d(R"(\{"a":"[a-z]*"(,"bc":[0-9]+)?\})");
  int s = d.start();
  EXPECT_EQ(d.bytes_to_end(s), 8);  // {"a":""}
  s = d.step(s, std::string(R"({"a":"xyz)"));
  EXPECT_EQ(d.bytes_to_end(s), 2);  // "}
  s = d.step(s, std::string(R"(","bc":)"));
  EXPECT_EQ(d.bytes_to_end(s), 2);  // 1}
  s = d.step(s, std::string("7}"));
  EXPECT_TRUE(d.accepting(s));
  EXPECT_EQ(d.bytes_to_end(s), 0);
  EXPECT_EQ(d.bytes_to_end(-1), regex_dfa::k_unreachable);
}

// Where the output may end, only tokens whose completion still fits are
// offered: the end token always does.
TEST(TokenConstraint, AtTheBudgetsEndOnlyWhatFitsIsOffered) {
  auto vocab = vocabulary();
  const int32_t end = int32_t(vocab->size() - 1);
  token_constraint c("ab|abcde", vocab, {end});
  const int s = c.replay({int32_t('a'), int32_t('b')});
  ASSERT_TRUE(c.may_end(s));
  for (const auto& [left, c_allowed] :
       std::vector<std::pair<int32_t, bool>>{{1, false}, {2, false}, {3, false}, {4, true}}) {
    const auto& allow = c.allowed(s, left);
    EXPECT_TRUE(allow[size_t(end)]) << left;
    // After 'c', "de" and the end need 3 more tokens.
    EXPECT_EQ(bool(allow[size_t('c')]), c_allowed) << left;
  }
  // Where it may not end yet and nothing fits, the nearest way on is kept.
  const int a = c.replay({int32_t('a')});
  EXPECT_TRUE(c.allowed(a, 1)[size_t('b')]);
}

// With a token budget, a walk that prefers to go on (the way a model fills
// a JSON string until max_tokens) still closes: every walk ends valid
// within its budget, for json_object and a schema with unbounded strings.
TEST(TokenConstraint, ABudgetClosesTheOutputBeforeItEnds) {
  auto vocab = vocabulary();
  const int32_t end = int32_t(vocab->size() - 1);
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"name": {"type": "string"},
          "items": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "items"]})");
  for (const std::string& pattern : {json_object_regex(), schema_regex(schema)}) {
    token_constraint c(pattern, vocab, {end});
    regex_dfa check(pattern);
    std::mt19937 rng(11);
    for (const int32_t budget : {24, 32, 48, 64}) {  // the schema's shortest output: 22 bytes
      for (int walk = 0; walk < 40; ++walk) {
        int state = c.start();
        std::string out;
        bool ended = false;
        for (int32_t used = 0; used < budget && !ended; ++used) {
          const auto& allow = c.allowed(state, budget - used);
          std::vector<int32_t> ok;
          for (size_t t = 0; t < allow.size(); ++t)
            if (allow[t] && int32_t(t) != end) ok.push_back(int32_t(t));
          // Never end early: go on while anything but the end is allowed.
          if (ok.empty()) {
            ASSERT_TRUE(allow[size_t(end)]) << "nothing allowed after '" << out << "'";
            ended = true;
            break;
          }
          const int32_t t = ok[rng() % ok.size()];
          out += (*vocab)[size_t(t)];
          state = c.advance(state, t);
          ASSERT_GE(state, 0);
        }
        EXPECT_TRUE(ended) << "budget " << budget << " ran out at '" << out << "'";
        EXPECT_TRUE(matches(check, out)) << out;
        EXPECT_FALSE(nlohmann::json::parse(out, nullptr, false).is_discarded()) << out;
      }
    }
  }
}

}  // namespace
}  // namespace troupe
