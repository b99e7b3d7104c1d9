// Tokenizers against external truth: llama.cpp's token ids for stories15M
// (golden JSON) and SmolLM2 (ids from llama-tokenize pasted below), plus
// round trips, special tokens and the incremental decoder.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/model/model_file.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/text/incremental_decoder.hpp"
#include "runtime/text/tokenizer.hpp"
#include "runtime/text/unicode.hpp"

namespace troupe {
namespace {

using ids = std::vector<int32_t>;

// One tokenizer per model for the whole test binary.
const tokenizer& load_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const resolved_model r = resolve_model(name);  // throws with a fetch hint when absent
    const auto file = model_file::open(r.model_path, r.tokenizer_path);
    slot = tokenizer::create(file->vocab());
  }
  return *slot;
}

const tokenizer& stories() {
  return load_tokenizer("stories15m");
}
const tokenizer& smollm() {
  return load_tokenizer("smollm2-135m-instruct");
}

nlohmann::json golden_stories() {
  const std::string path =
      std::string(TROUPE_SOURCE_DIR) + "/../shared/golden/stories15M_greedy.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

std::string streamed(const tokenizer& tok, const ids& tokens, bool check_each = true) {
  incremental_decoder dec(tok);
  std::string all;
  for (int32_t id : tokens) {
    const std::string delta = dec.push(id);
    if (check_each) {
      EXPECT_TRUE(unicode::is_valid_utf8(delta)) << "token " << id;
    }
    all += delta;
  }
  all += dec.flush();
  return all;
}

// Random text mixing ASCII, spaces, newlines, Latin-1, CJK, emoji, digits.
std::string random_utf8(std::mt19937& rng, size_t n_chars, bool allow_sp_marker) {
  static const uint32_t ranges[][2] = {
      {0x20, 0x7E},     {0x20, 0x20},     {0x0A, 0x0A},       {0x09, 0x09},       {0x30, 0x39},
      {0xA0, 0x17F},    {0x370, 0x3FF},   {0x400, 0x4FF},     {0x600, 0x6FF},     {0x3000, 0x303F},
      {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F64F}, {0x1F900, 0x1F9FF}, {0x2000, 0x206F},
  };
  std::uniform_int_distribution<size_t> pick(0, std::size(ranges) - 1);
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    const auto& r = ranges[pick(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(r[0], r[1])(rng);
    if (!allow_sp_marker && cp == 0x2581) cp = 'x';
    unicode::append_utf8(s, cp);
  }
  return s;
}

// ---------------------------------------------------------------- stories15M

TEST(TokenizerStories, VocabularyShape) {
  const tokenizer& tok = stories();
  EXPECT_EQ(tok.model(), "llama");
  EXPECT_EQ(tok.n_vocab(), 32000);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.is_end_of_generation(2));
  EXPECT_FALSE(tok.is_end_of_generation(1));
  EXPECT_EQ(tok.token_id("▁Once"), 9038);
  EXPECT_EQ(tok.token_id("no such piece"), -1);
  EXPECT_EQ(tok.token_bytes(13), "\n");  // <0x0A>
  EXPECT_EQ(tok.token_bytes(9038), " Once");
  EXPECT_EQ(tok.token_bytes(1), "");  // BOS is a control token
}

TEST(TokenizerStories, GoldenPromptsEncodeExactly) {
  const tokenizer& tok = stories();
  const auto golden = golden_stories();
  ASSERT_FALSE(golden.empty());
  for (const auto& entry : golden) {
    const std::string prompt = entry.at("prompt");
    const ids expected = entry.at("prompt_token_ids").get<ids>();
    EXPECT_EQ(tok.encode(prompt, true, false), expected) << "prompt: " << prompt;
  }
}

TEST(TokenizerStories, GoldenGreedyTokensDecodeToText) {
  const tokenizer& tok = stories();
  for (const auto& entry : golden_stories()) {
    const ids tokens = entry.at("greedy_token_ids").get<ids>();
    const std::string text = entry.at("greedy_text");
    EXPECT_EQ(tok.decode(tokens), text);
    EXPECT_EQ(streamed(tok, tokens), text);
  }
}

TEST(TokenizerStories, ByteFallbackForCharactersWithoutPieces) {
  const tokenizer& tok = stories();
  // U+1F642 has no piece: four byte tokens <0xF0><0x9F><0x99><0x82> (ids 3 + byte).
  const ids got = tok.encode("🙂", false, false);
  ASSERT_GE(got.size(), 4u);
  const ids tail(got.end() - 4, got.end());
  EXPECT_EQ(tail, (ids{3 + 0xF0, 3 + 0x9F, 3 + 0x99, 3 + 0x82}));
  EXPECT_EQ(tok.decode(got), " 🙂");
}

TEST(TokenizerStories, RoundTripAddsOnlyTheSpacePrefix) {
  const tokenizer& tok = stories();
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const std::string s = random_utf8(rng, 1 + i % 40, false);
    EXPECT_EQ(tok.decode(tok.encode(s, true, false)), " " + s) << s;
  }
  EXPECT_EQ(tok.encode("", true, false), (ids{1}));
  EXPECT_EQ(tok.encode("", false, false), ids{});
}

