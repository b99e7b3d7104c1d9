#include "runtime/text/pre_tokenizer.hpp"

#include <stdexcept>

namespace troupe {

using unicode::cpt_class;

pre_tokenizer_kind pre_tokenizer_for(const std::string& pre) {
  // The names llama.cpp's vocabulary loader maps to each splitter.
  for (const char* name : {"smollm", "codeshell", "exaone", "minerva"}) {
    if (pre == name) return {pre_tokenizer::digits_then_gpt2, false};
  }
  for (const char* name : {"gpt2", "gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"}) {
    if (pre == name) return {pre_tokenizer::gpt2, false};
  }
  for (const char* name :
       {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}) {
    if (pre == name) return {pre_tokenizer::llama3, true};
  }
  for (const char* name :
       {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan"}) {
    if (pre == name) return {pre_tokenizer::qwen2, false};
  }
  throw std::runtime_error(
      "tokenizer: unsupported gpt2 pre-tokenizer '" + pre +
      "' (tokenizer.ggml.pre; supported: smollm, codeshell, exaone, minerva, gpt2, gpt-2, phi-2, "
      "roberta-bpe, mpt, olmo, jais, llama3, llama-v3, llama-bpe, falcon3, falcon-h1, pixtral, "
      "midm-2.0, lfm2, qwen2, deepseek-r1-qwen, kormo, f2llmv2, megrez, stablelm2, hunyuan)");
}

namespace {

// Appends the lengths (in code points) of the gpt2-regex matches covering
// cps[first, last).  The end of the range acts as the end of the text.
void split_gpt2(const std::vector<cpt_span>& cps, size_t first, size_t last,
                std::vector<size_t>& lengths) {
  auto cls_at = [&](size_t i) { return cps[i].cls; };
  auto is_ascii = [&](size_t i, char c) {
    return i < last && cps[i].cp == static_cast<uint32_t>(c);
  };
  for (size_t pos = first; pos < last;) {
    const size_t start = pos;
    // 's 't 're 've 'm 'll 'd
    if (cps[pos].cp == '\'') {
      if (is_ascii(pos + 1, 's') || is_ascii(pos + 1, 't') || is_ascii(pos + 1, 'm') ||
          is_ascii(pos + 1, 'd')) {
        lengths.push_back(2);
        pos += 2;
        continue;
      }
      if ((is_ascii(pos + 1, 'r') && is_ascii(pos + 2, 'e')) ||
          (is_ascii(pos + 1, 'v') && is_ascii(pos + 2, 'e')) ||
          (is_ascii(pos + 1, 'l') && is_ascii(pos + 2, 'l'))) {
        lengths.push_back(3);
        pos += 3;
        continue;
      }
    }
    // " ?X+" for X in letters, numbers, other: a leading space joins the run.
    const bool space = cps[pos].cp == ' ';
    if (!space || pos + 1 < last) {
      const cpt_class run = cls_at(space ? pos + 1 : pos);
      if (run != cpt_class::whitespace) {
        pos += space ? 2 : 1;
        while (pos < last && cls_at(pos) == run) ++pos;
        lengths.push_back(pos - start);
        continue;
      }
    }
    // \s+(?!\S) leaves the last blank to a following word; \s+ otherwise.
    size_t n = 0;
    while (pos + n < last && cls_at(pos + n) == cpt_class::whitespace) ++n;
    if (n > 1 && pos + n < last) --n;
    if (n == 0) n = 1;  // unreachable: kept so the loop always advances
    lengths.push_back(n);
    pos += n;
  }
}

// Appends the words of the llama3 / qwen2 regex over cps[first, last):
// contractions (either case), an optional non-letter, non-digit, non-CR/LF
// character before a run of letters, runs of up to max_digits digits,
// punctuation runs (a space before them joins) with the line breaks after
// them, whitespace up to its last line break, and whitespace runs that
// leave their last blank to the next word.
void split_llama3(const std::vector<cpt_span>& cps, size_t first, size_t last, size_t max_digits,
                  std::vector<size_t>& lengths) {
  auto in = [&](size_t i) { return i < last; };
  auto is = [&](size_t i, cpt_class c) { return in(i) && cps[i].cls == c; };
  auto is_break = [&](size_t i) { return in(i) && (cps[i].cp == '\r' || cps[i].cp == '\n'); };
  auto lower_at = [&](size_t i) -> uint32_t {
    if (!in(i)) return 0;
    const uint32_t cp = cps[i].cp;
    return cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp;
  };
  size_t start = first;
  auto emit = [&](size_t end) {
    lengths.push_back(end - start);
    start = end;
  };
  for (size_t pos = first; pos < last; pos = start) {
    const uint32_t cp = cps[pos].cp;
    if (cp == '\'') {
      const uint32_t a = lower_at(pos + 1), b = lower_at(pos + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(pos + 2);
        continue;
      }
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        emit(pos + 3);
        continue;
      }
    }
    if (!is_break(pos) && !is(pos, cpt_class::number) &&
        (is(pos, cpt_class::letter) || is(pos + 1, cpt_class::letter))) {
      size_t end = pos + 1;
      while (is(end, cpt_class::letter)) ++end;
      emit(end);
      continue;
    }
    if (is(pos, cpt_class::number)) {
      size_t end = pos;
      while (is(end, cpt_class::number)) {
        ++end;
        if (end - start == max_digits) emit(end);
      }
      if (end > start) emit(end);
      continue;
    }
    const size_t punct = cp == ' ' ? pos + 1 : pos;
    if (is(punct, cpt_class::other)) {
      size_t end = punct;
      while (is(end, cpt_class::other)) ++end;
      while (is_break(end)) ++end;
      emit(end);
      continue;
    }
    size_t blanks = 0, after_break = 0;
    while (is(pos + blanks, cpt_class::whitespace)) {
      if (is_break(pos + blanks)) after_break = pos + blanks + 1;
      ++blanks;
    }
    if (after_break > 0) {
      emit(after_break);
    } else if (blanks > 1 && in(pos + blanks)) {
      emit(pos + blanks - 1);
    } else {
      emit(pos + (blanks > 0 ? blanks : 1));
    }
  }
}

}  // namespace

std::vector<size_t> split_words(pre_tokenizer split, const std::vector<cpt_span>& cps) {
  std::vector<size_t> lengths;
  switch (split) {
    case pre_tokenizer::gpt2:
      split_gpt2(cps, 0, cps.size(), lengths);
      break;
    case pre_tokenizer::digits_then_gpt2: {
      // \p{N}: each number character alone; the text between keeps its own
      // boundaries, so gpt2 runs on every gap separately.
      size_t gap = 0;
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (i < cps.size() && cps[i].cls != cpt_class::number) continue;
        split_gpt2(cps, gap, i, lengths);
        if (i < cps.size()) lengths.push_back(1);
        gap = i + 1;
      }
      break;
    }
    case pre_tokenizer::llama3:
      split_llama3(cps, 0, cps.size(), 3, lengths);
      break;
    case pre_tokenizer::qwen2:
      split_llama3(cps, 0, cps.size(), 1, lengths);
      break;
  }
  return lengths;
}

}  // namespace troupe
