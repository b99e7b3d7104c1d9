#include "runtime/device/llama_forward.hpp"

#include "runtime/device/gelu_table.hpp"
#include "runtime/device/weight_arena.hpp"
#include "runtime/engine/step_overlap.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace troupe {

namespace {

// A weight type's slot in llama_forward's kernel caches and its
// k_type_suffix (and the embedding's et in kernels/layer.cl).
int type_slot(tensor_type t) {
  switch (t) {
    case tensor_type::f32:
      return 0;
    case tensor_type::f16:
      return 1;
    case tensor_type::q4_0:
      return 2;
    case tensor_type::q4_1:
      return 3;
    case tensor_type::q8_0:
      return 4;
    case tensor_type::ku6:
      return 5;
    case tensor_type::q5_1:
      return 6;
    case tensor_type::bf16:
      return 7;
    case tensor_type::f32p:
      return 8;
    case tensor_type::q5_0:
      return 9;
    case tensor_type::q4_1p:
      return 10;
    case tensor_type::q8_0p:
      return 11;
    case tensor_type::iq4_nl:  // held as Q8_0, Q4_1, KU6 or F32 on the device (device_weights)
    case tensor_type::q4_k:
    case tensor_type::q6_k:
    case tensor_type::q2_k:
    case tensor_type::q3_k:
    case tensor_type::q5_k:
      break;
  }
  throw std::logic_error("unsupported tensor type");
}

const char* slot_suffix[3] = {"_t1", "_t4", "_tiled"};

}  // namespace

engine_options engine_options_from(const engine_settings& s, cl::device_choice where) {
  engine_options o;
  o.device = where;
  o.page_size = s.page_size;
  o.kv_bytes = static_cast<size_t>(s.kv_mb) << 20;
  o.kv_f16 = !s.kv_f32;
  o.max_batch_tokens = std::max(s.batch, s.max_batch_tokens);
  o.rows_per_item = s.rows_per_item;
  o.group_size = s.group_size;
  o.token_tile = s.token_tile;
  o.attention_rows = s.attention_rows;
  o.int8_dot = s.int8_dot;
  o.graph = s.graph;
  o.flash_attention = s.flash_attention;
  o.fuse_layers = s.fuse_layers;
  o.fuse_step = s.fuse_step;
  o.int8_panels = s.int8_panels;
  o.queue_steps = s.queue_steps;
  o.expert_devices = s.expert_devices;
  o.pipeline_stages = s.pipeline_parallel;
  o.pipeline_rebalance = s.pipeline_rebalance;
  o.pipeline_nodes = s.pipeline_nodes;
  o.pipeline_placement = s.pipeline_placement;
  o.pipeline_device_mb = s.pipeline_device_mb;
  o.settings = std::make_shared<const engine_settings>(s);
  return o;
}

std::vector<float> rope_table(const std::vector<int32_t>& positions, int rope_dims,
                              float theta_base, float freq_scale,
                              const std::vector<float>& freq_factors) {
  // Angles as ggml computes them (float: theta_scale = base^(-2/d), the
  // angle multiplied down pair by pair, divided by the pair's frequency
  // factor and then scaled), so rotations match llama.cpp's.
  const int half = rope_dims / 2;
  const float theta_scale = std::pow(theta_base, -2.0f / static_cast<float>(rope_dims));
  const bool factors = freq_factors.size() == static_cast<size_t>(half);
  std::vector<float> out(positions.size() * half * 2);
  for (size_t t = 0; t < positions.size(); ++t) {
    float theta = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = freq_scale * (factors ? theta / freq_factors[i] : theta);
      out[(t * half + i) * 2] = std::cos(angle);
      out[(t * half + i) * 2 + 1] = std::sin(angle);
      theta *= theta_scale;
    }
  }
  return out;
}

std::string kernel_build_options(const cl::context& ctx, int token_tile, bool kv_f16) {
  return std::string("-cl-std=CL1.2 -cl-mad-enable -DTROUPE_TILE=") + std::to_string(token_tile) +
         (kv_f16 ? " -DTROUPE_KV_F16" : "") + (ctx.cpu() ? " -DTROUPE_FUSED_LAYERS" : "") +
         (ctx.x86_vnni() ? " -DTROUPE_VNNI" : "") + (ctx.x86_avx512() ? " -DTROUPE_AVX512" : "") +
         (ctx.x86_avx2() ? " -DTROUPE_AVX2" : "");
}

std::string llama_forward::build_options() const {
  return kernel_build_options(ctx_, opts_.token_tile, opts_.kv_f16);
}

llama_forward::llama_forward(std::shared_ptr<const model_file> model, const engine_options& opts)
    : model_(std::move(model)),
      opts_(opts),
      ctx_(opts.device,
           model_->hparams().n_expert > 0 && opts.expert_devices >= 2 ? opts.expert_devices : 0) {
  // Token tile 0: the host's.  An 8-token tile keeps 16 accumulators of
  // 16 floats, twice AVX2's 16 registers (spills): SmolLM2 pp512 +10-15%
  // with 4 on a Zen 3 host (docs/bench_engine.md); on AVX-512 8 measured best.
  if (opts_.token_tile <= 0) opts_.token_tile = ctx_.x86_avx2() ? 4 : 8;
  const auto& hp = hparams();
  if (hp.head_dim % 16 != 0 || hp.head_dim > 256)
    throw model_error(model_->path() + ": head dimension " + std::to_string(hp.head_dim) +
                      " is not supported (needs a multiple of 16, at most 256)");
  if (hp.n_head % hp.n_head_kv != 0)
    throw model_error(model_->path() + ": head count " + std::to_string(hp.n_head) +
                      " is not a multiple of the KV head count " + std::to_string(hp.n_head_kv));
  if (opts_.page_size <= 0) throw std::invalid_argument("page_size must be positive");
  const int layer_end = opts_.layer_end > 0 ? opts_.layer_end : hp.n_layer;
  if (opts_.layer_first < 0 || opts_.layer_first >= layer_end || layer_end > hp.n_layer)
    throw std::invalid_argument("layers [" + std::to_string(opts_.layer_first) + ", " +
                                std::to_string(layer_end) + ") are not a range of the model's " +
                                std::to_string(hp.n_layer));
  layer_first_ = opts_.layer_first;
  if (hp.n_expert > 0 && (layer_first_ > 0 || layer_end < hp.n_layer))
    throw model_error(model_->path() +
                      ": a mixture-of-experts model runs on one device (no pipeline stages)");
  ctx_.build(build_options());
  weights_ = upload_weights(ctx_, *model_, expert_devices(), layer_first_, layer_end,
                            opts_.int8_dot && opts_.int8_panels);

  n_pages_ =
      opts_.n_pages > 0 ? opts_.n_pages : static_cast<int>(opts_.kv_bytes / kv_bytes_per_page());
  if (n_pages_ <= 0) throw std::invalid_argument("KV arena holds no page; raise kv_bytes");
  const size_t cache_bytes = kv_bytes_per_page() / 2 * static_cast<size_t>(n_pages_);
  k_cache_ = ctx_.alloc(cache_bytes);
  v_cache_ = ctx_.alloc(cache_bytes);

  k_embed_ =
      ctx_.make_kernel(std::string("embed_") + k_type_suffix[type_slot(weights_.embedding.type)]);
  k_rmsnorm_ = ctx_.make_kernel("rmsnorm");
  k_rmsnorm_q8_ = ctx_.make_kernel("rmsnorm_q8");
  k_quant_ = ctx_.make_kernel("quantize_q8");
  k_attn_ = ctx_.make_kernel("attention");
  k_argmax_ = ctx_.make_kernel("argmax_rows");
  k_sample_ = ctx_.make_kernel("sample_rows");
  k_penalize_ = ctx_.make_kernel("penalize_rows");
  if (hp.embd_scale != 1.0f) k_scale_ = ctx_.make_kernel("scale_values");
  if (hp.final_logit_softcap > 0.0f) k_softcap_ = ctx_.make_kernel("softcap_values");
  if (hp.qk_norm) k_qk_norm_ = ctx_.make_kernel("qk_norm_rope");
  if (hp.sandwich_norms) k_norm_add_ = ctx_.make_kernel("rmsnorm_add");
  // GELU's table (kernels/common.cl's gelu_from_table); a placeholder
  // where the FFN is SiLU (the kernels take the argument either way).
  if (hp.gelu_ffn) {
    const auto tab = gelu_half_table();
    gelu_tab_ = ctx_.alloc(tab.size() * sizeof(uint16_t), tab.data());
  } else {
    gelu_tab_ = ctx_.alloc(4);
  }
  if (can_fuse_step()) {
    auto offs = pack_layer_weights(ctx_, weights_.layers, weights_.arena);
    // Each layer's spare slot: down's activation format (layer.cl's dn_fmt).
    for (size_t l = 0; l < weights_.layers.size() && !offs.empty(); ++l)
      offs[(l + 1) * k_arena_slots - 1] = input_format(weights_.layers[l].down);
    if (!offs.empty()) step_offs_ = ctx_.alloc(offs.size() * sizeof(int64_t), offs.data());
  }
  // Fused layers' counters (kernels/layer.cl's LAYER_CTRS per layer: two
  // per phase of its at most twelve, one for the groups that are through,
  // one spare); a whole step uses a set per layer and one of its own.
  constexpr size_t k_layer_counters = 26;
  const std::vector<int32_t> ctr_zeros(k_layer_counters * (static_cast<size_t>(hp.n_layer) + 1), 0);
  layer_ctr_ = ctx_.alloc(ctr_zeros.size() * 4, ctr_zeros.data());
  if (hp.n_expert > 0) {
    k_moe_route_ = ctx_.make_kernel("moe_route");
    k_moe_combine_ = ctx_.make_kernel("moe_combine");
    const std::vector<int32_t> zeros(static_cast<size_t>(hp.n_layer) * hp.n_expert, 0);
    expert_counts_ = ctx_.alloc(zeros.size() * 4, zeros.data());
    for (const auto& L : weights_.layers)
      moe_slot_capacity_ = std::max(moe_slot_capacity_, L.moe->n_slots());
    moe_slot_off_ = ctx_.alloc((static_cast<size_t>(moe_slot_capacity_) + 1) * 4);
  }
  ensure_scratch(std::max(opts_.max_batch_tokens, 1), 1);
  ensure_draws(1);
}

