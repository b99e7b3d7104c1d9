#include "runtime/text/tokenizer.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe {

namespace {

bool is_special_kind(token_kind k) {
  return k == token_kind::control || k == token_kind::user_defined || k == token_kind::unknown;
}

// Names of end-of-turn tokens chat models emit in place of (or besides) eos.
constexpr std::string_view k_end_of_turn_names[] = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>",
};

// A piece of the input: raw text, or a special token already resolved.
struct fragment {
  std::string_view text;
  int32_t token = -1;  // >= 0: a special token
};

}  // namespace

std::unique_ptr<tokenizer> tokenizer::create(const vocab_data& vocab) {
  if (vocab.tokens.empty()) throw std::runtime_error("tokenizer: the vocabulary is empty");
  if (vocab.model == "llama") return detail::make_spm_tokenizer(vocab);
  if (vocab.model == "gpt2") return detail::make_bpe_tokenizer(vocab);
  throw std::runtime_error("tokenizer: unsupported tokenizer model '" + vocab.model +
                           "' (supported: llama, gpt2)");
}

tokenizer::tokenizer(const vocab_data& vocab)
    : model_(vocab.model),
      pieces_(vocab.tokens),
      kinds_(vocab.kinds),
      bos_(vocab.bos),
      eos_(vocab.eos),
      unk_(vocab.unk),
      add_bos_(vocab.add_bos) {
  const auto n = static_cast<int32_t>(pieces_.size());
  if (kinds_.empty()) kinds_.assign(pieces_.size(), token_kind::normal);
  if (kinds_.size() != pieces_.size()) {
    throw std::runtime_error("tokenizer: " + std::to_string(kinds_.size()) + " token kinds for " +
                             std::to_string(n) + " tokens");
  }
  for (int32_t* id : {&bos_, &eos_, &unk_}) {
    if (*id >= n)
      throw std::runtime_error("tokenizer: special token id " + std::to_string(*id) +
                               " out of range (n_vocab " + std::to_string(n) + ")");
    if (*id < 0) *id = -1;
  }
  ids_.reserve(pieces_.size());
  // The first id wins when a piece is listed twice.
  for (int32_t id = n - 1; id >= 0; --id) ids_[pieces_[id]] = id;

  for (int32_t id = 0; id < n; ++id) {
    if (is_special_kind(kinds_[id]) && !pieces_[id].empty()) specials_.push_back(id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return pieces_[a].size() > pieces_[b].size(); });

  if (eos_ >= 0) eog_.push_back(eos_);
  for (std::string_view name : k_end_of_turn_names) {
    const int32_t id = token_id(name);
    if (id >= 0 && kinds_[id] == token_kind::control && !is_end_of_generation(id)) {
      eog_.push_back(id);
    }
  }
}

void tokenizer::build_byte_cache() {
  bytes_.resize(pieces_.size());
  for (int32_t id = 0; id < n_vocab(); ++id) {
    switch (kinds_[id]) {
      case token_kind::normal:
      case token_kind::byte:
        bytes_[id] = normal_bytes(id);
        break;
      case token_kind::user_defined:
        bytes_[id] = pieces_[id];
        break;
      case token_kind::control:
      case token_kind::unknown:
      case token_kind::unused:
        break;
    }
  }
}

int32_t tokenizer::token_id(std::string_view piece) const {
  const auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

bool tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

std::string tokenizer::token_bytes(int32_t id, bool special) const {
  if (!valid(id)) return {};
  if (special && (kinds_[id] == token_kind::control || kinds_[id] == token_kind::unknown)) {
    return pieces_[id];
  }
  return bytes_[id];
}

std::string tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (int32_t id : ids) {
    if (!valid(id)) continue;
    if (special) {
      out += token_bytes(id, true);
    } else {
      out += bytes_[id];
    }
  }
  return out;
}

std::vector<int32_t> tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  // Split out special tokens, longest first, as llama.cpp does: each token
  // in turn cuts every remaining text fragment at its occurrences.
  std::vector<fragment> frags;
  if (!text.empty()) frags.push_back({text});
  for (int32_t special : specials_) {
    const token_kind k = kinds_[special];
    if (!parse_special && (k == token_kind::control || k == token_kind::unknown)) continue;
    const std::string& needle = pieces_[special];
    std::vector<fragment> next;
    next.reserve(frags.size());
    for (const fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(needle)) != std::string_view::npos;) {
        if (at > 0) next.push_back({rest.substr(0, at)});
        next.push_back({{}, special});
        rest.remove_prefix(at + needle.size());
      }
      if (!rest.empty()) next.push_back({rest});
    }
    frags = std::move(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_ >= 0) out.push_back(bos_);
  bool after_special = true;
  for (const fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      encode_fragment(f.text, after_special, out);
      after_special = false;
    }
  }
  return out;
}

}  // namespace troupe
