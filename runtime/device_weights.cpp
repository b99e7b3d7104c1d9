#include "runtime/device_weights.hpp"

#include <cstring>

namespace troupe {

namespace {

// Bytes of the scale (and min) header at the start of a block of each type.
struct block_layout {
  size_t header;  // 2 (d) or 4 (d, m)
  size_t quants;  // bytes of quants per block
  bool has_min;
};

block_layout layout_of(tensor_type t) {
  switch (t) {
    case tensor_type::q4_0:
      return {2, 16, false};
    case tensor_type::q4_1:
      return {4, 16, true};
    case tensor_type::q8_0:
      return {2, 32, false};
    default:
      return {0, 0, false};
  }
}

bool quantized(tensor_type t) {
  return layout_of(t).quants != 0;
}

}  // namespace

device_matrix upload_matrix(cl::context& ctx, const std::vector<const tensor_view*>& parts) {
  device_matrix out;
  const tensor_view& first = *parts.front();
  out.type = first.type;
  out.cols = first.row_len();
  for (const auto* p : parts) {
    if (p->type != out.type || p->row_len() != out.cols)
      throw model_error("tensor '" + p->name + "' does not match '" + first.name +
                        "' in type or row length, so they cannot be fused");
    out.rows += p->rows();
  }
  if (out.cols % 32 != 0)
    throw model_error("tensor '" + first.name + "' has rows of " + std::to_string(out.cols) +
                      " values; troupe needs a multiple of 32");
  if (!quantized(out.type)) {
    std::vector<uint8_t> raw;
    for (const auto* p : parts) raw.insert(raw.end(), p->data, p->data + p->bytes);
    out.q = ctx.alloc(raw.size(), raw.data());
    out.d = ctx.alloc(4);
    out.m = ctx.alloc(4);
    return out;
  }
  const auto lay = layout_of(out.type);
  const size_t block_bytes = lay.header + lay.quants;
  const size_t n_blocks = static_cast<size_t>(out.rows) * (out.cols / 32);
  std::vector<uint8_t> q(n_blocks * lay.quants);
  std::vector<float> d(n_blocks), m(lay.has_min ? n_blocks : 1);
  size_t blk = 0;
  for (const auto* p : parts) {
    const size_t nb = p->bytes / block_bytes;
    for (size_t i = 0; i < nb; ++i, ++blk) {
      const uint8_t* src = p->data + i * block_bytes;
      uint16_t h[2];
      std::memcpy(h, src, lay.header);
      d[blk] = half_to_float(h[0]);
      if (lay.has_min) m[blk] = half_to_float(h[1]);
      std::memcpy(&q[blk * lay.quants], src + lay.header, lay.quants);
    }
  }
  out.q = ctx.alloc(q.size(), q.data());
  out.d = ctx.alloc(d.size() * sizeof(float), d.data());
  out.m = ctx.alloc(m.size() * sizeof(float), m.data());
  return out;
}

cl::buffer upload_vector(cl::context& ctx, const tensor_view& t) {
  std::vector<float> v(static_cast<size_t>(t.row_len() * t.rows()));
  dequantize_row(t.type, t.data, v.data(), static_cast<int64_t>(v.size()));
  return ctx.alloc(v.size() * sizeof(float), v.data());
}

device_weights upload_weights(cl::context& ctx, const model_file& model) {
  device_weights w;
  const auto& hp = model.hparams();
  w.embedding = upload_matrix(ctx, {&model.tensor("token_embd.weight")});
  if (const auto* out = model.find_tensor("output.weight"))
    w.output = std::make_unique<device_matrix>(upload_matrix(ctx, {out}));
  w.output_norm = upload_vector(ctx, model.tensor("output_norm.weight"));
  for (int l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto t = [&](const char* name) -> const tensor_view* { return &model.tensor(p + name); };
    device_layer layer;
    layer.attn_norm = upload_vector(ctx, *t("attn_norm.weight"));
    layer.ffn_norm = upload_vector(ctx, *t("ffn_norm.weight"));
    layer.qkv = upload_matrix(ctx, {t("attn_q.weight"), t("attn_k.weight"), t("attn_v.weight")});
    layer.wo = upload_matrix(ctx, {t("attn_output.weight")});
    layer.gate_up = upload_matrix(ctx, {t("ffn_gate.weight"), t("ffn_up.weight")});
    layer.down = upload_matrix(ctx, {t("ffn_down.weight")});
    w.layers.push_back(std::move(layer));
  }
  for (const auto& [name, tv] : model.tensors()) w.bytes += tv.bytes;
  return w;
}

}  // namespace troupe