TEST(TokenizerStories, SpecialTokensOnlyWhenParsed) {
  const tokenizer& tok = stories();
  const ids parsed = tok.encode("<s>Hi</s>", false, true);
  ASSERT_EQ(parsed.size(), 3u) << ::testing::PrintToString(parsed);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  // "Hi" after a special token gets the SentencePiece space prefix.
  EXPECT_EQ(parsed[1], tok.token_id("▁Hi"));
  const ids plain = tok.encode("<s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(tok.decode(plain), " <s>");
}

// ------------------------------------------------------------------- SmolLM2

struct smollm_case {
  std::string text;
  ids expected;
};

// llama-tokenize -m SmolLM2-135M-Instruct.Q4_1.gguf -f FILE --ids --no-bos --no-escape
const std::vector<smollm_case>& smollm_cases() {
  static const std::vector<smollm_case> cases = {
      {"Hello world", {19556, 905}},
      {"Hello, world! How are you today?", {19556, 28, 905, 17, 1073, 359, 346, 1834, 47}},
      {" leading space", {2899, 1898}},
      {"trailing space ", {4861, 4966, 1898, 216}},
      {"multiple   spaces   here", {30404, 256, 5600, 256, 1535}},
      {"   ", {333}},
      {"line one\nline two\n\nline four", {1311, 582, 198, 1311, 827, 198, 198, 1311, 1876}},
      {"\n\n\n", {16506}},
      {"12345", {33, 34, 35, 36, 37}},
      {"The year 2024 had 365 days.",
       {504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 37, 2009, 30}},
      {"don't I'll we're they've she'd it's I'm",
       {12420, 982, 339, 3060, 392, 2316, 502, 3543, 1041, 6737, 357, 506, 339, 5248}},
      {"DON'T 'quoted' 's", {52, 2154, 23, 68, 637, 385, 5036, 23, 637, 99}},
      {"Punctuation!?... (parens) [brackets] {braces} @#$%^&*",
       {64,   8859, 6584, 17,   47,  2026, 365,  7126, 5400, 25, 933, 6838, 936,
        1175, 77,   1662, 6838, 561, 109,  3394, 19,   20,   21, 78,  22,   26}},
      {"héllo wörld", {88, 2756, 31394, 267, 29989, 400}},
      {"你好，世界", {18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230}},
      {"🙂👍", {10813, 38887, 10813, 235, 231}},
      {"def add(a, b):\n    return a + b\n",
       {1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198}},
      {"\tTabbed\ttext", {197, 30064, 5776, 197, 2692}},
      {"Ünïcödé ñ ß Ω ж ع",
       {142, 246, 94, 25972, 83, 7466, 84, 2756, 5549, 126, 5549, 249, 5664, 119, 5470, 131,
        45704}},
      {"x  \n  y", {104, 256, 3805, 329}},
      {"½ ² ٣ Ⅻ", {16738, 216, 19133, 216, 164, 113, 216, 173, 223, 121}},
      {"a\u00A0b\u3000c", {81, 15442, 82, 12109, 218, 83}},
  };
  return cases;
}

TEST(TokenizerSmolLM2, VocabularyShape) {
  const tokenizer& tok = smollm();
  EXPECT_EQ(tok.model(), "gpt2");
  EXPECT_EQ(tok.n_vocab(), 49152);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.token_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok.token_id("<|im_start|>"), 1);
  EXPECT_EQ(tok.token_id("<|im_end|>"), 2);
  EXPECT_TRUE(tok.is_end_of_generation(0));
  EXPECT_TRUE(tok.is_end_of_generation(2));
  EXPECT_FALSE(tok.is_end_of_generation(1));
  EXPECT_EQ(tok.token_bytes(216), " ");   // "Ġ"
  EXPECT_EQ(tok.token_bytes(198), "\n");  // "Ċ"
  EXPECT_EQ(tok.token_bytes(2), "");
  EXPECT_EQ(tok.token_bytes(2, true), "<|im_end|>");
}

