// GPT-2 byte-level BPE (vocab model "gpt2").  Text is first cut into words
// by the pre-tokenizer regex the vocabulary names, each word's bytes are
// spelled with GPT-2's byte -> character table (space -> "Ġ"), and the pair
// with the lowest merge rank is merged until no listed merge applies.
//
// The pre-tokenizer regexes need \p{L} and \p{N}, which std::regex lacks,
// so they are matched by hand over classified code points:
//   gpt2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   smollm:  \p{N} first (every digit its own piece), then gpt2 on the rest.
#include <array>
#include <queue>
#include <stdexcept>

#include "runtime/text/tokenizer.hpp"
#include "runtime/text/unicode.hpp"

namespace troupe {

namespace {

using unicode::cpt_class;

// GPT-2's reversible byte -> code point table: printable Latin-1 bytes map
// to themselves, the rest to U+0100 onwards in byte order.
std::array<uint32_t, 256> make_byte_to_cpt() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? b : next++;
  }
  return table;
}

enum class pre_tokenizer { gpt2, digits_then_gpt2 };

pre_tokenizer pre_tokenizer_for(const std::string& pre) {
  for (const char* name : {"smollm", "codeshell", "exaone", "minerva"}) {
    if (pre == name) return pre_tokenizer::digits_then_gpt2;
  }
  for (const char* name : {"gpt2", "gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"}) {
    if (pre == name) return pre_tokenizer::gpt2;
  }
  throw std::runtime_error("tokenizer: unsupported gpt2 pre-tokenizer '" + pre +
                           "' (supported: smollm, codeshell, exaone, minerva, gpt-2, phi-2, "
                           "roberta-bpe, mpt, olmo, jais)");
}

struct cpt_span {
  uint32_t cp;
  cpt_class cls;
  size_t begin, end;  // byte offsets in the text
};

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

class bpe_tokenizer final : public tokenizer {
 public:
  explicit bpe_tokenizer(const vocab_data& vocab)
      : tokenizer(vocab), pre_(pre_tokenizer_for(vocab.pre)), byte_to_cpt_(make_byte_to_cpt()) {
    cpt_to_byte_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      cpt_to_byte_[byte_to_cpt_[b]] = b;
      byte_ids_[b] = token_id(unicode::to_utf8(byte_to_cpt_[b]));
    }
    merges_.reserve(vocab.merges.size());
    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
      const std::string& m = vocab.merges[rank];
      const size_t sep = m.find(' ', 1);
      if (sep == std::string::npos) {
        throw std::runtime_error("tokenizer: malformed merge #" + std::to_string(rank) + " '" + m +
                                 "'");
      }
      const int32_t left = token_id(std::string_view(m).substr(0, sep));
      const int32_t right = token_id(std::string_view(m).substr(sep + 1));
      const int32_t merged = token_id(m.substr(0, sep) + m.substr(sep + 1));
      // A merge whose parts or result are not tokens can never fire usefully.
      if (left < 0 || right < 0 || merged < 0) continue;
      merges_.try_emplace(pair_key(left, right), merge{static_cast<int32_t>(rank), merged});
    }
    build_byte_cache();
  }

 protected:
  std::string normal_bytes(int32_t id) const override {
    const std::string& p = pieces_[id];
    std::string out;
    out.reserve(p.size());
    for (size_t pos = 0; pos < p.size();) {
      const uint32_t cp = unicode::decode_next(p, pos);
      if (cp < cpt_to_byte_.size() && cpt_to_byte_[cp] >= 0) {
        out += static_cast<char>(cpt_to_byte_[cp]);
      } else {
        unicode::append_utf8(out, cp);  // not a byte character: keep as is
      }
    }
    return out;
  }

  void encode_fragment(std::string_view text, bool /*after_special*/,
                       std::vector<int32_t>& out) const override {
    std::vector<cpt_span> cps;
    cps.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const size_t begin = pos;
      const uint32_t cp = unicode::decode_next(text, pos);
      cps.push_back({cp, unicode::classify(cp), begin, pos});
    }

    std::vector<size_t> lengths;
    if (pre_ == pre_tokenizer::digits_then_gpt2) {
      // \p{N}: each number character alone; the text between keeps its own
      // boundaries, so gpt2 runs on every gap separately.
      size_t gap = 0;
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (i < cps.size() && cps[i].cls != cpt_class::number) continue;
        split_gpt2(cps, gap, i, lengths);
        if (i < cps.size()) lengths.push_back(1);
        gap = i + 1;
      }
    } else {
      split_gpt2(cps, 0, cps.size(), lengths);
    }

    size_t at = 0;
    for (size_t len : lengths) {
      const size_t begin = cps[at].begin, end = cps[at + len - 1].end;
      encode_word(text.substr(begin, end - begin), out);
      at += len;
    }
  }

 private:
  struct merge {
    int32_t rank, result;
  };

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  const merge* find_merge(int32_t left, int32_t right) const {
    if (left < 0 || right < 0) return nullptr;
    const auto it = merges_.find(pair_key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  }

  // BPE over one pre-tokenized word; symbols start as one per byte.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    struct symbol {
      int32_t id;  // -1: byte without a token (never merges)
      int prev, next;
      bool alive;
    };
    std::vector<symbol> syms(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      const int idx = static_cast<int>(i);
      syms[i] = {byte_ids_[static_cast<unsigned char>(word[i])], idx - 1, idx + 1, true};
    }
    syms.back().next = -1;

    struct candidate {
      int32_t rank;
      int left, right;
      int32_t left_id, right_id;
      bool operator<(const candidate& o) const {
        // Lowest rank first; on a tie the leftmost pair.
        return rank > o.rank || (rank == o.rank && left > o.left);
      }
    };
    std::priority_queue<candidate> queue;
    auto try_pair = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      if (const merge* m = find_merge(syms[left].id, syms[right].id)) {
        queue.push({m->rank, left, right, syms[left].id, syms[right].id});
      }
    };
    for (size_t i = 1; i < syms.size(); ++i) try_pair(static_cast<int>(i) - 1, static_cast<int>(i));

    while (!queue.empty()) {
      const candidate c = queue.top();
      queue.pop();
      symbol& l = syms[c.left];
      symbol& r = syms[c.right];
      if (!l.alive || !r.alive || l.next != c.right || l.id != c.left_id || r.id != c.right_id) {
        continue;  // stale
      }
      l.id = find_merge(l.id, r.id)->result;
      r.alive = false;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = c.left;
      try_pair(l.prev, c.left);
      try_pair(c.left, l.next);
    }

    for (int i = 0; i >= 0; i = syms[i].next) {
      if (syms[i].id >= 0) {
        out.push_back(syms[i].id);
      } else if (unk_ >= 0 && kinds_[unk_] == token_kind::unknown) {
        out.push_back(unk_);
      }
      // else: a byte the vocabulary cannot spell (SmolLM2 lacks 0xF5..0xFF,
      // which never occur in UTF-8) is dropped; its "unk" is <|endoftext|>,
      // and ending the prompt's turn there would be worse.
    }
  }

  pre_tokenizer pre_;
  std::array<uint32_t, 256> byte_to_cpt_;
  std::array<int16_t, 324> cpt_to_byte_{};  // 256 + the 68 remapped bytes
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, merge> merges_;
};

}  // namespace

namespace detail {
std::unique_ptr<tokenizer> make_bpe_tokenizer(const vocab_data& vocab) {
  return std::make_unique<bpe_tokenizer>(vocab);
}
}  // namespace detail

}  // namespace troupe