size_t llama_forward::kv_bytes_per_page() const {
  const auto& hp = hparams();
  const size_t elem = opts_.kv_f16 ? 2 : 4;
  return 2 * weights_.layers.size() * hp.n_head_kv * opts_.page_size * hp.head_dim * elem;
}

int llama_forward::tile_for(int rows) const {
  if (rows <= 1 || opts_.token_tile <= 1) return 1;
  return rows >= opts_.token_tile ? opts_.token_tile : std::min(4, opts_.token_tile);
}

int llama_forward::tile_slot(int rows) const {
  const int tile = tile_for(rows);
  return tile == 1 ? 0 : tile == opts_.token_tile ? 2 : 1;
}

cl::kernel& llama_forward::family_kernel(mm_family f, tensor_type t, int rows, bool xq) {
  static const char* family_prefix[5] = {"matmul_", "matmul_glu_", "matmul_qkv_", "matmul_id_",
                                         "matmul_id_glu_"};
  const int slot = tile_slot(rows);
  auto& k = k_mm_[xq ? 1 : 0][static_cast<int>(f)][type_slot(t)][slot];
  if (!k.get())
    k = ctx_.make_kernel(std::string(family_prefix[static_cast<int>(f)]) + (xq ? "xq_" : "") +
                         k_type_suffix[type_slot(t)] + slot_suffix[slot]);
  return k;
}

bool llama_forward::k_down(const device_layer& L) const {
  const auto& hp = hparams();
  return (L.qkv.type == tensor_type::q8_0 || L.qkv.type == tensor_type::q8_0p ||
          L.qkv.type == tensor_type::q5_1 || L.qkv.type == tensor_type::q5_0) &&
         L.down.q8_k_acts && int8_for(L.down) &&
         (L.down.type == tensor_type::ku6 || L.down.type == tensor_type::q4_1) &&
         hp.n_ff % 256 == 0;
}

bool llama_forward::gemma_fused(const device_layer& L) const {
  const auto& h = hparams();
  auto k_quant_int8 = [&](const device_matrix& m) {
    return m.q8_k_acts && int8_for(m) &&
           (m.type == tensor_type::ku6 || m.type == tensor_type::q4_1);
  };
  return h.qk_norm && h.sandwich_norms && h.gelu_ffn && !L.qkv_bias &&
         L.qkv.type == tensor_type::q8_0 && quantized_inline(L.qkv) &&
         (L.gate_up.type == tensor_type::q8_0 || L.gate_up.type == tensor_type::q5_0) &&
         quantized_inline(L.gate_up) && k_quant_int8(L.wo) && k_quant_int8(L.down) &&
         h.head_dim % 32 == 0 && h.head_dim <= 256 && (h.n_head * h.head_dim) % 256 == 0 &&
         h.n_ff % 256 == 0 && h.n_embd % 32 == 0;
}

bool llama_forward::fused(const device_layer& L) const {
  // Heads attending elsewhere leave the layer between its launches.
  if (!opts_.fuse_layers || !ctx_.cpu() || L.moe || away_call_) return false;
  // Gemma 3's layers (QK-norm, sandwich norms, GELU, windows) as its
  // Q4_K_M files hold them: layer.cl's layer_gemma_* kernels.
  const auto& h = hparams();
  if (h.qk_norm || h.sandwich_norms || h.gelu_ffn) return gemma_fused(L);
  if (h.sliding_window > 0) return false;
  // Nor Q8_K activations (K-quant weights), but for a K-quant down beside
  // Q8_0, Q5_1 or Q5_0 products.
  const bool kd = k_down(L);
  for (const device_matrix* m : {&L.qkv, &L.wo, &L.gate_up, &L.down})
    if (m->q8_k_acts && !(kd && m == &L.down)) return false;
  const tensor_type t = L.qkv.type;
  for (const device_matrix* m : {&L.wo, &L.gate_up, &L.down})
    if (m->type != t && !(kd && m == &L.down)) return false;
  // layer.cl has float activations for float weights, quantized ones
  // (with attention and the FFN writing theirs quantized: whole blocks)
  // for quantized weights.
  if (t == tensor_type::f32 || t == tensor_type::f32p || t == tensor_type::f16 ||
      t == tensor_type::bf16)
    return true;
  const auto& hp = hparams();
  return int8_for(L.qkv) && hp.head_dim % 32 == 0 && hp.n_ff % 32 == 0;
}

int llama_forward::fused_layers() const {
  return static_cast<int>(std::count_if(weights_.layers.begin(), weights_.layers.end(),
                                        [this](const device_layer& L) { return fused(L); }));
}