TEST(TokenizerSmolLM2, MatchesLlamaCpp) {
  const tokenizer& tok = smollm();
  for (const auto& c : smollm_cases()) {
    EXPECT_EQ(tok.encode(c.text, false, false), c.expected) << "text: " << c.text;
    EXPECT_EQ(tok.decode(c.expected), c.text);
  }
}

TEST(TokenizerSmolLM2, SpecialTokenParsing) {
  const tokenizer& tok = smollm();
  const std::string text = "<|im_start|>user\nHi<|im_end|>";
  EXPECT_EQ(tok.encode(text, false, true), (ids{1, 4093, 198, 26843, 2}));
  EXPECT_EQ(tok.encode(text, false, false), (ids{44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843,
                                                 44, 108, 306, 79, 486, 108, 46}));
  EXPECT_EQ(tok.decode(tok.encode(text, false, true), true), text);
  EXPECT_EQ(tok.decode(tok.encode(text, false, true)), "user\nHi");
  // add_bos puts the vocabulary's BOS first even where the model does not ask for it.
  EXPECT_EQ(tok.encode("Hi", true, false).front(), tok.bos());
}

TEST(TokenizerSmolLM2, RoundTripsRandomText) {
  const tokenizer& tok = smollm();
  std::mt19937 rng(42);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_utf8(rng, 1 + i % 60, true);
    const ids tokens = tok.encode(s, false, false);
    ASSERT_EQ(tok.decode(tokens), s) << s;
    ASSERT_EQ(streamed(tok, tokens), s) << s;
  }
}

TEST(TokenizerSmolLM2, RoundTripsArbitraryBytes) {
  // Byte-level BPE covers every byte the vocabulary has a character for,
  // valid UTF-8 or not.  SmolLM2 lacks a few (0x04, 0xC0, 0xF5..0xFF, ...):
  // those are dropped, never turned into its unk <|endoftext|>.
  const tokenizer& tok = smollm();
  std::vector<char> spellable;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    const ids t = tok.encode(one, false, false);
    if (t.empty()) continue;
    EXPECT_EQ(tok.decode(t), one);
    spellable.push_back(static_cast<char>(b));
  }
  EXPECT_EQ(spellable.size(), 256u - 21u);
  EXPECT_EQ(tok.encode("\xFF", false, false), ids{});
  std::mt19937 rng(3);
  std::uniform_int_distribution<size_t> pick(0, spellable.size() - 1);
  for (int i = 0; i < 100; ++i) {
    std::string s(1 + i % 30, '\0');
    for (char& c : s) c = spellable[pick(rng)];
    EXPECT_EQ(tok.decode(tok.encode(s, false, false)), s);
  }
}

TEST(Tokenizer, RefusesUnknownModels) {
  vocab_data v;
  v.model = "bert";
  v.tokens = {"a"};
  v.kinds = {token_kind::normal};
  EXPECT_THROW(tokenizer::create(v), std::runtime_error);
  v.model = "gpt2";
  v.pre = "tekken";
  EXPECT_THROW(tokenizer::create(v), std::runtime_error);
}

// -------------------------------------------------------- incremental decoder

TEST(IncrementalDecoder, HoldsBackSplitCharacters) {
  const tokenizer& tok = smollm();
  // "🙂👍": the second emoji is spelled over three byte tokens.
  incremental_decoder dec(tok);
  std::vector<std::string> deltas;
  for (int32_t id : ids{10813, 38887, 10813, 235, 231}) deltas.push_back(dec.push(id));
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "🙂", "", "", "👍"}));
  EXPECT_EQ(dec.flush(), "");
}

