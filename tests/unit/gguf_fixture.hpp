#pragma once
// A small GGUF writer for tests: builds valid llama GGUF files with random
// weights of any supported type, and exposes the pieces so a test can damage
// a file on purpose (drop a key, move a tensor, patch a count).
#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/model/llama2c_reader.hpp"
#include "runtime/model/tensor_type.hpp"

namespace troupe::testing {

// Byte offsets of the GGUF header fields (versions 2 and 3).
constexpr size_t k_gguf_version_at = 4;
constexpr size_t k_gguf_tensor_count_at = 8;
constexpr size_t k_gguf_kv_count_at = 16;
constexpr size_t k_gguf_first_key_at = 24;  // length of the first metadata key

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

template <class T>
void patch(std::vector<uint8_t>& bytes, size_t at, T v) {
  if (at + sizeof(T) > bytes.size()) throw std::out_of_range("patch past the end");
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

inline void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

class gguf_writer {
 public:
  struct kv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> payload;  // the encoded value, after the type
  };
  struct tensor {
    std::string name;
    uint32_t type;  // a GGUF type number, supported or not
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset;  // forced data offset; default: packed, aligned
  };

  uint32_t version = 3;
  uint32_t alignment = 32;  // written as general.alignment when not 32
  std::vector<kv> kvs;
  std::vector<tensor> tensors;

  void set_u32(const std::string& k, uint32_t v) { set_scalar(k, 4, v); }
  void set_i32(const std::string& k, int32_t v) { set_scalar(k, 5, v); }
  void set_f32(const std::string& k, float v) { set_scalar(k, 6, v); }
  void set_bool(const std::string& k, bool v) { set_scalar(k, 7, static_cast<uint8_t>(v)); }
  void set_u64(const std::string& k, uint64_t v) { set_scalar(k, 10, v); }
  void set_str(const std::string& k, const std::string& v) {
    std::vector<uint8_t> p;
    put_string(p, v);
    set(k, 8, std::move(p));
  }
  void set_str_array(const std::string& k, const std::vector<std::string>& v) {
    std::vector<uint8_t> p;
    put<uint32_t>(p, 8);
    put<uint64_t>(p, v.size());
    for (const auto& s : v) put_string(p, s);
    set(k, 9, std::move(p));
  }
  void set_f32_array(const std::string& k, const std::vector<float>& v) { set_array(k, 6, v); }
  void set_i32_array(const std::string& k, const std::vector<int32_t>& v) { set_array(k, 5, v); }

  void erase(const std::string& k) {
    std::erase_if(kvs, [&](const kv& e) { return e.key == k; });
  }
  void erase_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const tensor& t) { return t.name == name; });
  }
  tensor* find_tensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void add_tensor(const std::string& name, uint32_t type, std::vector<int64_t> shape,
                  std::vector<uint8_t> data) {
    erase_tensor(name);
    tensors.push_back({name, type, std::move(shape), std::move(data), std::nullopt});
  }

  // Serializes; `tensor_info_at` (optional) receives where each tensor's info begins.
  std::vector<uint8_t> bytes(std::vector<size_t>* tensor_info_at = nullptr) const {
    std::vector<kv> all = kvs;
    if (alignment != 32) {
      kv a{"general.alignment", 4, {}};
      put<uint32_t>(a.payload, alignment);
      all.push_back(std::move(a));
    }
    std::vector<uint8_t> out;
    out.insert(out.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(out, version);
    put<uint64_t>(out, tensors.size());
    put<uint64_t>(out, all.size());
    for (const auto& e : all) {
      put_string(out, e.key);
      put<uint32_t>(out, e.type);
      out.insert(out.end(), e.payload.begin(), e.payload.end());
    }
    uint64_t next = 0;
    for (const auto& t : tensors) {
      if (tensor_info_at) tensor_info_at->push_back(out.size());
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
      for (int64_t d : t.shape) put<uint64_t>(out, static_cast<uint64_t>(d));
      put<uint32_t>(out, t.type);
      put<uint64_t>(out, t.offset.value_or(next));
      next = align(next + t.data.size());
    }
    out.resize(align(out.size()), 0);
    const size_t data_start = out.size();
    next = 0;
    for (const auto& t : tensors) {
      out.resize(data_start + next, 0);
      out.insert(out.end(), t.data.begin(), t.data.end());
      next = align(next + t.data.size());
    }
    return out;
  }

  void write(const std::string& path) const { write_file(path, bytes()); }

 private:
  uint64_t align(uint64_t n) const { return (n + alignment - 1) / alignment * alignment; }

  void set(const std::string& k, uint32_t type, std::vector<uint8_t> payload) {
    for (auto& e : kvs)
      if (e.key == k) {
        e.type = type;
        e.payload = std::move(payload);
        return;
      }
    kvs.push_back({k, type, std::move(payload)});
  }
  template <class T>
  void set_scalar(const std::string& k, uint32_t type, T v) {
    std::vector<uint8_t> p;
    put<T>(p, v);
    set(k, type, std::move(p));
  }
  template <class T>
  void set_array(const std::string& k, uint32_t elem, const std::vector<T>& v) {
    std::vector<uint8_t> p;
    put<uint32_t>(p, elem);
    put<uint64_t>(p, v.size());
    for (T x : v) put<T>(p, x);
    set(k, 9, std::move(p));
  }
};