cl::kernel& llama_forward::layer_kernel(bool whole_step, const device_layer& L, int T) {
  const int slot = tile_slot(T);
  if (hparams().qk_norm) {  // Gemma's (no whole step), by gate/up's type
    const bool q5_0 = L.gate_up.type == tensor_type::q5_0;
    auto& k = k_layer_gemma_[q5_0 ? 1 : 0][slot];
    if (!k.get())
      k = ctx_.make_kernel(std::string("layer_gemma_xq_") + (q5_0 ? "q5_0" : "q8_0") +
                           slot_suffix[slot]);
    return k;
  }
  const bool kd = k_down(L);
  auto& k = (whole_step ? k_step_ : k_layer_)[type_slot(L.qkv.type)][kd ? 1 : 0][slot];
  if (!k.get())
    k = ctx_.make_kernel(std::string(whole_step ? "step_" : "layer_") +
                         (int8_for(L.qkv) ? "xq_" : "") + k_type_suffix[type_slot(L.qkv.type)] +
                         (kd ? "_kd" : "") + slot_suffix[slot]);
  return k;
}

void llama_forward::layer_step(const device_layer& L, int layer, int T, int att_rows) {
  auto& k = layer_kernel(false, L, T);
  const cl_uint io =
      k.args_from(0, L.qkv.q, L.qkv.d, L.qkv.m, L.wo.q, L.wo.d, L.wo.m, L.gate_up.q, L.gate_up.d,
                  L.gate_up.m, L.down.q, L.down.d, L.down.m, L.attn_norm, L.ffn_norm,
                  L.qkv_bias ? L.qkv_bias : row_seq_ /*unused*/, L.qkv_bias ? 1 : 0, layer,
                  input_format(L.down));
  const cl_uint next =
      k.args_from(layer_io_args(k, io, T, att_rows, quantized_inline(L.down), layer), layer_ctr_);
  if (hparams().qk_norm) {
    const auto& hp = hparams();
    const bool swa = hp.is_swa(layer_first_ + layer);
    k.args_from(next, L.q_norm, L.k_norm, L.post_attn_norm, L.post_ffn_norm, input_format(L.wo),
                swa ? hp.sliding_window : 0, gelu_tab_);
  }
  // One work-group of one work-item per compute unit (see kernels/layer.cl).
  ctx_.launch(k, {static_cast<size_t>(ctx_.compute_units())}, {1});
}

cl_uint llama_forward::layer_io_args(cl::kernel& k, cl_uint first, int T, int att_rows, bool h_q8,
                                     int layer) {
  const auto& hp = hparams();
  const auto& L = weights_.layers[static_cast<size_t>(layer)];
  const int neox = hp.rope == rope_layout::neox ? 1 : 0;
  // As step_apart: the file's attention scale where it gives one.
  const float scale = hp.attention_scale();
  // A windowed layer's own RoPE table (its own base), as step_apart.
  const cl::buffer& rope = hp.is_swa(layer_first_ + layer) ? rope_swa_ : rope_;
  return k.args_from(first, x_, xn_, qa_.q, qa_.d, qa_.s, qkv_, att_, qb_.q, qb_.d, qb_.s, h_,
                     k_cache_, v_cache_, pos_, row_seq_, pt_, pt_off_, rope, T, hp.n_embd, hp.n_ff,
                     hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims, neox, opts_.page_size,
                     n_pages_, scale, hp.rms_eps, att_rows, opts_.flash_attention ? 1 : 0,
                     grid(L.wo.type, hp.n_embd, T).rows_per_item,
                     glu_grid(L.gate_up.type, hp.n_ff, h_q8).rows_per_item);
}

bool llama_forward::can_fuse_step() const {
  // A pipeline stage runs apart: its input or output is hidden states.
  if (!opts_.fuse_step || weights_.layers.empty() || !first_stage() || !last_stage()) return false;
  // layer.cl's final norm quantizes per 32 for an integer classifier: a
  // K-quant one (Q8_K activations) runs after a step apart.
  if (weights_.classifier().q8_k_acts) return false;
  // Gemma's layers have no whole-step form.
  if (hparams().qk_norm) return false;
  const tensor_type t = weights_.layers.front().qkv.type;
  // One kernel for every layer: the same type, all with a K-quant down or none.
  const bool kd = k_down(weights_.layers.front());
  return std::all_of(weights_.layers.begin(), weights_.layers.end(), [&](const device_layer& L) {
    return fused(L) && L.qkv.type == t && k_down(L) == kd;
  });
}

void llama_forward::whole_step(int T, int R, int att_rows) {
  const auto& hp = hparams();
  const auto& L0 = weights_.layers.front();
  auto& k = layer_kernel(true, L0, T);
  const auto& emb = weights_.embedding;
  const bool logits_q8 = int8_for(weights_.classifier());
  const cl_uint io = k.args_from(0, weights_.arena, step_offs_, hp.n_layer, type_slot(emb.type),
                                 emb.q, emb.d, emb.m, tokens_, drawn_, weights_.output_norm,
                                 logit_rows_, R, logits_q8 ? 1 : 0, xo_);
  k.args_from(layer_io_args(k, io, T, att_rows, quantized_inline(L0.down), 0), layer_ctr_);
  ctx_.launch(k, {static_cast<size_t>(ctx_.compute_units())}, {1});
}

bool llama_forward::int8_for(const device_matrix& w) const {
  // Quantized panels have integer kernels only (device_weights holds them
  // so only where int8_dot is on).
  return w.type == tensor_type::q4_1p || w.type == tensor_type::q8_0p ||
         (opts_.int8_dot && (w.type == tensor_type::q4_0 || w.type == tensor_type::q4_1 ||
                             w.type == tensor_type::q8_0 || w.type == tensor_type::ku6 ||
                             w.type == tensor_type::q5_1 || w.type == tensor_type::q5_0));
}

int llama_forward::input_format(const device_matrix& w) {
  return !w.q8_k_acts ? 0 : w.type == tensor_type::ku6 ? 2 : 1;
}

void llama_forward::quantize(const cl::buffer& x, int K, int rows, const q8_scratch& out,
                             const device_matrix& w) {
  if (w.q8_k_acts) {
    if (!k_quant_k_.get()) k_quant_k_ = ctx_.make_kernel("quantize_q8_k");
    k_quant_k_.args(x, K, out.q, out.d, out.s, input_format(w) == 2 ? 1 : 0);
    // A CPU device: work-groups of one item (PoCL builds a work-group
    // function per local size); elsewhere the driver's choice.
    if (ctx_.cpu())
      ctx_.launch(k_quant_k_, {static_cast<size_t>(K / 256), static_cast<size_t>(rows)}, {1, 1});
    else
      ctx_.launch(k_quant_k_, {static_cast<size_t>(K / 256), static_cast<size_t>(rows)});
    return;
  }
  k_quant_.args(x, K, out.q, out.d, out.s);
  ctx_.launch(k_quant_, {static_cast<size_t>(K / 32), static_cast<size_t>(rows)},
              {static_cast<size_t>(K / 32), 1});
}

void llama_forward::round_for(const device_matrix& w, const cl::buffer& x, int rows) {
  if (!w.q8_k_acts || int8_for(w)) return;
  if (!k_round_k_.get()) k_round_k_ = ctx_.make_kernel("round_q8_k");
  const int K = static_cast<int>(w.cols);
  k_round_k_.args(x, K);
  ctx_.launch(k_round_k_, {static_cast<size_t>(K / 256), static_cast<size_t>(rows)});
}

