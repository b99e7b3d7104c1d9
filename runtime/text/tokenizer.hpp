#pragma once
// Text <-> token ids for the vocabularies a model_file carries.  Two
// algorithms, one file each: SentencePiece-style BPE over scored pieces
// (tokenizer_spm.cpp, vocab model "llama") and GPT-2 byte-level BPE over
// ranked merges (tokenizer_bpe.cpp, vocab model "gpt2").  Both agree with
// llama.cpp's tokenizers id for id; the shared parts (special-token
// splitting, piece -> bytes, end-of-generation ids) live in tokenizer.cpp.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/model/model_file.hpp"

namespace troupe {

class tokenizer {
 public:
  // Throws std::runtime_error for a tokenizer model or pre-tokenizer that is
  // not supported, or a vocabulary that is inconsistent.
  static std::unique_ptr<tokenizer> create(const vocab_data& vocab);

  virtual ~tokenizer() = default;
  tokenizer(const tokenizer&) = delete;
  tokenizer& operator=(const tokenizer&) = delete;

  // add_bos: put bos() first (when the vocabulary has one; add_bos() says
  // whether the model wants it).  parse_special: text spelling a control
  // token ("<|im_start|>") becomes that token; otherwise it is plain text.
  // User-defined tokens are always matched, as in HF tokenizers.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;

  // The raw bytes a token stands for ("▁" -> " ", "<0x0A>" -> "\n", GPT-2
  // byte characters -> bytes).  Control and unknown tokens give "" unless
  // special is set, then their text.  A piece may be part of a UTF-8
  // sequence: see incremental_decoder for streaming.
  std::string token_bytes(int32_t id, bool special = false) const;
  // Concatenation of token_bytes; no leading-space stripping (a generated
  // "▁with" decodes to " with").  Out-of-range ids are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& model() const { return model_; }
  // eos, and the end-of-turn tokens chat models stop on (<|im_end|>,
  // <|endoftext|>, <|eot_id|>, ...) when the vocabulary has them.
  bool is_end_of_generation(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_; }
  // Id of a vocabulary entry spelled exactly so, -1 if absent.
  int32_t token_id(std::string_view piece) const;
  // The vocabulary entry as stored ("▁Once", "Ġthe", "<0x0A>").
  const std::string& piece(int32_t id) const { return pieces_.at(id); }
  token_kind kind(int32_t id) const { return kinds_.at(id); }

 protected:
  explicit tokenizer(const vocab_data& vocab);

  // Encodes text holding no special tokens.  after_special: the fragment
  // opens the input or follows a special token (SentencePiece then adds its
  // space prefix).
  virtual void encode_fragment(std::string_view text, bool after_special,
                               std::vector<int32_t>& out) const = 0;
  // Bytes of a normal (or byte) token; called once per token at start.
  virtual std::string normal_bytes(int32_t id) const = 0;
  // Fills bytes_; subclasses call it at the end of their constructor.
  void build_byte_cache();

  bool valid(int32_t id) const { return id >= 0 && id < n_vocab(); }

  std::string model_;
  std::vector<std::string> pieces_;
  std::vector<token_kind> kinds_;
  std::unordered_map<std::string_view, int32_t> ids_;  // views into pieces_
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = false;

 private:
  std::vector<int32_t> specials_;  // control/user-defined/unknown, longest first
  std::vector<int32_t> eog_;
  std::vector<std::string> bytes_;  // token_bytes(id, false)
};

namespace detail {
std::unique_ptr<tokenizer> make_spm_tokenizer(const vocab_data& vocab);
std::unique_ptr<tokenizer> make_bpe_tokenizer(const vocab_data& vocab);
}  // namespace detail

}  // namespace troupe
