// SentencePiece-style BPE (vocab model "llama"): spaces become "▁", the
// input starts as one symbol per UTF-8 character, and the adjacent pair
// whose concatenation is the highest-scoring vocabulary piece is merged
// until no pair is in the vocabulary.  Characters without a piece fall back
// to byte tokens <0xNN>.
#include <array>
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "runtime/text/tokenizer.hpp"
#include "runtime/text/unicode.hpp"

namespace troupe {

namespace {

constexpr std::string_view k_space_marker = "\xE2\x96\x81";  // U+2581 "▁"

// "<0x0A>" -> 10, anything else -> -1.
int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

class spm_tokenizer final : public tokenizer {
 public:
  explicit spm_tokenizer(const vocab_data& vocab)
      : tokenizer(vocab), scores_(vocab.scores), add_space_prefix_(vocab.add_space_prefix) {
    if (scores_.size() != pieces_.size()) {
      throw std::runtime_error("tokenizer: SentencePiece vocabulary has " +
                               std::to_string(scores_.size()) + " scores for " +
                               std::to_string(pieces_.size()) + " tokens");
    }
    byte_ids_.fill(-1);
    for (int32_t id = 0; id < n_vocab(); ++id) {
      if (kinds_[id] != token_kind::byte) continue;
      const int b = byte_value(id);
      if (b >= 0 && byte_ids_[b] < 0) byte_ids_[b] = id;
    }
    for (int b = 0; b < 256; ++b) {
      if (byte_ids_[b] >= 0) continue;
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      byte_ids_[b] = token_id(name);
    }
    build_byte_cache();
  }

 protected:
  std::string normal_bytes(int32_t id) const override {
    if (kinds_[id] == token_kind::byte) {
      const int b = byte_value(id);
      return b >= 0 ? std::string(1, static_cast<char>(b)) : pieces_[id];
    }
    const std::string& p = pieces_[id];
    std::string out;
    out.reserve(p.size());
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, k_space_marker.size(), k_space_marker) == 0) {
        out += ' ';
        i += k_space_marker.size();
      } else {
        out += p[i++];
      }
    }
    return out;
  }

  void encode_fragment(std::string_view text, bool after_special,
                       std::vector<int32_t>& out) const override {
    std::string escaped;
    escaped.reserve(text.size() * 2 + 3);
    if (add_space_prefix_ && after_special) escaped += k_space_marker;
    for (char c : text) {
      if (c == ' ') {
        escaped += k_space_marker;
      } else {
        escaped += c;
      }
    }
    if (escaped.empty()) return;

    // One symbol per character, linked so merged ones drop out.
    struct symbol {
      int prev, next;
      size_t start, len;  // len 0: merged into its left neighbour
    };
    std::vector<symbol> syms;
    for (size_t pos = 0; pos < escaped.size();) {
      const size_t start = pos;
      unicode::decode_next(escaped, pos);
      const int idx = static_cast<int>(syms.size());
      syms.push_back({idx - 1, idx + 1, start, pos - start});
    }
    syms.back().next = -1;

    struct bigram {
      float score;
      int left, right;
      size_t len;
      bool operator<(const bigram& o) const {
        // Highest score first; on a tie the leftmost pair.
        return score < o.score || (score == o.score && left > o.left);
      }
    };
    std::priority_queue<bigram> queue;
    auto try_pair = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const size_t len = syms[left].len + syms[right].len;
      const int32_t id = token_id(std::string_view(escaped).substr(syms[left].start, len));
      if (id < 0 || !mergeable(id)) return;
      queue.push({scores_[id], left, right, len});
    };
    for (size_t i = 1; i < syms.size(); ++i) try_pair(static_cast<int>(i) - 1, static_cast<int>(i));

    while (!queue.empty()) {
      const bigram top = queue.top();
      queue.pop();
      symbol& l = syms[top.left];
      symbol& r = syms[top.right];
      // Stale: one side has merged with something else since.
      if (l.len == 0 || r.len == 0 || l.len + r.len != top.len) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = top.left;
      try_pair(l.prev, top.left);
      try_pair(top.left, l.next);
    }

    for (int i = 0; i >= 0; i = syms[i].next) {
      const std::string_view piece = std::string_view(escaped).substr(syms[i].start, syms[i].len);
      const int32_t id = token_id(piece);
      if (id >= 0 && mergeable(id)) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {
        const int32_t b = byte_ids_[static_cast<unsigned char>(c)];
        if (b >= 0) {
          out.push_back(b);
        } else if (unk_ >= 0) {
          out.push_back(unk_);
        }
      }
    }
  }

 private:
  // Pieces text may turn into; a control or byte piece is never spelled out.
  bool mergeable(int32_t id) const {
    return kinds_[id] == token_kind::normal || kinds_[id] == token_kind::user_defined;
  }

  // The byte a byte token stands for: "<0xNN>", or (older llama2.c exports)
  // the raw byte itself.
  int byte_value(int32_t id) const {
    const std::string& p = pieces_[id];
    if (p.size() == 1) return static_cast<unsigned char>(p[0]);
    return parse_byte_piece(p);
  }

  std::vector<float> scores_;
  bool add_space_prefix_;
  std::array<int32_t, 256> byte_ids_{};
};

}  // namespace

namespace detail {
std::unique_ptr<tokenizer> make_spm_tokenizer(const vocab_data& vocab) {
  return std::make_unique<spm_tokenizer>(vocab);
}
}  // namespace detail

}  // namespace troupe