const llama_forward::q8_scratch* llama_forward::normed_input(const device_matrix& w, int rows) {
  if (!int8_for(w)) return nullptr;
  if (w.q8_k_acts) quantize(xn_, static_cast<int>(w.cols), rows, qa_, w);
  return &qa_;
}

void llama_forward::norm(const cl::buffer& weight, bool to_q8, int n, const cl::buffer* rows) {
  const auto& hp = hparams();
  const cl::buffer& gather_rows = rows ? *rows : row_seq_ /*unused*/;
  const int gather = rows ? 1 : 0;
  if (to_q8)
    k_rmsnorm_q8_.args(x_, weight, qa_.q, qa_.d, qa_.s, gather_rows, gather, hp.n_embd, hp.rms_eps);
  else
    k_rmsnorm_.args(x_, weight, rows ? xo_ : xn_, gather_rows, gather, hp.n_embd, hp.rms_eps);
  ctx_.launch(to_q8 ? k_rmsnorm_q8_ : k_rmsnorm_, {static_cast<size_t>(n)}, {1});
}

cl_uint llama_forward::matmul_inputs(cl::kernel& k, const device_matrix& w, const cl::buffer& x,
                                     const q8_scratch* xq) {
  return xq ? k.args_from(0, w.q, w.d, w.m, xq->q, xq->d, xq->s) : k.args_from(0, w.q, w.d, w.m, x);
}

size_t llama_forward::token_groups(int rows) const {
  const int tile = tile_for(rows);
  return static_cast<size_t>((rows + tile - 1) / tile);
}

bool llama_forward::ensure_scratch(int rows, int logit_rows) {
  const auto& hp = hparams();
  const bool grows = rows > scratch_rows_ || logit_rows > scratch_logit_rows_;
  if (rows > scratch_rows_) {
    const size_t r = static_cast<size_t>(rows);
    const size_t f = sizeof(float);
    const size_t qkv_w = static_cast<size_t>(hp.n_head + 2 * hp.n_head_kv) * hp.head_dim;
    x_ = ctx_.alloc(r * hp.n_embd * f);
    xn_ = ctx_.alloc(r * hp.n_embd * f);
    qkv_ = ctx_.alloc(r * qkv_w * f);
    att_ = ctx_.alloc(r * hp.n_head * hp.head_dim * f);
    const size_t ff = std::max(hp.n_ff, hp.n_ff_shared);  // dense or shared FFN rows
    h_ = ctx_.alloc(r * ff * f);
    // Quantized activations: the widest input of any matmul.
    const size_t k_max = std::max<size_t>({size_t(hp.n_embd), size_t(hp.n_head) * hp.head_dim, ff});
    for (q8_scratch* q : {&qa_, &qb_}) {
      q->q = ctx_.alloc(r * k_max);
      q->d = ctx_.alloc(r * (k_max / 32) * f);
      q->s = ctx_.alloc(r * (k_max / 32) * 2 * f);
    }
    if (hp.n_expert > 0) {
      const size_t a = r * static_cast<size_t>(hp.n_expert_used);  // assignments
      moe_logits_ = ctx_.alloc(r * hp.n_expert * f);
      moe_sel_ = ctx_.alloc(a * 4);
      moe_w_ = ctx_.alloc(a * f);
      moe_slot_rows_ = ctx_.alloc(a * 4);
      moe_h_ = ctx_.alloc(a * hp.n_ff * f);
      moe_y_ = ctx_.alloc(a * hp.n_embd * f);
      moe_hq_.q = ctx_.alloc(a * hp.n_ff);
      moe_hq_.d = ctx_.alloc(a * (hp.n_ff / 32) * f);
      moe_hq_.s = ctx_.alloc(a * (hp.n_ff / 32) * 2 * f);
      if (hp.n_ff_shared > 0) {
        shared_y_ = ctx_.alloc(r * hp.n_embd * f);
        shared_g_ = ctx_.alloc(r * f);
      }
    }
    tokens_ = ctx_.alloc(r * 4);
    pos_ = ctx_.alloc(r * 4);
    row_seq_ = ctx_.alloc(r * 4);
    scratch_rows_ = rows;
  }
  if (logit_rows > scratch_logit_rows_) {
    const size_t r = static_cast<size_t>(logit_rows);
    xo_ = ctx_.alloc(r * hp.n_embd * sizeof(float));
    logits_ = ctx_.alloc(r * hp.n_vocab * sizeof(float));
    logit_rows_ = ctx_.alloc(r * 4);
    scratch_logit_rows_ = logit_rows;
  }
  return grows;
}

void llama_forward::validate(const forward_batch& b, bool device_draws) const {
  const size_t rows = b.tokens.size();
  if (rows == 0) throw std::invalid_argument("batch has no rows");
  if (b.positions.size() != rows)
    throw std::invalid_argument("batch has " + std::to_string(rows) + " tokens but " +
                                std::to_string(b.positions.size()) + " positions");
  // A pipeline stage's input and output: hidden states between stages.
  const size_t input = first_stage() ? 0 : rows * static_cast<size_t>(hparams().n_embd);
  if (b.stage_input.size() != input)
    throw std::invalid_argument("stage input of " + std::to_string(b.stage_input.size()) +
                                " values where layer " + std::to_string(layer_first_) + " takes " +
                                std::to_string(input));
  if (!last_stage() && (!b.logit_rows.empty() || !b.hidden_rows.empty() || !b.presample.empty()))
    throw std::invalid_argument("a pipeline stage before the last has no logits or hidden rows");
  std::vector<int> owner(rows, -1);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const auto& q = b.seqs[s];
    if (q.n_rows <= 0 || q.first_row < 0 || static_cast<size_t>(q.first_row + q.n_rows) > rows)
      throw std::invalid_argument("sequence " + std::to_string(s) + " has rows out of range");
    for (int r = q.first_row; r < q.first_row + q.n_rows; ++r) {
      if (owner[r] != -1)
        throw std::invalid_argument("row " + std::to_string(r) + " belongs to two sequences");
      owner[r] = static_cast<int>(s);
      const int p = b.positions[r];
      if (p < 0 || p / opts_.page_size >= static_cast<int>(q.pages.size()))
        throw std::invalid_argument("sequence " + std::to_string(s) + " position " +
                                    std::to_string(p) + " is outside its page table");
    }
    for (int pg : q.pages)
      if (pg < 0 || pg >= n_pages_)
        throw std::invalid_argument("sequence " + std::to_string(s) + " names page " +
                                    std::to_string(pg) + " outside the arena");
  }
  for (size_t r = 0; r < rows; ++r) {
    if (owner[r] == -1)
      throw std::invalid_argument("row " + std::to_string(r) + " has no sequence");
    const int32_t tok = b.tokens[r];
    if (tok < 0 && -1 - tok < device_draws_) continue;  // a device draw of the last step
    if (tok < 0)
      throw std::invalid_argument("row " + std::to_string(r) + " names draw " +
                                  std::to_string(-1 - tok) + " of the last step, which made " +
                                  std::to_string(device_draws_) + " on the device");
    if (tok >= hparams().n_vocab)
      throw std::invalid_argument("token id " + std::to_string(tok) + " is outside the vocabulary");
  }
  for (int r : b.logit_rows)
    if (r < 0 || static_cast<size_t>(r) >= rows)
      throw std::invalid_argument("logit row " + std::to_string(r) + " out of range");
  for (int r : b.hidden_rows)
    if (r < 0 || static_cast<size_t>(r) >= rows)
      throw std::invalid_argument("hidden row " + std::to_string(r) + " out of range");
  if (b.embed_input.size() != b.embed_rows.size() * static_cast<size_t>(hparams().n_embd))
    throw std::invalid_argument(std::to_string(b.embed_input.size()) + " embedding values for " +
                                std::to_string(b.embed_rows.size()) + " rows of " +
                                std::to_string(hparams().n_embd));
  if (!b.embed_rows.empty() && !first_stage())
    throw std::invalid_argument("embedding rows go to the first pipeline stage");
  for (int r : b.embed_rows)
    if (r < 0 || static_cast<size_t>(r) >= rows)
      throw std::invalid_argument("embedding row " + std::to_string(r) + " out of range");
  // Checked here, before the step is enqueued, whoever draws: a row
  // outside the logits would fail the step only once it has run.
  for (const auto& p : b.presample)
    if (p.logit_index < 0 || static_cast<size_t>(p.logit_index) >= b.logit_rows.size())
      throw std::invalid_argument("presample: logit row " + std::to_string(p.logit_index) + " of " +
                                  std::to_string(b.logit_rows.size()));
  if (device_draws && !draws_on_device(b.presample))
    throw std::invalid_argument(
        "device draws: a presample row has an unsorted logit_bias or penalty counts");
}

