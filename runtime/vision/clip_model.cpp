#include "runtime/vision/clip_model.hpp"

#include <cmath>

#include "runtime/model/tensor_type.hpp"

namespace troupe {

namespace {

// Sizes past these are not an encoder troupe can run, and bound what a
// damaged file can make it allocate.
constexpr int k_max_side = 4096, k_max_width = 16384, k_max_layers = 256;

struct reader {
  const gguf_file& f;

  [[noreturn]] void fail(const std::string& why) const {
    throw vision_error(f.path() + ": " + why);
  }

  int dim(const std::string& key, int lo, int hi) const {
    const int64_t v = f.get_int(key);
    if (v < lo || v > hi)
      fail(key + " is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
    return static_cast<int>(v);
  }

  // The named tensor as float, checked to hold rows x cols values; an
  // optional one that is absent comes back empty.
  clip_tensor tensor(const std::string& name, int64_t rows, int64_t cols,
                     bool optional = false) const {
    const tensor_view* t = f.find_tensor(name);
    if (!t) {
      if (optional) return {};
      fail("tensor '" + name + "' is missing");
    }
    int64_t n = 1;
    for (int64_t d : t->shape) n *= d;
    if (n != rows * cols || t->row_len() <= 0 || cols % t->row_len() != 0)
      fail("tensor '" + name + "' has " + std::to_string(n) + " values where " +
           std::to_string(rows) + " x " + std::to_string(cols) + " are expected");
    if (t->type != tensor_type::f32 && t->type != tensor_type::f16)
      fail("tensor '" + name + "' is " +
           std::string(gguf_type_name(static_cast<uint32_t>(t->type))) +
           "; the vision encoder takes F32 and F16 weights");
    clip_tensor out{rows, cols, std::vector<float>(static_cast<size_t>(n))};
    dequantize_row(t->type, t->data, out.data.data(), n);
    return out;
  }
};

}  // namespace

std::shared_ptr<const clip_model> load_clip_model(const std::string& path) {
  auto file = gguf_file::open_raw(path);
  const gguf_file& f = *file;
  reader r{f};
  if (f.get_string("general.architecture", "") != "clip")
    r.fail("general.architecture is '" + f.get_string("general.architecture", "") +
           "', not 'clip': not a multimodal projector (mmproj) file");
  if (!f.get_bool("clip.has_vision_encoder", false)) r.fail("it has no vision encoder");
  auto m = std::make_shared<clip_model>();
  m->path = path;
  auto& hp = m->hp;
  hp.projector =
      f.get_string("clip.vision.projector_type", f.get_string("clip.projector_type", ""));
  // LLaVA-1.5's MLP projector is what runs; the others (Gemma 3's, SmolVLM's
  // pixel shuffle, Qwen's M-RoPE...) are refused by name.
  if (hp.projector != "mlp")
    r.fail("projector type '" + hp.projector +
           "' is not supported (troupe runs 'mlp', LLaVA-1.5's)");
  if (f.find_kv("clip.vision.feature_layer"))
    r.fail("clip.vision.feature_layer (stacked feature layers, Granite's) is not supported");
  hp.image_size = r.dim("clip.vision.image_size", 1, k_max_side);
  hp.patch_size = r.dim("clip.vision.patch_size", 1, hp.image_size);
  if (hp.image_size % hp.patch_size != 0)
    r.fail("image size " + std::to_string(hp.image_size) + " is not a multiple of patch size " +
           std::to_string(hp.patch_size));
  hp.n_embd = r.dim("clip.vision.embedding_length", 1, k_max_width);
  hp.n_ff = r.dim("clip.vision.feed_forward_length", 1, 4 * k_max_width);
  hp.n_head = r.dim("clip.vision.attention.head_count", 1, hp.n_embd);
  if (hp.n_embd % hp.n_head != 0 || hp.head_dim() > 128)
    r.fail("width " + std::to_string(hp.n_embd) + " over " + std::to_string(hp.n_head) +
           " heads: head size must divide it and be at most 128");
  // llama.cpp's LLaVA graph runs every layer but the last (the second to
  // last's output is LLaVA's feature), then the post-norm where present.
  const int blocks = r.dim("clip.vision.block_count", 1, k_max_layers);
  hp.n_layer = blocks - 1;
  hp.eps = static_cast<float>(f.get_float("clip.vision.attention.layer_norm_epsilon", 1e-6));
  auto three = [&](const std::string& key, float* dst) {
    const auto& a = f.get_array(key, gguf_value_type::f32);
    if (a.floats.size() != 3) r.fail(key + " does not hold 3 values");
    for (int c = 0; c < 3; ++c) dst[c] = static_cast<float>(a.floats[c]);
  };
  three("clip.vision.image_mean", hp.mean);
  three("clip.vision.image_std", hp.std);
  for (float s : hp.std)
    if (!(s > 0)) r.fail("clip.vision.image_std holds a value that is not positive");
  hp.act = f.get_bool("clip.use_gelu", false)   ? vision_activation::gelu
           : f.get_bool("clip.use_silu", false) ? vision_activation::silu
                                                : vision_activation::gelu_quick;

  const int D = hp.n_embd, P = hp.patch_size;
  m->patch_w = r.tensor("v.patch_embd.weight", D, 3LL * P * P);
  m->patch_b = r.tensor("v.patch_embd.bias", 1, D, true);
  m->class_embd = r.tensor("v.class_embd", 1, D, true);
  hp.class_token = !m->class_embd.empty();
  m->pos_embd = r.tensor("v.position_embd.weight", hp.n_positions(), D);
  m->pre_ln_w = r.tensor("v.pre_ln.weight", 1, D, true);
  m->pre_ln_b = r.tensor("v.pre_ln.bias", 1, D, m->pre_ln_w.empty());
  m->post_ln_w = r.tensor("v.post_ln.weight", 1, D, true);
  m->post_ln_b = r.tensor("v.post_ln.bias", 1, D, m->post_ln_w.empty());
  for (int l = 0; l < hp.n_layer; ++l) {
    const std::string b = "v.blk." + std::to_string(l) + ".";
    clip_layer L;
    L.ln1_w = r.tensor(b + "ln1.weight", 1, D);
    L.ln1_b = r.tensor(b + "ln1.bias", 1, D);
    L.q_w = r.tensor(b + "attn_q.weight", D, D);
    L.q_b = r.tensor(b + "attn_q.bias", 1, D);
    L.k_w = r.tensor(b + "attn_k.weight", D, D);
    L.k_b = r.tensor(b + "attn_k.bias", 1, D);
    L.v_w = r.tensor(b + "attn_v.weight", D, D);
    L.v_b = r.tensor(b + "attn_v.bias", 1, D);
    L.o_w = r.tensor(b + "attn_out.weight", D, D);
    L.o_b = r.tensor(b + "attn_out.bias", 1, D);
    L.ln2_w = r.tensor(b + "ln2.weight", 1, D);
    L.ln2_b = r.tensor(b + "ln2.bias", 1, D);
    L.up_w = r.tensor(b + "ffn_up.weight", hp.n_ff, D);
    L.up_b = r.tensor(b + "ffn_up.bias", 1, hp.n_ff);
    L.down_w = r.tensor(b + "ffn_down.weight", D, hp.n_ff);
    L.down_b = r.tensor(b + "ffn_down.bias", 1, D);
    m->layers.push_back(std::move(L));
  }
  const tensor_view* mm0 = f.find_tensor("mm.0.weight");
  if (!mm0 || mm0->shape.size() != 2) r.fail("tensor 'mm.0.weight' is missing or not a matrix");
  const int hidden = static_cast<int>(mm0->shape[1]);
  if (hidden <= 0 || hidden > 4 * k_max_width) r.fail("mm.0.weight's output width is out of range");
  m->mm0_w = r.tensor("mm.0.weight", hidden, D);
  m->mm0_b = r.tensor("mm.0.bias", 1, hidden);
  const tensor_view* mm2 = f.find_tensor("mm.2.weight");
  if (!mm2 || mm2->shape.size() != 2) r.fail("tensor 'mm.2.weight' is missing or not a matrix");
  hp.n_out = static_cast<int>(mm2->shape[1]);
  if (hp.n_out <= 0 || hp.n_out > 4 * k_max_width)
    r.fail("mm.2.weight's output width is out of range");
  m->mm2_w = r.tensor("mm.2.weight", hp.n_out, hidden);
  m->mm2_b = r.tensor("mm.2.bias", 1, hp.n_out);
  return m;
}

}  // namespace troupe