TEST(IncrementalDecoder, StreamsCjkAndEmojiLikeDecode) {
  for (const tokenizer* tok : {&smollm(), &stories()}) {
    for (const std::string text :
         {"你好，世界 🙂👍 héllo", "日本語のテキスト🎉🎉", "ok 😀\n😀😀"}) {
      const ids tokens = tok->encode(text, false, false);
      EXPECT_EQ(streamed(*tok, tokens), tok->decode(tokens)) << text;
    }
  }
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementCharacters) {
  const tokenizer& tok = stories();  // byte token for b is 3 + b
  incremental_decoder dec(tok);
  EXPECT_EQ(dec.push(3 + 0xE4), "");  // start of a 3-byte character
  EXPECT_EQ(dec.pending_bytes(), 1u);
  // 'a' cannot continue it: the lead byte is reported broken, 'a' passes.
  EXPECT_EQ(dec.push(3 + 'a'),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(dec.push(3 + 0x80), "\xEF\xBF\xBD");  // stray continuation byte
  EXPECT_EQ(dec.push(3 + 0xF0), "");
  EXPECT_EQ(dec.push(3 + 0x9F), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");  // unfinished at the end
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.push(3 + 'b'), "b");
}

TEST(IncrementalDecoder, RandomTokenStreamsStayValid) {
  // Any token sequence, even one spelling broken UTF-8, streams valid text.
  const tokenizer& tok = smollm();
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> any(0, tok.n_vocab() - 1);
  for (int round = 0; round < 50; ++round) {
    incremental_decoder dec(tok);
    std::string all;
    for (int i = 0; i < 40; ++i) {
      const std::string d = dec.push(any(rng));
      ASSERT_TRUE(unicode::is_valid_utf8(d));
      all += d;
    }
    all += dec.flush();
    EXPECT_TRUE(unicode::is_valid_utf8(all));
  }
}

// ------------------------------------------------------------------- unicode

TEST(TokenizerUnicode, Classes) {
  using unicode::classify;
  using unicode::cpt_class;
  EXPECT_EQ(classify('a'), cpt_class::letter);
  EXPECT_EQ(classify('7'), cpt_class::number);
  EXPECT_EQ(classify(' '), cpt_class::whitespace);
  EXPECT_EQ(classify('!'), cpt_class::other);
  EXPECT_EQ(classify(0xE9), cpt_class::letter);    // é
  EXPECT_EQ(classify(0xBD), cpt_class::number);    // ½
  EXPECT_EQ(classify(0x4F60), cpt_class::letter);  // 你
  EXPECT_EQ(classify(0xFF0C), cpt_class::other);   // ，
  EXPECT_EQ(classify(0x1F642), cpt_class::other);  // 🙂
  EXPECT_EQ(classify(0x3000), cpt_class::whitespace);
  EXPECT_EQ(classify(0x0663), cpt_class::number);   // ٣
  EXPECT_EQ(classify(0x2EBF0), cpt_class::letter);  // CJK Extension I (Unicode 15.1)
  EXPECT_EQ(classify(0x10FFFF), cpt_class::other);
}

TEST(TokenizerUnicode, Utf8Validation) {
  EXPECT_TRUE(unicode::is_valid_utf8("héllo 你好 🙂"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(unicode::is_valid_utf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(unicode::is_valid_utf8("\xE4\xBD"));          // truncated
  EXPECT_EQ(unicode::valid_sequence_length("\xE4\xBD", 0), 0);
  EXPECT_EQ(unicode::valid_sequence_length("\xE4\xBD\xA0", 0), 3);
  EXPECT_EQ(unicode::valid_sequence_length("\x80", 0), -1);
}

// Text from outside (a decoder's reason quoting a damaged file's bytes)
// made fit for a protobuf string: every bad byte one U+FFFD.
TEST(TokenizerUnicode, ScrubbedTextIsValidUtf8) {
  EXPECT_EQ(unicode::scrub_utf8("héllo 你好 🙂"), "héllo 你好 🙂");
  EXPECT_EQ(unicode::scrub_utf8("IDA\xab PNG chunk"), "IDA\xEF\xBF\xBD PNG chunk");
  EXPECT_EQ(unicode::scrub_utf8("\xE4\xBD"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::scrub_utf8(""), "");
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
  EXPECT_TRUE(unicode::is_valid_utf8(unicode::scrub_utf8(bytes)));
}

}  // namespace
}  // namespace troupe