void llama_forward::matmul(const device_matrix& w, const cl::buffer& x, const cl::buffer& y,
                           int rows, int ldy, bool accumulate, const q8_scratch* xq) {
  const bool int8 = int8_for(w);
  auto& k = family_kernel(mm_family::plain, w.type, rows, int8);
  const int K = static_cast<int>(w.cols), N = static_cast<int>(w.rows);
  if (int8 && !xq) {
    quantize(x, K, rows, qb_, w);
    xq = &qb_;
  }
  round_for(w, x, rows);
  const auto g = grid(w.type, N, rows);
  k.args_from(matmul_inputs(k, w, x, int8 ? xq : nullptr), y, K, N, rows, ldy, accumulate ? 1 : 0,
              g.rows_per_item);
  launch_grid(k, g, rows);
}

llama_forward::matmul_grid llama_forward::grid(tensor_type t, int units, int rows) const {
  matmul_grid g;
  g.rows_per_item = t == tensor_type::f32p ? k_panel_rows_per_item
                    : t == tensor_type::q4_1p || t == tensor_type::q8_0p
                        ? k_qpanel_rows_per_item
                        : std::max(1, opts_.rows_per_item);
  g.items = (units + g.rows_per_item - 1) / g.rows_per_item;
  g.local = static_cast<size_t>(std::max(1, opts_.group_size));
  return g;
}

llama_forward::matmul_grid llama_forward::glu_grid(tensor_type t, int F, bool quant_out) const {
  auto g = grid(t, F, 1);
  if (quant_out) {
    g.rows_per_item = (g.rows_per_item + 31) / 32 * 32;
    g.items = (F + g.rows_per_item - 1) / g.rows_per_item;
  }
  return g;
}

void llama_forward::launch_grid(const cl::kernel& k, const matmul_grid& g, int rows) {
  ctx_.launch(k, {static_cast<size_t>(g.items), token_groups(rows)}, {g.local, 1});
}

llama_forward::~llama_forward() {
  // The steps in flight write into flights_' memory: let them end first.
  try {
    ctx_.finish();
  } catch (const std::exception&) {
  }
}

forward_result llama_forward::run(const forward_batch& b) {
  submit(b, false);
  return collect();
}

void llama_forward::submit(const forward_batch& b, bool device_draws,
                           std::function<void(bool ok)> on_done) {
  validate(b, device_draws);
  const auto& hp = hparams();
  const int T = static_cast<int>(b.tokens.size());
  const int R = static_cast<int>(b.logit_rows.size());
  const int n_draws = device_draws ? static_cast<int>(b.presample.size()) : 0;
  // Penalized draws get rows of their own after the logit rows.
  const int n_penalized =
      device_draws
          ? static_cast<int>(std::count_if(b.presample.begin(), b.presample.end(), penalized_draw))
          : 0;
  bool grew = ensure_scratch(T, std::max(R + n_penalized, 1));
  grew = ensure_draws(std::max(n_draws, 1)) || grew;
  if (n_draws > 0) ensure_draw_inputs(b);

  // The writes below do not wait: what they read lives in the flight.
  auto f = std::make_unique<flight>();
  f->tokens = b.tokens;
  f->positions = b.positions;
  f->logit_rows = b.logit_rows;
  f->row_seq.resize(T);
  f->pt_off.resize(b.seqs.size());
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    f->pt_off[s] = static_cast<int32_t>(f->pt.size());
    f->pt.insert(f->pt.end(), b.seqs[s].pages.begin(), b.seqs[s].pages.end());
    for (int r = 0; r < b.seqs[s].n_rows; ++r)
      f->row_seq[b.seqs[s].first_row + r] = static_cast<int32_t>(s);
  }
  for (int k = 0, j = 0; k < n_draws; ++k)
    f->draw_rows.push_back(penalized_draw(b.presample[k]) ? R + j++ : b.presample[k].logit_index);
  if (pt_.bytes() < f->pt.size() * 4) {
    pt_ = ctx_.alloc(f->pt.size() * 4 * 2);
    grew = true;
  }
  if (pt_off_.bytes() < f->pt_off.size() * 4) {
    pt_off_ = ctx_.alloc(f->pt_off.size() * 4 * 2);
    grew = true;
  }
  f->rope = rope_table(b.positions, hp.rope_dims, hp.rope_theta, hp.rope_freq_scale,
                       hp.rope_freq_factors);
  if (rope_.bytes() < f->rope.size() * sizeof(float)) {
    rope_ = ctx_.alloc(f->rope.size() * sizeof(float) * 2);
    grew = true;
  }
  if (hp.sliding_window > 0) {
    f->rope_swa = rope_table(b.positions, hp.rope_dims, hp.rope_theta_swa);
    if (rope_swa_.bytes() < f->rope_swa.size() * sizeof(float)) {
      rope_swa_ = ctx_.alloc(f->rope_swa.size() * sizeof(float) * 2);
      grew = true;
    }
  }
  ctx_.write(tokens_, f->tokens.data(), T * 4);
  if (!first_stage()) {
    f->stage_input = b.stage_input;
    ctx_.write(x_, f->stage_input.data(), f->stage_input.size() * sizeof(float));
  }
  f->embed_rows = b.embed_rows;
  f->embed_input = b.embed_input;
  ctx_.write(pos_, f->positions.data(), T * 4);
  ctx_.write(row_seq_, f->row_seq.data(), T * 4);
  ctx_.write(pt_, f->pt.data(), f->pt.size() * 4);
  ctx_.write(pt_off_, f->pt_off.data(), f->pt_off.size() * 4);
  ctx_.write(logit_rows_, f->logit_rows.data(), R * 4);
  ctx_.write(rope_, f->rope.data(), f->rope.size() * sizeof(float));
  if (hp.sliding_window > 0)
    ctx_.write(rope_swa_, f->rope_swa.data(), f->rope_swa.size() * sizeof(float));

  // Rows of a prefill chunk share K/V loads in groups; a decode-only batch
  // (one row per sequence) keeps one row per work-item for parallelism.
  const int att_rows =
      T > static_cast<int>(b.seqs.size()) ? std::clamp(opts_.attention_rows, 1, 64) : 1;
  building_ = f.get();
  struct unset_at_exit {
    const flight*& p;
    ~unset_at_exit() { p = nullptr; }
  } unset_building{building_};
  // Recordings name the buffers they were made with.
  if (grew) graphs_.clear();
  if (graph_mode(T) && b.embed_rows.empty()) {
    const auto key = std::make_tuple(T, R, att_rows);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (graphs_.size() >= k_max_graphs) graphs_.clear();
      ctx_.begin_recording();
      try {
        enqueue_step(T, R, att_rows);
      } catch (...) {
        ctx_.end_recording();
        throw;
      }
      it = graphs_.emplace(key, ctx_.end_recording()).first;
    }
    ctx_.replay(it->second);
  } else {
    enqueue_step(T, R, att_rows);
  }
  if (n_draws > 0) enqueue_draws(b, *f);
  device_draws_ = n_draws;

  // Embedding rows: the final norm of their residual rows (x_ holds every
  // row's after the layers, in both step forms), read back beside the logits.
  const int H = static_cast<int>(b.hidden_rows.size());
  f->result.n_embd = hp.n_embd;
  if (H > 0) {
    if (H > hidden_capacity_) {
      hidden_capacity_ = std::max(H, 2 * hidden_capacity_);
      hidden_rows_ = ctx_.alloc(static_cast<size_t>(hidden_capacity_) * 4);
      xh_ = ctx_.alloc(static_cast<size_t>(hidden_capacity_) * hp.n_embd * sizeof(float));
    }
    f->hidden_rows = b.hidden_rows;
    ctx_.write(hidden_rows_, f->hidden_rows.data(), static_cast<size_t>(H) * 4);
    k_rmsnorm_.args(x_, weights_.output_norm, xh_, hidden_rows_, 1, hp.n_embd, hp.rms_eps);
    ctx_.launch(k_rmsnorm_, {static_cast<size_t>(H)}, {1});
    f->result.hidden.resize(static_cast<size_t>(H) * hp.n_embd);
    ctx_.read_async(xh_, f->result.hidden.data(), f->result.hidden.size() * sizeof(float));
  }
  f->result.n_vocab = hp.n_vocab;
  f->result.logits.resize(static_cast<size_t>(R) * hp.n_vocab);
  f->result.drawn.resize(static_cast<size_t>(n_draws));
  if (n_draws > 0) ctx_.read_async(drawn_, f->result.drawn.data(), f->result.drawn.size() * 4);
  if (!last_stage()) {
    // The next stage's input: every row's residual after this stage's layers.
    f->result.stage_output.resize(static_cast<size_t>(T) * hp.n_embd);
    f->done = ctx_.read_async(x_, f->result.stage_output.data(),
                              f->result.stage_output.size() * sizeof(float));
  } else {
    f->done = R > 0 ? ctx_.read_async(logits_, f->result.logits.data(),
                                      f->result.logits.size() * sizeof(float))
                    : ctx_.marker();
  }
  if (on_done) f->done.on_complete(std::move(on_done));
  flights_.push_back(std::move(f));
}

