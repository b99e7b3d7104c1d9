#pragma once
// A model opened from disk: hyper-parameters, vocabulary and tensors, the same
// shape whether it came from a GGUF file or a llama2.c checkpoint.  Tensor
// data points into a read-only memory map owned by the model_file.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/model/tensor_type.hpp"

namespace troupe {

// Thrown for any defect of a model file; what() is one line naming the
// file and the problem ("model.gguf: tensor 'blk.0.attn_q.weight' data
// ends past the end of the file").
struct model_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The most experts a layer may have (llama.cpp's LLAMA_MAX_EXPERTS).
constexpr int k_max_experts = 256;

enum class rope_layout {
  normal,  // rotate pairs (2i, 2i+1): llama, llama2.c
  neox,    // rotate pairs (i, i + d/2): qwen2, neox
};

struct model_hparams {
  std::string arch;  // "llama", ...
  int n_vocab = 0;
  int n_embd = 0;
  int n_ff = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;   // n_embd / n_head unless the file says otherwise
  int rope_dims = 0;  // rotated dimensions per head (== head_dim usually)
  int n_ctx_train = 0;
  float rope_theta = 10000.0f;
  // RoPE frequency scaling as llama.cpp applies it: a pair's angle divided
  // by its factor (`rope_freqs.weight`, rope_dims / 2 values: Llama 3's
  // scaling; empty: none), then times rope_freq_scale (1 / the file's
  // `rope.scaling.factor`, linear scaling).
  std::vector<float> rope_freq_factors;
  float rope_freq_scale = 1.0f;
  float rms_eps = 1e-5f;
  rope_layout rope = rope_layout::normal;
  bool tied_embeddings = false;  // output.weight absent: reuse token_embd
  // Mixture of experts (llama.expert_count, llama.expert_used_count): every
  // layer's FFN is n_expert experts of n_ff rows, n_expert_used of them per
  // token; 0 for a dense model.
  int n_expert = 0;
  int n_expert_used = 0;
  // Mixtral-style files renormalise the chosen experts' weights to sum to
  // one; Qwen2-MoE keeps them as the softmax gave them.
  bool expert_weights_norm = true;
  // Qwen2-MoE's shared expert (qwen2moe.expert_shared_feed_forward_length):
  // an FFN of this width every token runs besides its routed experts, its
  // output scaled by sigmoid(ffn_gate_inp_shexp . x); 0 where there is none.
  // For such files n_ff above is the routed experts' width.
  int n_ff_shared = 0;
  // Gemma 3 (llama.cpp's gemma3 graph).  qk_norm: each q and k head
  // RMS-normed by attn_q_norm / attn_k_norm before RoPE.  sandwich_norms:
  // the attention and FFN outputs RMS-normed (post_attention_norm,
  // post_ffw_norm) before their residual adds.  gelu_ffn: the gate through
  // GELU (tanh) instead of SiLU.
  bool qk_norm = false;
  bool sandwich_norms = false;
  bool gelu_ffn = false;
  float embd_scale = 1.0f;  // token embeddings times this (Gemma: sqrt(n_embd))
  float attn_scale = 0.0f;  // q.k scale; 0: 1 / sqrt(head_dim)
  // Final logit softcapping: logits = c tanh(logits / c) where c > 0 (a
  // gemma3 file's final_logit_softcapping, as llama.cpp's graph reads it).
  float final_logit_softcap = 0.0f;
  // Sliding-window attention: windowed layers see the last
  // `sliding_window` positions only, with their own RoPE base; 0: none.
  int sliding_window = 0;
  std::vector<bool> swa_layers;  // per layer: windowed (empty: none)
  float rope_theta_swa = 10000.0f;

  // The q.k scale attention applies: the file's, else 1 / sqrt(head_dim).
  float attention_scale() const {
    return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }

  bool is_swa(int layer) const {
    return sliding_window > 0 && layer >= 0 && static_cast<size_t>(layer) < swa_layers.size() &&
           swa_layers[static_cast<size_t>(layer)];
  }
};

// Token kinds, as GGUF numbers them (tokenizer.ggml.token_type).
enum class token_kind : int32_t {
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct vocab_data {
  std::string model;  // "llama" (SentencePiece-style BPE) or "gpt2" (byte-level BPE)
  std::string pre;    // pre-tokenizer name for gpt2 ("smollm", "default", ...)
  std::vector<std::string> tokens;
  std::vector<float> scores;        // empty when the file has none
  std::vector<token_kind> kinds;    // one per token
  std::vector<std::string> merges;  // "a b" pairs, gpt2 only
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t unk = -1;
  int32_t pad = -1;
  bool add_bos = false;
  bool add_space_prefix = false;
  std::string chat_template;  // Jinja source from the file, may be empty
};

// A whole file mapped read-only.  Shared by a model_file and anything that
// must keep the tensor bytes alive after the model_file is gone.
class mapped_file {
 public:
  explicit mapped_file(const std::string& path);  // throws model_error
  ~mapped_file();
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

struct tensor_view {
  std::string name;
  tensor_type type = tensor_type::f32;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the contiguous (row) length
  const uint8_t* data = nullptr;
  size_t bytes = 0;

  int64_t rows() const;  // product of shape[1..]
  int64_t row_len() const { return shape.empty() ? 0 : shape[0]; }
};

class model_file {
 public:
  // Opens a .gguf or a llama2.c .bin (with tokenizer_path, or
  // "tokenizer.bin" beside it).  Throws model_error.
  static std::shared_ptr<model_file> open(const std::string& path,
                                          const std::string& tokenizer_path = "");

  virtual ~model_file() = default;

  const std::string& path() const { return path_; }
  const model_hparams& hparams() const { return hparams_; }
  const vocab_data& vocab() const { return vocab_; }
  const std::map<std::string, tensor_view>& tensors() const { return tensors_; }
  // Throws model_error naming the tensor when it is missing.
  const tensor_view& tensor(const std::string& name) const;
  const tensor_view* find_tensor(const std::string& name) const;
  // A stable hex digest identifying the weights (used to salt prefix hashes
  // and to refuse KV blobs of another model).
  const std::string& fingerprint() const { return fingerprint_; }
  // "gguf" or "llama2c"
  const std::string& format() const { return format_; }
  // The mapping the tensor data lives in; hold it to keep tensor bytes valid.
  const std::shared_ptr<const mapped_file>& mapping() const { return map_; }

 protected:
  std::string path_;
  std::string format_;
  model_hparams hparams_;
  vocab_data vocab_;
  std::map<std::string, tensor_view> tensors_;
  std::string fingerprint_;
  std::shared_ptr<const mapped_file> map_;  // owns the bytes tensors_ point into
};

// "<path>: <problem>" as a model_error.
[[noreturn]] void throw_model_error(const std::string& path, const std::string& problem);

// 64-bit FNV-1a, as 16 hex digits, over bytes [0, header_bytes) of a file
// plus evenly spaced samples of the rest and the file size: cheap (no full
// read of the weights) yet different for any two real models.
std::string sample_fingerprint(const uint8_t* data, size_t size, size_t header_bytes);

}  // namespace troupe
