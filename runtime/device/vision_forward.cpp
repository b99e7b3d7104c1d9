#include "runtime/device/vision_forward.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/device/gelu_table.hpp"
#include "runtime/device/llama_forward.hpp"  // kernel_build_options
#include "runtime/model/tensor_type.hpp"

namespace troupe {

namespace {

float to_half_and_back(float v) {
  return half_to_float(float_to_half(v));
}

}  // namespace

vision_forward::vision_forward(std::shared_ptr<const clip_model> model, cl::device_choice where)
    : model_(std::move(model)), ctx_(where) {
  // The language model's options (token tile by host, half KV): the same
  // program, so PoCL's kernel cache serves both.
  ctx_.build(kernel_build_options(ctx_, ctx_.x86_avx2() ? 4 : 8, true));
  k_linear_ = ctx_.make_kernel("vis_linear");
  k_norm_ = ctx_.make_kernel("vis_layernorm");
  k_act_ = ctx_.make_kernel("vis_activate");
  k_add_ = ctx_.make_kernel("vis_add");
  k_attn_ = ctx_.make_kernel("vis_attention");
  const auto gelu = gelu_half_table(), quick = gelu_quick_half_table();
  gelu_tab_ = ctx_.alloc(gelu.size() * sizeof(uint16_t), gelu.data());
  quick_tab_ = ctx_.alloc(quick.size() * sizeof(uint16_t), quick.data());
  dummy_ = ctx_.alloc(16);
  const auto& m = *model_;
  // ggml's patch convolution (im2col) rounds the kernel and the pixels to
  // half before its float dot products: so does encode().
  clip_tensor patch = m.patch_w;
  for (float& v : patch.data) v = to_half_and_back(v);
  patch_ = upload(patch, m.patch_b);
  mm0_ = upload(m.mm0_w, m.mm0_b);
  mm2_ = upload(m.mm2_w, m.mm2_b);
  if (!m.class_embd.empty()) class_ = upload(m.class_embd);
  pos_ = upload(m.pos_embd);
  if (!m.pre_ln_w.empty()) {
    pre_w_ = upload(m.pre_ln_w);
    pre_b_ = upload(m.pre_ln_b);
  }
  if (!m.post_ln_w.empty()) {
    post_w_ = upload(m.post_ln_w);
    post_b_ = upload(m.post_ln_b);
  }
  for (const auto& L : m.layers) {
    layer l;
    l.ln1_w = upload(L.ln1_w);
    l.ln1_b = upload(L.ln1_b);
    l.ln2_w = upload(L.ln2_w);
    l.ln2_b = upload(L.ln2_b);
    l.q = upload(L.q_w, L.q_b);
    l.k = upload(L.k_w, L.k_b);
    l.v = upload(L.v_w, L.v_b);
    l.o = upload(L.o_w, L.o_b);
    l.up = upload(L.up_w, L.up_b);
    l.down = upload(L.down_w, L.down_b);
    layers_.push_back(std::move(l));
  }
}

cl::buffer vision_forward::upload(const clip_tensor& v) {
  return ctx_.alloc(v.data.size() * sizeof(float), v.data.data());
}

vision_forward::matrix vision_forward::upload(const clip_tensor& w, const clip_tensor& b) {
  matrix out;
  out.rows = static_cast<int>(w.rows);
  out.cols = static_cast<int>(w.cols);
  out.w = upload(w);
  if (!b.empty()) out.b = upload(b);
  return out;
}

void vision_forward::linear(const matrix& m, const cl::buffer& x, const cl::buffer& y, int rows) {
  k_linear_.args(x, m.w, m.b ? m.b : dummy_, y, m.cols, m.rows, m.b ? 1 : 0, 0);
  ctx_.launch(k_linear_, {static_cast<size_t>(m.rows), static_cast<size_t>(rows)});
}

void vision_forward::layer_norm(const cl::buffer& w, const cl::buffer& b, const cl::buffer& x,
                                const cl::buffer& y, int rows) {
  k_norm_.args(x, w, b, y, model_->hp.n_embd, model_->hp.eps);
  ctx_.launch(k_norm_, {static_cast<size_t>(rows)});
}

void vision_forward::activate(const cl::buffer& x, size_t n, vision_activation act) {
  k_act_.args(x, act == vision_activation::gelu ? gelu_tab_ : quick_tab_, static_cast<int>(act));
  ctx_.launch(k_act_, {n});
}

std::vector<float> vision_forward::encode(const std::vector<float>& input) {
  const auto& hp = model_->hp;
  const int S = hp.image_size, P = hp.patch_size, side = hp.patches_per_side();
  const int D = hp.n_embd, n_patch = hp.n_patches(), n_pos = hp.n_positions();
  if (input.size() != 3u * S * S)
    throw std::invalid_argument("encoder input of " + std::to_string(input.size()) +
                                " values where 3 x " + std::to_string(S) + " x " +
                                std::to_string(S) + " are taken");
  // The patches as rows (row-major over the grid), each in (channel, y,
  // x) order as the convolution's kernel, rounded to half as ggml's
  // im2col does.
  const int cols = 3 * P * P;
  std::vector<float> patches(static_cast<size_t>(n_patch) * cols);
  for (int py = 0; py < side; ++py)
    for (int px = 0; px < side; ++px)
      for (int c = 0; c < 3; ++c)
        for (int ky = 0; ky < P; ++ky)
          for (int kx = 0; kx < P; ++kx)
            patches[(static_cast<size_t>(py) * side + px) * cols + (c * P + ky) * P + kx] =
                to_half_and_back(
                    input[(static_cast<size_t>(c) * S + py * P + ky) * S + px * P + kx]);
  const size_t fD = sizeof(float) * D;
  cl::buffer in = ctx_.alloc(patches.size() * sizeof(float), patches.data());
  cl::buffer cur = ctx_.alloc(n_pos * fD), h = ctx_.alloc(n_pos * fD), t = ctx_.alloc(n_pos * fD);
  cl::buffer q = ctx_.alloc(n_pos * fD), k = ctx_.alloc(n_pos * fD), v = ctx_.alloc(n_pos * fD);
  cl::buffer ff = ctx_.alloc(static_cast<size_t>(n_pos) * hp.n_ff * sizeof(float));
  linear(patch_, in, cur, n_patch);
  // llama.cpp's LLaVA graph appends the class token after the patches
  // (HF CLIP puts it first), then adds position rows in that order.
  if (class_) ctx_.copy(class_, cur, fD, static_cast<size_t>(n_patch) * fD);
  k_add_.args(cur, pos_);
  ctx_.launch(k_add_, {static_cast<size_t>(n_pos) * D});
  if (pre_w_) {
    layer_norm(pre_w_, pre_b_, cur, h, n_pos);
    std::swap(cur, h);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim()));
  for (const auto& l : layers_) {
    layer_norm(l.ln1_w, l.ln1_b, cur, h, n_pos);
    linear(l.q, h, q, n_pos);
    linear(l.k, h, k, n_pos);
    linear(l.v, h, v, n_pos);
    k_attn_.args(q, k, v, h, n_pos, hp.n_head, hp.head_dim(), scale);
    ctx_.launch(k_attn_, {static_cast<size_t>(n_pos), static_cast<size_t>(hp.n_head)});
    linear(l.o, h, t, n_pos);
    k_add_.args(cur, t);
    ctx_.launch(k_add_, {static_cast<size_t>(n_pos) * D});
    layer_norm(l.ln2_w, l.ln2_b, cur, h, n_pos);
    linear(l.up, h, ff, n_pos);
    activate(ff, static_cast<size_t>(n_pos) * hp.n_ff, hp.act);
    linear(l.down, ff, t, n_pos);
    k_add_.args(cur, t);
    ctx_.launch(k_add_, {static_cast<size_t>(n_pos) * D});
  }
  if (post_w_) {
    layer_norm(post_w_, post_b_, cur, h, n_pos);
    std::swap(cur, h);
  }
  // The projector reads rows 1..n_patches where there is a class token
  // (llama.cpp's: the first patch is dropped, the class token kept).
  const int first = class_ ? 1 : 0;
  cl::buffer mid = ctx_.alloc(static_cast<size_t>(n_patch) * mm0_.rows * sizeof(float));
  cl::buffer out = ctx_.alloc(static_cast<size_t>(n_patch) * mm2_.rows * sizeof(float));
  k_linear_.args(cur, mm0_.w, mm0_.b, mid, mm0_.cols, mm0_.rows, 1, first);
  ctx_.launch(k_linear_, {static_cast<size_t>(mm0_.rows), static_cast<size_t>(n_patch)});
  activate(mid, static_cast<size_t>(n_patch) * mm0_.rows, vision_activation::gelu);
  linear(mm2_, mid, out, n_patch);
  std::vector<float> result(static_cast<size_t>(n_patch) * mm2_.rows);
  ctx_.read(out, result.data(), result.size() * sizeof(float));
  return result;
}

}  // namespace troupe