void llama_forward::write_embed_rows(const flight& f) {
  const size_t D = static_cast<size_t>(hparams().n_embd), n = f.embed_rows.size();
  // Runs of consecutive rows (an image's) go in one write each.
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && f.embed_rows[j] == f.embed_rows[j - 1] + 1) ++j;
    ctx_.write(x_, f.embed_input.data() + i * D, (j - i) * D * sizeof(float),
               static_cast<size_t>(f.embed_rows[i]) * D * sizeof(float));
    i = j;
  }
}

forward_result llama_forward::collect() {
  if (flights_.empty()) throw std::logic_error("collect: no step in flight");
  auto f = std::move(flights_.front());
  flights_.pop_front();
  f->done.wait();
  return std::move(f->result);
}

bool llama_forward::graph_mode(int rows) const {
  // Profiling times each launch, which a replay has none of.
  // Recordings are of the one queue: expert devices' queues are not in them.
  return opts_.graph && rows <= k_max_graph_rows && ctx_.command_buffers() && !ctx_.profiling() &&
         ctx_.shards() == 0 && !away_call_;
}

void llama_forward::enqueue_step(int T, int R, int att_rows) {
  // Embedding rows replace token embeddings between the embedding and the
  // first layer, which the whole-step launch has no gap for.
  if (fused_step() && building_->embed_rows.empty())
    whole_step(T, R, att_rows);
  else
    step_apart(T, R, att_rows);
  if (R == 0) return;
  // The final norm wrote qa_ where the classifier takes per-32
  // activations; else matmul quantizes xo_ as the classifier needs.
  const bool logits_q8 = quantized_inline(weights_.classifier());
  matmul(weights_.classifier(), xo_, logits_, R, hparams().n_vocab, false,
         logits_q8 ? &qa_ : nullptr);
  // Capped here, before anything reads them (the device's draws, the host).
  if (k_softcap_.get()) {
    const float cap = hparams().final_logit_softcap;
    const int n = R * hparams().n_vocab;
    k_softcap_.args(logits_, 1.0f / cap, cap, n);
    ctx_.launch(k_softcap_, {static_cast<size_t>(n)});
  }
}

