#pragma once
// GGUF (versions 2 and 3, little-endian) reader.  The file is memory-mapped;
// every count, length and offset is checked against the file before use, so
// a damaged file gives a model_error naming the defect, never a crash.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/model/model_file.hpp"

namespace troupe {

enum class gguf_value_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

std::string_view gguf_value_type_name(gguf_value_type t);

// One metadata value.  Scalars: integers and bools in `i` (u64 values above
// INT64_MAX wrap), floats in `f`, strings in `str`.  Arrays: `elem` is the
// element type, `count` the length, and the elements are in `ints`, `floats`
// or `strs` by kind.  Arrays of arrays are checked and skipped (count only).
struct gguf_value {
  gguf_value_type type = gguf_value_type::u8;
  gguf_value_type elem = gguf_value_type::u8;
  uint64_t count = 0;
  int64_t i = 0;
  double f = 0.0;
  std::string str;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strs;

  bool is_integer() const;  // any integer type (not bool)
  bool is_float() const { return type == gguf_value_type::f32 || type == gguf_value_type::f64; }
};

class gguf_file : public model_file {
 public:
  static std::shared_ptr<gguf_file> open(const std::string& path);
  // Its metadata and tensors only, checked as open() checks them, for
  // files that are not language models (a vision encoder's mmproj file):
  // no hyperparameters, vocabulary or layer tensors are required.
  static std::shared_ptr<gguf_file> open_raw(const std::string& path);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }  // start of the tensor data section
  const std::map<std::string, gguf_value>& metadata() const { return kv_; }
  const gguf_value* find_kv(const std::string& key) const;

  // Typed metadata accessors: throw naming the key when missing/mistyped.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  const gguf_value& get_array(const std::string& key, gguf_value_type elem) const;
  [[noreturn]] void fail(const std::string& problem) const;

 private:
  gguf_file() = default;
  void parse();
  void build_hparams();
  void read_gemma3(model_hparams& h);  // gemma3.* keys, from build_hparams
  void build_vocab();
  void check_llama_tensors();
  void read_rope_freqs();

  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::map<std::string, gguf_value> kv_;
};

}  // namespace troupe