// Random, finite weights of type t: n values (a multiple of the block size).
inline std::vector<uint8_t> random_weights(tensor_type t, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-0.1f, 0.1f), scale(0.001f, 0.02f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> out;
  const auto& tr = traits_of(t);
  out.reserve(row_bytes(t, n));
  for (int64_t b = 0; b < n / static_cast<int64_t>(tr.block_elems); ++b) {
    switch (t) {
      case tensor_type::f32:
        put<float>(out, val(rng));
        break;
      case tensor_type::f16:
        put<uint16_t>(out, float_to_half(val(rng)));
        break;
      case tensor_type::q4_0:
      case tensor_type::q8_0:
        put<uint16_t>(out, float_to_half(scale(rng)));
        for (int j = 0; j < (t == tensor_type::q4_0 ? 16 : 32); ++j)
          out.push_back(static_cast<uint8_t>(byte(rng)));
        break;
      case tensor_type::q4_1:
        put<uint16_t>(out, float_to_half(scale(rng)));
        put<uint16_t>(out, float_to_half(val(rng)));
        for (int j = 0; j < 16; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
        break;
      case tensor_type::q5_0:  // a scale, then random high bits and nibbles
      case tensor_type::iq4_nl:
        put<uint16_t>(out, float_to_half(scale(rng) / (t == tensor_type::iq4_nl ? 8 : 1)));
        for (size_t j = 2; j < tr.block_bytes; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
        break;
      case tensor_type::q4_k:  // d and dmin over 6-bit scales and mins, then random bytes
        put<uint16_t>(out, float_to_half(scale(rng) / 32));
        put<uint16_t>(out, float_to_half(scale(rng) / 32));
        for (size_t j = 4; j < tr.block_bytes; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
        break;
      case tensor_type::q6_k:  // random quants, scales of either sign, then d
        for (size_t j = 0; j < 192; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
        for (int j = 0; j < 16; ++j) out.push_back(static_cast<uint8_t>(byte(rng) - 128));
        put<uint16_t>(out, float_to_half(scale(rng) / 128));
        break;
      case tensor_type::bf16:  // the top half of a float
        put<uint16_t>(out, static_cast<uint16_t>(std::bit_cast<uint32_t>(val(rng)) >> 16));
        break;
      case tensor_type::q5_1:  // d, m, then random high bits and nibbles
        put<uint16_t>(out, float_to_half(scale(rng) / 2));
        put<uint16_t>(out, float_to_half(val(rng)));
        for (size_t j = 4; j < tr.block_bytes; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
        break;
      case tensor_type::q5_k:  // as Q4_K: d and dmin first
        put<uint16_t>(out, float_to_half(scale(rng) / 64));
        put<uint16_t>(out, float_to_half(scale(rng) / 32));
        for (size_t j = 4; j < tr.block_bytes; ++j) out.push_back(static_cast<uint8_t>(byte(rng)));
        break;
      case tensor_type::q2_k:  // random scales and quants, then d and dmin
      case tensor_type::q3_k:  // random bit planes, quants and scales, then d
        for (size_t j = 0; j < (t == tensor_type::q2_k ? 80u : 108u); ++j)
          out.push_back(static_cast<uint8_t>(byte(rng)));
        put<uint16_t>(out, float_to_half(scale(rng) / 16));
        if (t == tensor_type::q2_k) put<uint16_t>(out, float_to_half(scale(rng) / 8));
        break;
      case tensor_type::ku6:  // the device's layouts: no file holds them
      case tensor_type::f32p:
      case tensor_type::q4_1p:
      case tensor_type::q8_0p:
        throw std::invalid_argument("random_weights: a device layout is not a file type");
    }
  }
  return out;
}

struct tiny_llama_options {
  std::string arch = "llama";
  int n_vocab = 80;
  int n_embd = 64;
  int n_ff = 96;
  int n_layer = 2;
  int n_head = 4;
  int n_head_kv = 2;
  int n_ctx = 128;
  tensor_type matrix_type = tensor_type::q4_0;  // attention and FFN matrices
  // ffn_down's type in layer l: down_types[l % size] (empty: matrix_type),
  // as llama-quantize's K-quant files give ffn_down alone a K-quant.
  std::vector<tensor_type> down_types;
  // attn_v's type in layer l, likewise (llama-quantize's Q5_K_M of such a
  // model gives some layers a Q8_0 attn_v beside Q5_1 attn_q and attn_k).
  std::vector<tensor_type> v_types;
  tensor_type embd_type = tensor_type::q8_0;  // token_embd (and output)
  bool tied = true;
  bool qkv_bias = false;  // attn_{q,k,v}.bias as Qwen2 has them
  uint32_t seed = 1234;
};

// A complete, valid llama GGUF model with random weights and a small
// SentencePiece-style vocabulary.
inline gguf_writer make_tiny_llama(const tiny_llama_options& o = {}) {
  gguf_writer w;
  const std::string a = o.arch + ".";
  w.set_str("general.architecture", o.arch);
  w.set_str("general.name", "tiny test model");
  w.set_u32(a + "block_count", static_cast<uint32_t>(o.n_layer));
  w.set_u32(a + "context_length", static_cast<uint32_t>(o.n_ctx));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(o.n_embd));
  w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(o.n_ff));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(o.n_head));
  w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(o.n_head_kv));
  w.set_f32(a + "rope.freq_base", 500000.0f);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);

  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int i = 3; i < o.n_vocab; ++i) {
    tokens.push_back("\xE2\x96\x81t" + std::to_string(i));
    scores.push_back(-static_cast<float>(i));
    types.push_back(1);
  }
  w.set_str("tokenizer.ggml.model", "llama");
  w.set_str_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_str("tokenizer.chat_template", "{{ messages }}");

  std::mt19937 rng(o.seed);
  auto add = [&](const std::string& name, tensor_type t, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    w.add_tensor(name, static_cast<uint32_t>(t), shape, random_weights(t, n, rng));
  };
  const int64_t head_dim = o.n_embd / o.n_head;
  const int64_t q_dim = head_dim * o.n_head, kv_dim = head_dim * o.n_head_kv;
  add("token_embd.weight", o.embd_type, {o.n_embd, o.n_vocab});
  for (int l = 0; l < o.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", tensor_type::f32, {o.n_embd});
    add(b + "attn_q.weight", o.matrix_type, {o.n_embd, q_dim});
    add(b + "attn_k.weight", o.matrix_type, {o.n_embd, kv_dim});
    add(b + "attn_v.weight", o.v_types.empty() ? o.matrix_type : o.v_types[l % o.v_types.size()],
        {o.n_embd, kv_dim});
    if (o.qkv_bias) {
      add(b + "attn_q.bias", tensor_type::f32, {q_dim});
      add(b + "attn_k.bias", tensor_type::f32, {kv_dim});
      add(b + "attn_v.bias", tensor_type::f32, {kv_dim});
    }
    add(b + "attn_output.weight", o.matrix_type, {q_dim, o.n_embd});
    add(b + "ffn_norm.weight", tensor_type::f32, {o.n_embd});
    add(b + "ffn_gate.weight", o.matrix_type, {o.n_embd, o.n_ff});
    add(b + "ffn_up.weight", o.matrix_type, {o.n_embd, o.n_ff});
    add(b + "ffn_down.weight",
        o.down_types.empty() ? o.matrix_type : o.down_types[l % o.down_types.size()],
        {o.n_ff, o.n_embd});
  }
  add("output_norm.weight", tensor_type::f32, {o.n_embd});
  if (!o.tied) add("output.weight", o.embd_type, {o.n_embd, o.n_vocab});
  return w;
}