void llama_forward::step_apart(int T, int R, int att_rows) {
  const auto& hp = hparams();
  const int D = hp.n_embd, hd = hp.head_dim;
  const int qkv_w = (hp.n_head + 2 * hp.n_head_kv) * hd;
  const int neox = hp.rope == rope_layout::neox ? 1 : 0;
  const float scale = hp.attention_scale();
  const int page_size = opts_.page_size;
  const auto& emb = weights_.embedding;
  const size_t uT = static_cast<size_t>(T);

  // A later pipeline stage's x_ holds the stage before's output already
  // (submit wrote it).
  if (first_stage()) {
    k_embed_.args(emb.q, emb.d, emb.m, tokens_, drawn_, x_, D);
    ctx_.launch(k_embed_, {static_cast<size_t>(D / 32), uT}, {static_cast<size_t>(D / 32), 1});
    if (k_scale_.get()) {
      k_scale_.args(x_, hp.embd_scale, T * D);
      ctx_.launch(k_scale_, {uT * static_cast<size_t>(D)});
    }
    // After the scale: llama.cpp scales token embeddings only (Gemma 3).
    write_embed_rows(*building_);
  }

  // l indexes this forward's layers (and its KV arena's); the model's
  // layer is layer_first_ + l.
  for (int l = 0; l < static_cast<int>(weights_.layers.size()); ++l) {
    const auto& L = weights_.layers[l];
    if (fused(L)) {
      layer_step(L, l, T, att_rows);
      continue;
    }
    const bool swa = hp.is_swa(layer_first_ + l);
    const cl::buffer& rope = swa ? rope_swa_ : rope_;
    {
      norm(L.attn_norm, quantized_inline(L.qkv), T);
      const q8_scratch* xq = normed_input(L.qkv, T);
      if (hp.qk_norm) {
        // Plain projection, then each head normed, rotated and stored.
        matmul(L.qkv, xn_, qkv_, T, qkv_w, false, xq);
        k_qk_norm_.args(qkv_, L.q_norm, L.k_norm, pos_, row_seq_, pt_, pt_off_, k_cache_, v_cache_,
                        hp.n_head, hp.n_head_kv, hd, hp.rope_dims, rope, neox, page_size, l,
                        n_pages_, hp.rms_eps);
        ctx_.launch(k_qk_norm_, {static_cast<size_t>(hp.n_head + 2 * hp.n_head_kv), uT});
      } else {
        round_for(L.qkv, xn_, T);  // the fused qkv kernel reads xn_ itself
        auto& k = family_kernel(mm_family::qkv, L.qkv.type, T, xq != nullptr);
        const auto gq = grid(L.qkv.type, qkv_w / 2, T);
        k.args_from(matmul_inputs(k, L.qkv, xn_, xq), qkv_, D, T, pos_, row_seq_, pt_, pt_off_,
                    k_cache_, v_cache_, hp.n_head, hp.n_head_kv, hd, hp.rope_dims, rope, neox,
                    page_size, l, n_pages_, gq.rows_per_item,
                    L.qkv_bias ? L.qkv_bias : row_seq_ /*unused*/, L.qkv_bias ? 1 : 0);
        launch_grid(k, gq, T);
      }
    }
    // Attention writes its output quantized too where Wo takes it so.
    const bool att_q8 = quantized_inline(L.wo) && hd % 32 == 0;
    if (away_call_) {
      attend_split(l, T, att_rows, att_q8, swa, scale);
    } else {
      k_attn_.args(qkv_, k_cache_, v_cache_, att_, pos_, row_seq_, pt_, pt_off_, hp.n_head,
                   hp.n_head_kv, hd, page_size, l, n_pages_, scale, T, att_rows, qb_.q, qb_.d,
                   qb_.s, att_q8 ? 1 : 0, opts_.flash_attention ? 1 : 0,
                   swa ? hp.sliding_window : 0, 0);
      // A work-group size independent of the row count (see
      // cl::context::launch), one work-item per group: that also spreads
      // one-token decode's heads over both cores (PoCL's choice put them all
      // in one group).
      ctx_.launch(
          k_attn_,
          {static_cast<size_t>(hp.n_head), static_cast<size_t>((T + att_rows - 1) / att_rows)},
          {1, 1});
    }
    // Sandwich norms: a sublayer's output goes to xn_ (free by then), is
    // normed and added to x_; otherwise it is added to x_ directly.
    const bool sandwich = hp.sandwich_norms;
    matmul(L.wo, att_, sandwich ? xn_ : x_, T, D, !sandwich, att_q8 ? &qb_ : nullptr);
    if (sandwich) norm_add(L.post_attn_norm, T);
    if (L.moe) {
      moe_ffn(L, l, T);
      continue;
    }
    norm(L.ffn_norm, quantized_inline(L.gate_up), T);
    const bool xq = normed_input(L.gate_up, T) != nullptr;
    glu_ffn(L.gate_up, L.down, hp.n_ff, T, xq, sandwich ? xn_ : x_, !sandwich);
    if (sandwich) norm_add(L.post_ffn_norm, T);
  }

  if (R > 0) norm(weights_.output_norm, quantized_inline(weights_.classifier()), R, &logit_rows_);
}

void llama_forward::norm_add(const cl::buffer& weight, int T) {
  const auto& hp = hparams();
  k_norm_add_.args(x_, xn_, weight, hp.n_embd, hp.rms_eps);
  ctx_.launch(k_norm_add_, {static_cast<size_t>(T)});
}

void llama_forward::glu_ffn(const device_matrix& gate_up, const device_matrix& down, int F, int T,
                            bool xq, const cl::buffer& y, bool accumulate) {
  const int D = hparams().n_embd;
  round_for(gate_up, xn_, T);  // the glu kernel reads xn_ itself
  auto& k = family_kernel(mm_family::glu, gate_up.type, T, xq);
  // The FFN writes h quantized too where down takes it so: each work-item
  // then holds whole blocks of 32.
  const bool h_q8 = quantized_inline(down) && F % 32 == 0;
  const auto gg = glu_grid(gate_up.type, F, h_q8);
  // kernels/matmul.cl's GLU_QUANT_OUT and GLU_GELU bits.
  const int flags = (h_q8 ? 1 : 0) | (hparams().gelu_ffn ? 2 : 0);
  k.args_from(matmul_inputs(k, gate_up, xn_, xq ? &qa_ : nullptr), h_, D, F, T, gg.rows_per_item,
              qb_.q, qb_.d, qb_.s, flags, gelu_tab_);
  launch_grid(k, gg, T);
  matmul(down, h_, y, T, D, accumulate, h_q8 ? &qb_ : nullptr);
}

void llama_forward::moe_ffn(const device_layer& L, int layer, int T) {
  const auto& hp = hparams();
  const auto& M = *L.moe;
  const int D = hp.n_embd, F = hp.n_ff, E = hp.n_expert, K = hp.n_expert_used;
  const int S = M.n_slots();
  // The router reads the normed rows as float (its weights stay F32 in
  // llama.cpp's files); integer expert products read them quantized too.
  norm(L.ffn_norm, false, T);
  matmul(M.router, xn_, moe_logits_, T, E, false);
  const auto& gate_up0 = M.shards.front().gate_up;
  const bool xq = int8_for(gate_up0);
  if (xq) quantize(xn_, D, T, qa_, gate_up0);
  k_moe_route_.args(moe_logits_, T, E, K, M.rep_off, M.rep_slot, S, moe_sel_, moe_w_, moe_slot_off_,
                    moe_slot_rows_, expert_counts_, layer * E, hp.expert_weights_norm ? 1 : 0);
  ctx_.launch(k_moe_route_, {1});

  // Tiles sized for a slot's expected share of the step's assignments;
  // enough of them for a slot that gets every token.
  const int share = std::max(1, (T * K + S - 1) / S);
  const int tile = tile_for(share);
  const int tiles = (T + tile - 1) / tile;
  const auto& down0 = M.shards.front().down;
  const bool h_q8 = quantized_inline(down0);
  // K-quant experts' down products read h as Q8_K, quantized between the
  // gate/up and down launches (the gate/up kernel writes per-32 blocks
  // only); elsewhere down reads what gate/up wrote.
  const bool h_q8_k = int8_for(down0) && down0.q8_k_acts;
  // Each expert device runs its slots' products on its own queue, after the
  // routing; the combination waits for all of them.
  const bool spread = ctx_.shards() > 0;
  auto run = [&](size_t d, const cl::kernel& k, int items, size_t local) {
    const size_t groups = static_cast<size_t>(M.shards[d].n) * tiles;
    if (spread)
      ctx_.launch_on(static_cast<int>(d), k, {static_cast<size_t>(items), groups}, {local, 1});
    else
      ctx_.launch(k, {static_cast<size_t>(items), groups}, {local, 1});
  };
  auto gate_up = [&](size_t d) {
    const auto& sh = M.shards[d];
    auto& kg = family_kernel(mm_family::id_glu, sh.gate_up.type, share, xq);
    const auto gg = glu_grid(sh.gate_up.type, F, h_q8);
    kg.args_from(matmul_inputs(kg, sh.gate_up, xn_, xq ? &qa_ : nullptr), moe_h_, D, F,
                 gg.rows_per_item, moe_hq_.q, moe_hq_.d, moe_hq_.s, h_q8 ? 1 : 0, gelu_tab_,
                 moe_slot_off_, moe_slot_rows_, sh.slot0, tiles, K);
    run(d, kg, gg.items, gg.local);
  };
  auto down = [&](size_t d) {
    const auto& sh = M.shards[d];
    const bool hq = h_q8 || h_q8_k;
    auto& kd = family_kernel(mm_family::id, sh.down.type, share, hq);
    const auto gd = grid(sh.down.type, D, 1);
    kd.args_from(matmul_inputs(kd, sh.down, moe_h_, hq ? &moe_hq_ : nullptr), moe_y_, F, D,
                 gd.rows_per_item, moe_slot_off_, moe_slot_rows_, sh.slot0, tiles, 1);
    run(d, kd, gd.items, gd.local);
  };
  if (spread) ctx_.fork();
  if (h_q8_k) {
    for (size_t d = 0; d < M.shards.size(); ++d) gate_up(d);
    if (spread) ctx_.join();
    quantize(moe_h_, F, T * K, moe_hq_, down0);  // every assignment's row
    if (spread) ctx_.fork();
    for (size_t d = 0; d < M.shards.size(); ++d) down(d);
  } else {
    for (size_t d = 0; d < M.shards.size(); ++d) {
      gate_up(d);
      down(d);
    }
  }
  if (spread) ctx_.join();
  // The shared expert (Qwen2-MoE) over the same normed rows, on the main
  // queue; moe_combine scales it by its gate and adds it in.
  const auto* sh = L.shared.get();
  if (sh) {
    const bool sxq = int8_for(sh->gate_up);
    if (sxq && (!xq || input_format(sh->gate_up) != input_format(gate_up0)))
      quantize(xn_, D, T, qa_, sh->gate_up);
    glu_ffn(sh->gate_up, sh->down, hp.n_ff_shared, T, sxq, shared_y_, false);
    matmul(sh->gate, xn_, shared_g_, T, 1, false);
  }
  k_moe_combine_.args(x_, moe_y_, moe_w_, D, K, sh ? shared_y_ : moe_y_ /*unused*/,
                      sh ? shared_g_ : moe_w_ /*unused*/, sh ? 1 : 0);
  size_t combine_local = 64;
  while (D % combine_local != 0) combine_local /= 2;
  ctx_.launch(k_moe_combine_, {static_cast<size_t>(D), static_cast<size_t>(T)}, {combine_local, 1});
}

