// What the libFuzzer harnesses (tests/fuzz, docs/fuzzing.md) found, one
// test per bug with its input inline, and the seed corpus checked to stay
// valid (the GGUF and KV blob seeds must open, or the fuzzers would start
// from refused files only; the regress_* seeds are the findings' inputs).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/common/json_depth.hpp"
#include "runtime/engine/kv_blob.hpp"
#include "runtime/model/gguf_reader.hpp"
#include "runtime/model/model_file.hpp"
#include "runtime/text/json_schema_regex.hpp"
#include "tools/client/openai_api.hpp"

namespace troupe {
namespace {

using ojson = nlohmann::ordered_json;

std::string nested_arrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

const std::filesystem::path k_corpus =
    std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/fuzz/corpus";

// fuzz_kv_blob: a 6-byte blob whose first byte claims an array of
// 0x24ffffa9 elements made msgpack allocate 17 GB (24 bytes per element)
// before reading any of them; a peer could send it as a migration blob.
TEST(FuzzFindings, KvBlobClaimingHugeCountsIsRefusedWithoutAllocating) {
  const std::vector<uint8_t> oom = {0xdd, 0x24, 0xff, 0xff, 0xa9, 0x64};
  EXPECT_THROW(decode_kv_blob(oom), kv_blob_error);
  // A map of 2^32-1 entries, a str32 and a bin32 longer than the blob.
  for (const std::vector<uint8_t>& bad :
       {std::vector<uint8_t>{0xdf, 0xff, 0xff, 0xff, 0xff},
        std::vector<uint8_t>{0x96, 0xdb, 0xff, 0xff, 0xff, 0xf0, 0x61},
        std::vector<uint8_t>{0x96, 0xc6, 0x7f, 0xff, 0xff, 0xff, 0x00}})
    EXPECT_THROW(decode_kv_blob(bad), kv_blob_error);
  // Deeper than a blob ever nests.
  const std::vector<uint8_t> deep(100000, 0x91);
  EXPECT_THROW(decode_kv_blob(deep), kv_blob_error);
}

// fuzz_json_schema: size keywords of the wrong type threw nlohmann's
// type_error (not schema_error), and a float out of int's range was
// converted to int (undefined behaviour).
TEST(FuzzFindings, SchemaSizeKeywordsOfAnyTypeGiveSchemaError) {
  for (const char* bad :
       {R"({"type":"string","minLength":"a"})", R"({"type":"string","maxLength":1e300})",
        R"({"type":"string","maxLength":-1})", R"({"type":"string","minLength":2.5})",
        R"({"type":"array","minItems":1e20})", R"({"type":"array","maxItems":[3]})",
        R"({"type":"array","minItems":4294967296})"})
    EXPECT_THROW(schema_regex(ojson::parse(bad)), schema_error) << bad;
  // Whole numbers written as floats still count, as before.
  EXPECT_EQ(schema_regex(ojson::parse(R"({"type":"string","minLength":2.0,"maxLength":3})")),
            schema_regex(ojson::parse(R"({"type":"string","minLength":2,"maxLength":3})")));
}

// fuzz_json_schema (CI, seed 1): a minLength or minItems above 10000
// became a repeat count that regex_dfa refuses with a syntax error, not a
// schema error naming the keyword.
TEST(FuzzFindings, SchemaSizeKeywordsAboveTheRepeatLimitGiveSchemaError) {
  for (const char* bad :
       {R"({"type":"string","minLength":20000})", R"({"type":"string","maxLength":10001})",
        R"({"type":"array","items":{"type":"integer"},"minItems":20001})",
        R"({"type":"array","maxItems":1e5})"}) {
    try {
      schema_regex(ojson::parse(bad));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const schema_error& e) {
      EXPECT_NE(std::string(e.what()).find("above 10000 is not supported"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(schema_regex(ojson::parse(R"({"type":"array","maxItems":10000})")));
}

// fuzz_json_schema: a schema nested 100000 deep overflowed the stack in
// nlohmann's recursive copy (`items`) and dump (`const`).
TEST(FuzzFindings, DeeplyNestedSchemaIsRefused) {
  const std::string deep = nested_arrays(100000);
  for (const std::string& body : {R"({"type":"array","items":)" + deep + "}",
                                  R"({"const":)" + deep + "}", R"({"enum":[)" + deep + "]}"})
    EXPECT_THROW(schema_regex(ojson::parse(body)), schema_error);
  EXPECT_NO_THROW(schema_regex(ojson::parse(R"({"const":)" + nested_arrays(40) + "}")));
}

// fuzz_json_schema: a 919-byte schema whose "type" lists "array" six times
// at each of 12 levels built a regex of 6^12 copies (the harness ran out of
// 2 GB); the regex is now bounded as it grows.
TEST(FuzzFindings, SchemaWhoseRegexExplodesIsRefusedQuickly) {
  ojson s = {{"type", "integer"}};
  for (int i = 0; i < 12; ++i)
    s = ojson{{"type", {"array", "array", "array", "array", "array", "array"}}, {"items", s}};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(schema_regex(s), schema_error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// fuzz_json_schema: a "pattern" regex_dfa cannot read let its regex_error
// out of schema_regex, whose error channel is schema_error.
TEST(FuzzFindings, SchemaPatternThatIsNotARegexGivesSchemaError) {
  EXPECT_THROW(schema_regex(ojson::parse(R"({"type":"string","pattern":"[A-Z]{:}-[0-9]+"})")),
               schema_error);
  EXPECT_THROW(schema_regex(ojson::parse(R"({"type":"string","pattern":"(a"})")), schema_error);
  EXPECT_NO_THROW(schema_regex(ojson::parse(R"({"type":"string","pattern":"^[A-Z]{2}$"})")));
}

// fuzz_openai_request: a content part or a response_format whose "type" is
// not a string threw nlohmann's type_error out of parse (value("type", "")).
TEST(FuzzFindings, OpenAiTypeFieldsOfAnyTypeGiveAnApiError) {
  openai::call c;
  auto e = openai::parse(ojson::parse(R"({"messages":[{"role":"user","content":[{"type":1}]}]})"),
                         true, "m", c);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages");
  e = openai::parse(ojson::parse(R"({"prompt":"x","response_format":{"type":1}})"), false, "m", c);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "response_format");
  // Unchanged: text parts still read.
  EXPECT_FALSE(openai::parse(
      ojson::parse(R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})"),
      true, "m", c));
}

// fuzz_openai_request: a body nested 100000 deep overflowed the stack in
// nlohmann's recursive dump (the error message quoting "max_tokens").
TEST(FuzzFindings, DeeplyNestedOpenAiBodyIsRefused) {
  openai::call c;
  for (const char* key : {"max_tokens", "response_format", "guided_json", "prompt"}) {
    const auto body = ojson::parse(std::string(R"({"prompt":"x","messages":[],")") + key + R"(":)" +
                                   nested_arrays(100000) + "}");
    auto e = openai::parse(body, false, "m", c);
    ASSERT_TRUE(e) << key;
    EXPECT_EQ(e->status, 400);
    EXPECT_NE(e->message.find("levels deep"), std::string::npos) << e->message;
  }
}

// fuzz_gguf: model_file::open of an empty file passed mmap's nullptr to
// memcpy (undefined even for 0 bytes; UBSan reported it).
TEST(FuzzFindings, EmptyModelFileIsAModelError) {
  const auto path = std::filesystem::temp_directory_path() / "troupe_fuzz_empty.gguf";
  std::ofstream(path).close();
  EXPECT_THROW(model_file::open(path.string()), model_error);
  std::filesystem::remove(path);
}

TEST(FuzzFindings, SeedCorpusOpens) {
  for (const char* name : {"llama_spm.gguf", "qwen2_bpe.gguf"})
    EXPECT_NO_THROW(gguf_file::open((k_corpus / "gguf" / name).string())) << name;
  for (const auto& entry : std::filesystem::directory_iterator(k_corpus / "kv_blob")) {
    if (entry.path().filename().string().rfind("regress_", 0) == 0) continue;  // the findings
    const std::string bytes = read_file(entry.path());
    const std::vector<uint8_t> blob(bytes.begin(), bytes.end());
    EXPECT_NO_THROW(decode_kv_blob(blob)) << entry.path();
  }
}

// A hostile-client probe: {"a": <100000 levels>, "b": 1} overflowed the
// stack inside ordered_json's parser (its object's vector, grown for "b",
// copied "a" recursively), one HTTP request ending `troupe serve`.  The
// text is now measured before it is parsed.
TEST(FuzzFindings, DeepValueBeforeAnotherMemberIsRefusedBeforeParsing) {
  const std::string deep = nested_arrays(100000);
  const std::string text = R"({"a":)" + deep + R"(,"b":1})";
  EXPECT_TRUE(json_text_nests_deeper(text, 100));
  EXPECT_TRUE(parse_json_within<ojson>(text, 100).is_discarded());
  // Brackets in strings, escaped quotes among them, do not count.
  const std::string in_string = R"({"s":"[[[[\"[[[[","t":[1]})";
  EXPECT_FALSE(json_text_nests_deeper(in_string, 2));
  EXPECT_TRUE(json_text_nests_deeper(R"({"t":[[1]]})", 2));
  EXPECT_EQ(parse_json_within<ojson>(in_string, 2)["s"], "[[[[\"[[[[");
  // Never stricter than the check on the parsed value.
  for (int depth : {1, 2, 5, 40}) {
    const auto v = ojson::parse(nested_arrays(static_cast<size_t>(depth)));
    EXPECT_EQ(json_text_nests_deeper(nested_arrays(static_cast<size_t>(depth)), depth), false);
    EXPECT_EQ(json_nests_deeper(v, depth), false);
  }
  // Tool-call arguments are client text, parsed the same way.
  openai::call c;
  const auto body = ojson::parse(
      R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"",)"
      R"("tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":)" +
      ojson(text).dump() + R"(}}]}]})");
  auto e = openai::parse(body, true, "m", c);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
}

}  // namespace
}  // namespace troupe