// A tiny llama2.c checkpoint whose floats count up from 0, and a tokenizer in
// the early-export form (raw bytes, "\n<s>\n", plain spaces).
struct tiny_llama2c {
  std::vector<uint8_t> model, tokenizer;
  static constexpr int dim = 8, hidden = 16, layers = 2, heads = 2, kv_heads = 1, vocab = 300,
                       seq = 4;
  explicit tiny_llama2c(bool shared = true) {
    for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq})
      put<int32_t>(model, v);
    const auto floats = *llama2c_header::from_bytes(model.data()).expected_file_size() / 4 - 7;
    for (uint64_t i = 0; i < floats; ++i) put<float>(model, static_cast<float>(i));
    put<int32_t>(tokenizer, 10);
    auto piece = [&](const std::string& s, float score) {
      put<float>(tokenizer, score);
      put<int32_t>(tokenizer, static_cast<int32_t>(s.size()));
      tokenizer.insert(tokenizer.end(), s.begin(), s.end());
    };
    piece("<unk>", 0);
    piece("\n<s>\n", 0);
    piece("\n</s>\n", 0);
    for (int b = 0; b < 256; ++b)
      piece(b < 0x80 ? std::string(1, static_cast<char>(b))
                     : std::string{static_cast<char>(0xC0 | (b >> 6)),
                                   static_cast<char>(0x80 | (b & 0x3F))},
            0);
    for (int i = 259; i < vocab; ++i) piece(" w" + std::to_string(i), -static_cast<float>(i));
  }
};

}  // namespace troupe::testing