std::vector<int64_t> llama_forward::take_expert_counts() {
  const auto& hp = hparams();
  if (hp.n_expert == 0) return {};
  std::vector<int32_t> c(static_cast<size_t>(hp.n_layer) * hp.n_expert);
  ctx_.read(expert_counts_, c.data(), c.size() * 4);
  const std::vector<int32_t> zeros(c.size(), 0);
  ctx_.write(expert_counts_, zeros.data(), zeros.size() * 4);
  ctx_.finish();
  return {c.begin(), c.end()};
}

const expert_layout& llama_forward::experts_of(int layer) const {
  const auto& L = weights_.layers.at(static_cast<size_t>(layer));
  if (!L.moe) throw std::invalid_argument("layer " + std::to_string(layer) + " has no experts");
  return L.moe->layout;
}

std::vector<double> llama_forward::expert_busy_seconds() {
  if (ctx_.shards() == 0) return {};
  ctx_.finish();
  return ctx_.shard_busy_seconds();
}

void llama_forward::set_experts(int layer, std::shared_ptr<device_moe> moe) {
  auto& L = weights_.layers.at(static_cast<size_t>(layer));
  if (!L.moe || !moe)
    throw std::invalid_argument("layer " + std::to_string(layer) + " has no experts");
  if (moe->n_slots() > moe_slot_capacity_) {
    moe_slot_capacity_ = moe->n_slots();
    moe_slot_off_ = ctx_.alloc((static_cast<size_t>(moe_slot_capacity_) + 1) * 4);
  }
  L.moe = std::move(moe);
  graphs_.clear();  // recordings name the old buffers
}

namespace {

// One (layer, page) block of one cache (kv heads x page_size x head_dim values, in
// kernels/attention.cl's order: K transposed within a page, V by slot).
struct page_blocks {
  size_t block = 0;  // bytes of one (layer, page) block of K (or V)
  size_t n_pages = 0;
  size_t offset(int layer, int32_t page) const {
    return (static_cast<size_t>(layer) * n_pages + static_cast<size_t>(page)) * block;
  }
};

// Waits for the queue, ignoring its errors (already failing).
void finish_quietly(cl::context& ctx) {
  try {
    ctx.finish();
  } catch (...) {
  }
}

// Calls f(first, n) for each run pages[first, first + n) of consecutive
// arena pages (each one more than the one before).
template <class F>
void for_each_page_run(const std::vector<int32_t>& pages, F&& f) {
  for (size_t i = 0; i < pages.size();) {
    size_t n = 1;
    while (i + n < pages.size() && pages[i + n] == pages[i + n - 1] + 1) ++n;
    f(i, n);
    i += n;
  }
}

}  // namespace

std::vector<uint8_t> llama_forward::read_pages(const std::vector<int32_t>& pages) {
  for (int32_t p : pages)
    if (p < 0 || p >= n_pages_)
      throw std::invalid_argument("read_pages: page " + std::to_string(p) + " outside the arena");
  const int n_layers = static_cast<int>(weights_.layers.size());
  const page_blocks g{kv_bytes_per_page() / 2 / n_layers, size_t(n_pages_)};
  const size_t per = kv_bytes_per_page();
  std::vector<uint8_t> out(pages.size() * per);
  // A run of consecutive arena pages is, per layer, one contiguous region
  // of K (and of V): one strided read each, all queued, then one wait
  // (one blocking read per block took 200 ms for 64 pages of SmolLM2).
  try {
    for_each_page_run(pages, [&](size_t first, size_t n) {
      uint8_t* dst = out.data() + first * per;
      for (int l = 0; l < n_layers; ++l) {
        const size_t at = g.offset(l, pages[first]);
        ctx_.read_rows(k_cache_, dst + size_t(l) * 2 * g.block, g.block, n, at, per);
        ctx_.read_rows(v_cache_, dst + size_t(l) * 2 * g.block + g.block, g.block, n, at, per);
      }
    });
    ctx_.finish();
  } catch (...) {
    finish_quietly(ctx_);  // reads queued before the failure still write into `out`
    throw;
  }
  return out;
}

void llama_forward::write_pages(const std::vector<int32_t>& pages,
                                const std::vector<uint8_t>& data) {
  for (int32_t p : pages)
    if (p < 0 || p >= n_pages_)
      throw std::invalid_argument("write_pages: page " + std::to_string(p) + " outside the arena");
  if (data.size() != pages.size() * kv_bytes_per_page())
    throw std::invalid_argument("write_pages: " + std::to_string(data.size()) + " bytes for " +
                                std::to_string(pages.size()) + " pages of " +
                                std::to_string(kv_bytes_per_page()));
  const int n_layers = static_cast<int>(weights_.layers.size());
  const page_blocks g{kv_bytes_per_page() / 2 / n_layers, size_t(n_pages_)};
  const size_t per = kv_bytes_per_page();
  try {
    for_each_page_run(pages, [&](size_t first, size_t n) {
      const uint8_t* src = data.data() + first * per;
      for (int l = 0; l < n_layers; ++l) {
        const size_t at = g.offset(l, pages[first]);
        ctx_.write_rows(k_cache_, src + size_t(l) * 2 * g.block, g.block, n, at, per);
        ctx_.write_rows(v_cache_, src + size_t(l) * 2 * g.block + g.block, g.block, n, at, per);
      }
    });
  } catch (...) {
    finish_quietly(ctx_);  // writes queued before the failure still read `data`
    throw;
  }
  ctx_.finish();  // `data` is the caller's: the writes must be done before returning
}

void llama_forward::copy_pages(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (src.size() != dst.size())
    throw std::invalid_argument("copy_pages: " + std::to_string(src.size()) + " sources for " +
                                std::to_string(dst.size()) + " destinations");
  // Through host memory: copies are rare (a shared half-filled page written)
  // and small.
  write_pages(dst, read_pages(src));
}

}  // namespace troupe
