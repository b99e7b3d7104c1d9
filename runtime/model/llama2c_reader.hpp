#pragma once
// Karpathy's llama2.c checkpoints (F32, legacy "version 0" layout) and their
// tokenizer.bin, presented as a GGUF-named llama model with a SentencePiece
// vocabulary.  Tensors point into the memory map; nothing is copied.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/model/model_file.hpp"

namespace troupe {

struct llama2c_header {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // negative: the classifier is stored (unshared)
  int32_t seq_len = 0;

  static constexpr size_t bytes = 7 * sizeof(int32_t);
  static llama2c_header from_bytes(const uint8_t* p);  // p holds `bytes` bytes
  // File size the header implies; nullopt when the header is not plausible.
  std::optional<uint64_t> expected_file_size() const;
  std::string describe() const;  // "dim 288, hidden 768, ..."
};

class llama2c_file : public model_file {
 public:
  // tokenizer_path empty: "tokenizer.bin" in the model's directory.
  static std::shared_ptr<llama2c_file> open(const std::string& path,
                                            const std::string& tokenizer_path = "");

  const llama2c_header& header() const { return header_; }
  const std::string& tokenizer_path() const { return tokenizer_path_; }

 private:
  llama2c_file() = default;
  void map_tensors();
  void load_tokenizer();

  llama2c_header header_;
  std::string tokenizer_path_;
};

}  // namespace troupe
