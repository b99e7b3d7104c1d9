// GPT-2 byte-level BPE (vocab model "gpt2").  Text is first cut into words
// by the pre-tokenizer the vocabulary names (pre_tokenizer.hpp), each word's
// bytes are spelled with GPT-2's byte -> character table (space -> "Ġ"),
// and the pair with the lowest merge rank is merged until no listed merge
// applies.
#include <array>
#include <queue>
#include <stdexcept>

#include "runtime/text/pre_tokenizer.hpp"
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

    const std::vector<size_t> lengths = split_words(pre_.split, cps);
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
    if (pre_.whole_words) {
      std::string spelled;
      for (const char c : word)
        unicode::append_utf8(spelled, byte_to_cpt_[static_cast<unsigned char>(c)]);
      if (const int32_t id = token_id(spelled); id >= 0) {
        out.push_back(id);
        return;
      }
    }
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

  pre_tokenizer_kind pre_;
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
