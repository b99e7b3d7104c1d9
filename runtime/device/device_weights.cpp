#include "runtime/device/device_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace troupe {

namespace {

// Bytes of the scale (and min) header at the start of a block of each type.
struct block_layout {
  size_t header;  // 2 (d) or 4 (d, m)
  size_t quants;  // bytes of quants per block on the device (the file's)
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
    case tensor_type::q5_1:  // the nibbles, then the fifth bits (kernels/common.cl)
      return {4, 20, true};
    default:
      return {0, 0, false};
  }
}

bool quantized(tensor_type t) {
  return layout_of(t).quants != 0;
}

// The type a tensor has on the device, each exactly its file's values
// (tensor_type.hpp says why): Q5_0 and Q5_1 packed as the file packs them
// (kernels/common.cl; a QKV's V apart: upload_qkv), IQ4_NL as Q8_0, Q4_K
// as Q4_1, the other K-quants (a scale per 16 values, or a fifth or sixth
// bit) as KU6, six bits a value with integer scale and offset factors per
// 16 and two floats per 256 (7.25 bits a value, against Q6_K's 6.56 in
// the file); BF16 stays BF16, its
// float products reading each value's float.
tensor_type on_device(tensor_type t) {
  if (t == tensor_type::q5_0) return t;
  if (widens_to_q8_0(t)) return tensor_type::q8_0;
  switch (t) {
    case tensor_type::q4_k:
      return tensor_type::q4_1;
    case tensor_type::q2_k:
    case tensor_type::q3_k:
    case tensor_type::q5_k:
    case tensor_type::q6_k:
      return tensor_type::ku6;
    default:
      return t;
  }
}

// llama.cpp's K-quant dot products read Q8_K activations.
bool k_quant(const tensor_view* p) {
  return is_k_quant(p->type);
}

// Tensors' values as F32, one after another.
std::vector<float> floats_of(const std::vector<const tensor_view*>& parts) {
  std::vector<float> v;
  for (const auto* t : parts) {
    const size_t at = v.size();
    v.resize(at + static_cast<size_t>(t->row_len() * t->rows()));
    dequantize_row(t->type, t->data, v.data() + at, static_cast<int64_t>(v.size() - at));
  }
  return v;
}

// Block b's 32 six-bit u packed as kernels/common.cl's ku6_u reads them:
// the low nibbles as Q4_1's (byte i: values i and 16 + i), then two uints
// of the top two bits (the first values 0-15, the second 16-31), value
// 4j + k of each half at bits 2j, 2j + 1 of the uint's byte k.
void pack_ku6(const uint8_t u[32], uint8_t out[24]) {
  for (int i = 0; i < 16; ++i) out[i] = static_cast<uint8_t>((u[i] & 15) | (u[16 + i] & 15) << 4);
  for (int half = 0; half < 2; ++half) {
    uint32_t h = 0;
    for (int v = 0; v < 16; ++v)
      h |= static_cast<uint32_t>(u[16 * half + v] >> 4 & 3) << (8 * (v % 4) + 2 * (v / 4));
    std::memcpy(out + 16 + 4 * half, &h, 4);
  }
}

// K-quant parts as KU6 (kernels/common.cl): per block of 32, 28 bytes: the
// six-bit quants u packed (pack_ku6), then the integer scales and offset
// factors of its halves (sc[2], mn[2]); per super-block of 256 the floats
// d and dm in d, so that value = d sc u + dm mn (k_quant_factors): each of
// s = d sc and m = dm mn is split_k_quant's float, which it computes so.
device_matrix upload_ku6(cl::context& ctx, const std::vector<const tensor_view*>& parts,
                         device_matrix out) {
  const size_t n_blocks = static_cast<size_t>(out.rows) * (out.cols / 32);
  std::vector<uint8_t> q(n_blocks * 28);
  std::vector<float> d(n_blocks / 8 * 2);
  size_t sbs = 0;  // super-blocks so far
  uint8_t u[256];
  int8_t sc[16], mn[16];
  for (const auto* p : parts) {
    if (p->row_len() % 256 != 0)
      throw model_error("tensor '" + p->name + "' has rows of " + std::to_string(p->row_len()) +
                        " values, not whole " + std::string(traits_of(p->type).name) +
                        " super-blocks of 256");
    const size_t nsb = p->bytes / traits_of(p->type).block_bytes;
    for (size_t i = 0; i < nsb; ++i, ++sbs) {
      k_quant_quants(p->type, p->data, static_cast<int64_t>(i), u);
      k_quant_factors(p->type, p->data, static_cast<int64_t>(i), d[2 * sbs], d[2 * sbs + 1], sc,
                      mn);
      for (int b = 0; b < 8; ++b) {
        uint8_t* blk = &q[(sbs * 8 + b) * 28];
        pack_ku6(&u[32 * b], blk);
        blk[24] = static_cast<uint8_t>(sc[2 * b]);
        blk[25] = static_cast<uint8_t>(sc[2 * b + 1]);
        blk[26] = static_cast<uint8_t>(mn[2 * b]);
        blk[27] = static_cast<uint8_t>(mn[2 * b + 1]);
      }
    }
  }
  out.q = ctx.alloc(q.size(), q.data());
  out.d = ctx.alloc(d.size() * sizeof(float), d.data());
  out.m = ctx.alloc(4);
  return out;
}

// Row-major values (rows of K) in panels of 16 rows, each panel column by
// column: value (r, k) at (r / 16) 16 K + 16 k + r % 16 (kernels/matmul_panels.cl).
std::vector<float> in_panels(const std::vector<float>& v, int64_t rows, int64_t K) {
  std::vector<float> out(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) out[(r / 16 * K + k) * 16 + r % 16] = v[r * K + k];
  return out;
}

// Q4_1 blocks (quants q, 16 bytes a block; scales d, mins m), row-major,
// in panels of 16 rows (kernels/matmul_panels.cl's q4_1p): per panel p and
// block b, four vectors of the 16 rows' bytes 4c..4c+3 (lane r: row r),
// then the 16 scales, then the 16 mins.
void q4_1_in_panels(std::vector<uint8_t>& q, std::vector<float>& d, std::vector<float>& m,
                    int64_t rows, int64_t K) {
  const int64_t nb = K / 32;
  std::vector<uint8_t> pq(q.size());
  std::vector<float> pd(d.size()), pm(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t pb = (r / 16) * nb + b, lane = r % 16, src = r * nb + b;
      for (int c = 0; c < 4; ++c)
        std::memcpy(&pq[static_cast<size_t>(((pb * 4 + c) * 16 + lane) * 4)],
                    &q[static_cast<size_t>(src * 16 + c * 4)], 4);
      pd[static_cast<size_t>(pb * 16 + lane)] = d[static_cast<size_t>(src)];
      pm[static_cast<size_t>(pb * 16 + lane)] = m[static_cast<size_t>(src)];
    }
  q.swap(pq);
  d.swap(pd);
  m.swap(pm);
}

// Q8_0 blocks (quants q, 32 bytes a block; scales d), row-major, in panels
// of 16 rows (kernels/matmul_panels.cl's q8_0p): per panel p and block b,
// eight vectors of the 16 rows' bytes 4c..4c+3 (lane r: row r), then the
// 16 scales.
void q8_0_in_panels(std::vector<uint8_t>& q, std::vector<float>& d, int64_t rows, int64_t K) {
  const int64_t nb = K / 32;
  std::vector<uint8_t> pq(q.size());
  std::vector<float> pd(d.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t pb = (r / 16) * nb + b, lane = r % 16, src = r * nb + b;
      for (int c = 0; c < 8; ++c)
        for (int k = 0; k < 4; ++k)
          pq[static_cast<size_t>(((pb * 8 + c) * 16 + lane) * 4 + k)] =
              q[static_cast<size_t>(src * 32 + c * 4 + k)];
      pd[static_cast<size_t>(pb * 16 + lane)] = d[static_cast<size_t>(src)];
    }
  q.swap(pq);
  d.swap(pd);
}

// How upload_stacked holds a QKV's parts where they are not all one type
// on the device (upload_qkv says which).
enum class qkv_hold {
  plain,   // as any stack: K-quants as KU6, Q5_0 beside Q8_0 as Q8_0, else F32
  q5_1_v,  // Q5_1 q and k, a Q5_1 or Q8_0 v: as Q5_1, v a byte a value
  q5_0_v,  // Q5_0 q and k, a Q5_0 or Q8_0 v: as Q5_0, v as Q8_0
  q8_0,    // Q5_0 parts widened to Q8_0 (a QKV whose product is a plain one)
};

// Q5_0 parts as kernels/common.cl's q5_0: per block the low nibbles in q
// (16 bytes), the half scale as float in d, the 32 fifth bits in m.
// Where v_q8_0 the last part (a QKV's V, Q5_0 or Q8_0) is held as Q8_0 at
// Q8_0's places, block k's quants at 32 k, as the QKV kernels read them.
device_matrix upload_q5_0(cl::context& ctx, const std::vector<const tensor_view*>& parts,
                          bool v_q8_0, device_matrix out) {
  const size_t n_blocks = static_cast<size_t>(out.rows) * (out.cols / 32);
  std::vector<uint8_t> q(n_blocks * (v_q8_0 ? 32 : 16));
  std::vector<float> d(n_blocks);
  std::vector<uint32_t> h(n_blocks);
  size_t blk = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const tensor_view* p = parts[k];
    const size_t nb = p->bytes / traits_of(p->type).block_bytes;
    const bool as_q8_0 = v_q8_0 && k + 1 == parts.size();
    for (size_t i = 0; i < nb; ++i, ++blk) {
      uint16_t half = 0;
      if (as_q8_0 && p->type == tensor_type::q8_0) {
        const uint8_t* src = p->data + i * traits_of(p->type).block_bytes;
        std::memcpy(&half, src, 2);
        std::memcpy(&q[blk * 32], src + 2, 32);
      } else if (as_q8_0) {
        widen_block_to_q8_0(p->type, p->data, static_cast<int64_t>(i), half,
                            reinterpret_cast<int8_t*>(&q[blk * 32]));
      } else {  // Q5_0: d, qh[4], qs[16]
        const uint8_t* src = p->data + i * traits_of(p->type).block_bytes;
        std::memcpy(&half, src, 2);
        std::memcpy(&h[blk], src + 2, 4);
        std::memcpy(&q[blk * 16], src + 6, 16);
      }
      d[blk] = half_to_float(half);
    }
  }
  out.q = ctx.alloc(q.size(), q.data());
  out.d = ctx.alloc(d.size() * sizeof(float), d.data());
  out.m = ctx.alloc(h.size() * sizeof(uint32_t), h.data());
  return out;
}

// upload_matrix, with a QKV's parts held as hold says; where panels, F32
// values as F32P, Q4_1 ones (not from K-quants) as Q4_1P and Q8_0 ones as
// Q8_0P (the rows a multiple of 16).
device_matrix upload_stacked(cl::context& ctx, const std::vector<const tensor_view*>& parts,
                             qkv_hold hold, bool panels = false) {
  device_matrix out;
  const tensor_view& first = *parts.front();
  out.type = on_device(first.type);
  out.cols = first.row_len();
  out.q8_k_acts = k_quant(&first);
  bool mixed = false;
  for (const auto* p : parts) {
    if (p->row_len() != out.cols)
      throw model_error("tensor '" + p->name + "' does not match '" + first.name +
                        "' in row length, so they cannot be fused");
    mixed = mixed || on_device(p->type) != out.type || k_quant(p) != out.q8_k_acts;
    out.rows += p->rows();
  }
  // Parts of different types (llama.cpp's Q4_K_M gives some layers a Q6_K
  // attn_v beside Q4_K attn_q and attn_k): K-quants together as KU6, which
  // holds any of them; a QKV as hold says; Q5_0 (or IQ4_NL) beside Q8_0 as
  // Q8_0; otherwise F32, exact values, with Q8_K inputs where every part
  // is a K-quant, float ones otherwise.
  auto q8_0_values = [](const tensor_view* p) {
    return p->type == tensor_type::q8_0 || widens_to_q8_0(p->type);
  };
  if (hold == qkv_hold::q5_0_v) {
    out.type = tensor_type::q5_0;
  } else if (hold == qkv_hold::q5_1_v) {
    out.type = tensor_type::q5_1;
  } else if (hold == qkv_hold::q8_0) {
    out.type = tensor_type::q8_0;
  } else if (mixed) {
    out.q8_k_acts = std::all_of(parts.begin(), parts.end(), k_quant);
    out.type = out.q8_k_acts                                          ? tensor_type::ku6
               : std::all_of(parts.begin(), parts.end(), q8_0_values) ? tensor_type::q8_0
                                                                      : tensor_type::f32;
  }
  if (out.cols % 32 != 0)
    throw model_error("tensor '" + first.name + "' has rows of " + std::to_string(out.cols) +
                      " values; troupe needs a multiple of 32");
  if (out.type == tensor_type::ku6) return upload_ku6(ctx, parts, std::move(out));
  if (out.type == tensor_type::q5_0)
    return upload_q5_0(ctx, parts, hold == qkv_hold::q5_0_v, std::move(out));
  if (out.type == tensor_type::f32) {
    auto v = floats_of(parts);
    if (panels) {
      if (out.rows % 16 != 0)
        throw std::invalid_argument("F32 panels need rows a multiple of 16, not " +
                                    std::to_string(out.rows));
      v = in_panels(v, out.rows, out.cols);
      out.type = tensor_type::f32p;
    }
    out.q = ctx.alloc(v.size() * sizeof(float), v.data());
    out.d = ctx.alloc(4);
    out.m = ctx.alloc(4);
    return out;
  }
  if (!quantized(out.type)) {
    std::vector<uint8_t> raw;
    for (const auto* p : parts) raw.insert(raw.end(), p->data, p->data + p->bytes);
    out.q = ctx.alloc(raw.size(), raw.data());
    out.d = ctx.alloc(4);
    out.m = ctx.alloc(4);
    return out;
  }
  const auto lay = layout_of(out.type);
  const size_t n_blocks = static_cast<size_t>(out.rows) * (out.cols / 32);
  // A Q5_1 QKV's V rows a byte a value, block k's at 32 k (kernels/common.cl).
  const bool v_bytes = hold == qkv_hold::q5_1_v;
  std::vector<uint8_t> q(n_blocks * (v_bytes ? 32 : lay.quants));
  std::vector<float> d(n_blocks), m(lay.has_min ? n_blocks : 1);
  size_t blk = 0;
  for (const auto* p : parts) {
    const bool v_part = v_bytes && p == parts.back();
    const size_t stride = v_part ? 32 : lay.quants;
    if (widens_to_q8_0(p->type)) {
      const size_t nb = p->bytes / traits_of(p->type).block_bytes;
      for (size_t i = 0; i < nb; ++i, ++blk) {
        uint16_t h = 0;
        widen_block_to_q8_0(p->type, p->data, static_cast<int64_t>(i), h,
                            reinterpret_cast<int8_t*>(&q[blk * stride]));
        d[blk] = half_to_float(h);
      }
      continue;
    }
    if (p->type == tensor_type::q4_k) {
      const size_t nsb = p->bytes / traits_of(p->type).block_bytes;
      for (size_t i = 0; i < nsb; ++i, blk += 8) {
        uint8_t qs[8][16];
        split_q4_k_to_q4_1(p->data, static_cast<int64_t>(i), &d[blk], &m[blk], qs);
        std::memcpy(&q[blk * lay.quants], qs, sizeof(qs));
      }
      continue;
    }
    if (p->type == tensor_type::q5_1 && v_part) {
      const size_t nb = p->bytes / traits_of(p->type).block_bytes;
      for (size_t i = 0; i < nb; ++i, ++blk)
        split_q5_1(p->data, static_cast<int64_t>(i), d[blk], m[blk], &q[blk * stride]);
      continue;
    }
    if (p->type == tensor_type::q5_1) {  // d, m, qh[4], qs[16]: qs then qh
      const size_t bytes = traits_of(p->type).block_bytes;
      for (size_t i = 0; i < p->bytes / bytes; ++i, ++blk) {
        const uint8_t* src = p->data + i * bytes;
        uint16_t h[2];
        std::memcpy(h, src, 4);
        d[blk] = half_to_float(h[0]);
        m[blk] = half_to_float(h[1]);
        std::memcpy(&q[blk * stride], src + 8, 16);
        std::memcpy(&q[blk * stride + 16], src + 4, 4);
      }
      continue;
    }
    // The part's own layout: a Q8_0 part of a Q5_1 matrix keeps m = 0.
    const auto own = layout_of(p->type);
    const size_t own_bytes = own.header + own.quants;
    const size_t nb = p->bytes / own_bytes;
    for (size_t i = 0; i < nb; ++i, ++blk) {
      const uint8_t* src = p->data + i * own_bytes;
      uint16_t h[2];
      std::memcpy(h, src, own.header);
      d[blk] = half_to_float(h[0]);
      if (own.has_min) m[blk] = half_to_float(h[1]);
      std::memcpy(&q[blk * stride], src + own.header, own.quants);
    }
  }
  if (panels && out.type == tensor_type::q4_1 && !out.q8_k_acts) {
    if (out.rows % 16 != 0)
      throw std::invalid_argument("Q4_1 panels need rows a multiple of 16, not " +
                                  std::to_string(out.rows));
    q4_1_in_panels(q, d, m, out.rows, out.cols);
    out.type = tensor_type::q4_1p;
  }
  if (panels && out.type == tensor_type::q8_0 && !out.q8_k_acts && hold == qkv_hold::plain) {
    if (out.rows % 16 != 0)
      throw std::invalid_argument("Q8_0 panels need rows a multiple of 16, not " +
                                  std::to_string(out.rows));
    q8_0_in_panels(q, d, out.rows, out.cols);
    out.type = tensor_type::q8_0p;
  }
  out.q = ctx.alloc(q.size(), q.data());
  out.d = ctx.alloc(d.size() * sizeof(float), d.data());
  out.m = ctx.alloc(m.size() * sizeof(float), m.data());
  return out;
}

// Whether the model's layers have the shape the panel kernels take: the
// plain layer (no experts, no Gemma extras), the normal RoPE layout over
// whole panels, every row count a multiple of 16, on a CPU device (the
// kernels are written for its wide registers).
bool dense_panel_shape(const cl::context& ctx, const model_file& model) {
  const auto& hp = model.hparams();
  return ctx.cpu() && hp.n_expert == 0 && !hp.qk_norm && !hp.sandwich_norms && !hp.gelu_ffn &&
         hp.sliding_window == 0 && hp.rope != rope_layout::neox && hp.rope_dims % 16 == 0 &&
         hp.head_dim % 16 == 0 && hp.n_embd % 16 == 0 && hp.n_ff % 16 == 0;
}

// Whether every layer matrix of the model has type t in the file (all or
// none: one kernel family).
bool layers_all(const model_file& model, tensor_type t) {
  const auto& hp = model.hparams();
  for (int l = 0; l < hp.n_layer; ++l)
    for (const char* name :
         {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const auto* v = model.find_tensor("blk." + std::to_string(l) + "." + name + ".weight");
      if (!v || v->type != t) return false;
    }
  return true;
}

}  // namespace

device_matrix upload_matrix(cl::context& ctx, const std::vector<const tensor_view*>& parts,
                            bool f32_panels) {
  return upload_stacked(ctx, parts, qkv_hold::plain, f32_panels);
}

bool f32_panels_fit(const cl::context& ctx, const model_file& model) {
  return dense_panel_shape(ctx, model) && layers_all(model, tensor_type::f32);
}

bool q4_1_panels_fit(const cl::context& ctx, const model_file& model) {
  // The integer panel kernels take vpdpbusd (AVX-512 VNNI) on a CPU device
  // and the GLU's h whole blocks of 32.
  return ctx.x86_vnni() && dense_panel_shape(ctx, model) && model.hparams().n_ff % 32 == 0 &&
         layers_all(model, tensor_type::q4_1);
}

bool q8_0_panels_fit(const cl::context& ctx, const model_file& model) {
  // As Q4_1's; ffn_down may be a K-quant (llama-quantize's Q6_K files of
  // models whose other rows are no whole super-blocks): it stays row-major
  // beside the panels (layer.cl's _kd layers).
  if (!ctx.x86_vnni() || !dense_panel_shape(ctx, model) || model.hparams().n_ff % 32 != 0)
    return false;
  const auto& hp = model.hparams();
  for (int l = 0; l < hp.n_layer; ++l)
    for (const char* name :
         {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const auto* v = model.find_tensor("blk." + std::to_string(l) + "." + name + ".weight");
      if (!v) return false;
      const bool down = std::string(name) == "ffn_down";
      if (v->type != tensor_type::q8_0 && !(down && is_k_quant(v->type))) return false;
    }
  return true;
}

device_matrix upload_qkv(cl::context& ctx, const tensor_view& q, const tensor_view& k,
                         const tensor_view& v, bool qkv_kernels, bool f32_panels) {
  auto is = [](const tensor_view& t, tensor_type want) {
    return on_device(t.type) == want && !k_quant(&t);
  };
  auto q8_0_values = [](const tensor_view& t) {
    return t.type == tensor_type::q8_0 || widens_to_q8_0(t.type);
  };
  const bool q5_0_qk = q.type == tensor_type::q5_0 && k.type == tensor_type::q5_0;
  qkv_hold hold = qkv_hold::plain;
  if (qkv_kernels && is(q, tensor_type::q5_1) && is(k, tensor_type::q5_1) &&
      (is(v, tensor_type::q5_1) || q8_0_values(v)))
    hold = qkv_hold::q5_1_v;
  else if (qkv_kernels && q5_0_qk && q8_0_values(v))
    hold = qkv_hold::q5_0_v;
  else if (q8_0_values(q) && q8_0_values(k) && q8_0_values(v) &&
           (q.type == tensor_type::q5_0 || k.type == tensor_type::q5_0 ||
            v.type == tensor_type::q5_0))
    hold = qkv_hold::q8_0;
  return upload_stacked(ctx, {&q, &k, &v}, hold, f32_panels);
}

cl::buffer upload_vector(cl::context& ctx, const tensor_view& t) {
  const auto v = floats_of({&t});
  return ctx.alloc(v.size() * sizeof(float), v.data());
}

tensor_view expert_slice(const tensor_view& stacked, int e) {
  if (stacked.shape.size() != 3 || e < 0 || e >= stacked.shape[2])
    throw model_error("tensor '" + stacked.name + "' has no expert " + std::to_string(e));
  tensor_view v;
  v.name = stacked.name + "[" + std::to_string(e) + "]";
  v.type = stacked.type;
  v.shape = {stacked.shape[0], stacked.shape[1]};
  v.bytes = stacked.bytes / static_cast<size_t>(stacked.shape[2]);
  v.data = stacked.data + v.bytes * static_cast<size_t>(e);
  return v;
}

std::shared_ptr<device_moe> upload_experts(cl::context& ctx, const model_file& model, int layer,
                                           const expert_layout& layout) {
  const int E = model.hparams().n_expert;
  const std::string p = "blk." + std::to_string(layer) + ".";
  auto where = [&] { return model.path() + ": layer " + std::to_string(layer) + ": "; };
  auto moe = std::make_shared<device_moe>();
  moe->layout = layout;
  moe->router = upload_matrix(ctx, {&model.tensor(p + "ffn_gate_inp.weight")});
  const auto& gate = model.tensor(p + "ffn_gate_exps.weight");
  const auto& up = model.tensor(p + "ffn_up_exps.weight");
  const auto& down = model.tensor(p + "ffn_down_exps.weight");
  std::vector<std::vector<int32_t>> slots_of(static_cast<size_t>(E));
  for (const auto& held : layout) {
    if (held.empty()) throw model_error(where() + "an expert device holds no expert");
    expert_shard sh;
    sh.slot0 = moe->n_slots();
    sh.n = static_cast<int>(held.size());
    std::vector<tensor_view> gu, dn;  // the views the parts point at
    for (const int e : held) {
      if (e < 0 || e >= E)
        throw model_error(where() + "expert " + std::to_string(e) + " does not exist (" +
                          std::to_string(E) + " experts)");
      gu.push_back(expert_slice(gate, e));
      gu.push_back(expert_slice(up, e));
      dn.push_back(expert_slice(down, e));
      slots_of[e].push_back(static_cast<int32_t>(sh.slot0 + dn.size() - 1));
    }
    std::vector<const tensor_view*> gu_parts, dn_parts;
    for (const auto& v : gu) gu_parts.push_back(&v);
    for (const auto& v : dn) dn_parts.push_back(&v);
    sh.gate_up = upload_matrix(ctx, gu_parts);
    sh.down = upload_matrix(ctx, dn_parts);
    moe->shards.push_back(std::move(sh));
  }
  if (moe->shards.empty()) throw model_error(where() + "no expert device");
  std::vector<int32_t> rep_off{0}, rep_slot;
  for (int e = 0; e < E; ++e) {
    if (slots_of[e].empty())
      throw model_error(where() + "expert " + std::to_string(e) + " is in no slot");
    rep_slot.insert(rep_slot.end(), slots_of[e].begin(), slots_of[e].end());
    rep_off.push_back(static_cast<int32_t>(rep_slot.size()));
  }
  moe->rep_off = ctx.alloc(rep_off.size() * 4, rep_off.data());
  moe->rep_slot = ctx.alloc(rep_slot.size() * 4, rep_slot.data());
  return moe;
}

expert_layout initial_expert_layout(int n_expert, int devices) {
  devices = std::clamp(devices, 1, std::max(1, n_expert));
  expert_layout out(static_cast<size_t>(devices));
  for (int e = 0; e < n_expert; ++e) out[static_cast<size_t>(e) * devices / n_expert].push_back(e);
  return out;
}

device_weights upload_weights(cl::context& ctx, const model_file& model, int expert_devices,
                              int first_layer, int end_layer, bool int8_panels) {
  device_weights w;
  const auto& hp = model.hparams();
  if (end_layer <= 0) end_layer = hp.n_layer;
  if (first_layer < 0 || first_layer >= end_layer || end_layer > hp.n_layer)
    throw std::invalid_argument("layers [" + std::to_string(first_layer) + ", " +
                                std::to_string(end_layer) + ") are not a range of the model's " +
                                std::to_string(hp.n_layer));
  w.embedding = upload_matrix(ctx, {&model.tensor("token_embd.weight")});
  if (const auto* out = model.find_tensor("output.weight"))
    w.output = std::make_unique<device_matrix>(upload_matrix(ctx, {out}));
  w.output_norm = upload_vector(ctx, model.tensor("output_norm.weight"));
  const bool panels = f32_panels_fit(ctx, model) ||
                      (int8_panels && (q4_1_panels_fit(ctx, model) || q8_0_panels_fit(ctx, model)));
  for (int l = first_layer; l < end_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto t = [&](const char* name) -> const tensor_view* { return &model.tensor(p + name); };
    device_layer layer;
    layer.attn_norm = upload_vector(ctx, *t("attn_norm.weight"));
    layer.ffn_norm = upload_vector(ctx, *t("ffn_norm.weight"));
    if (hp.qk_norm) {
      layer.q_norm = upload_vector(ctx, *t("attn_q_norm.weight"));
      layer.k_norm = upload_vector(ctx, *t("attn_k_norm.weight"));
    }
    if (hp.sandwich_norms) {
      layer.post_attn_norm = upload_vector(ctx, *t("post_attention_norm.weight"));
      layer.post_ffn_norm = upload_vector(ctx, *t("post_ffw_norm.weight"));
    }
    // QK-norm models project QKV as a plain matmul (llama_forward).
    layer.qkv = upload_qkv(ctx, *t("attn_q.weight"), *t("attn_k.weight"), *t("attn_v.weight"),
                           !hp.qk_norm, panels);
    if (model.find_tensor(p + "attn_q.bias")) {
      const auto b = floats_of({t("attn_q.bias"), t("attn_k.bias"), t("attn_v.bias")});
      layer.qkv_bias = ctx.alloc(b.size() * sizeof(float), b.data());
    }
    layer.wo = upload_matrix(ctx, {t("attn_output.weight")}, panels);
    if (hp.n_expert > 0) {
      layer.moe = upload_experts(ctx, model, l, initial_expert_layout(hp.n_expert, expert_devices));
      if (hp.n_ff_shared > 0) {
        layer.shared = std::make_unique<device_shared_expert>();
        layer.shared->gate_up =
            upload_matrix(ctx, {t("ffn_gate_shexp.weight"), t("ffn_up_shexp.weight")});
        layer.shared->down = upload_matrix(ctx, {t("ffn_down_shexp.weight")});
        layer.shared->gate = upload_matrix(ctx, {t("ffn_gate_inp_shexp.weight")});
      }
    } else {
      layer.gate_up = upload_matrix(ctx, {t("ffn_gate.weight"), t("ffn_up.weight")}, panels);
      layer.down = upload_matrix(ctx, {t("ffn_down.weight")}, panels);
    }
    w.layers.push_back(std::move(layer));
  }
  // The tensors uploaded: every one but the other layers' (blk.N.*).
  for (const auto& [name, tv] : model.tensors()) {
    if (name.rfind("blk.", 0) == 0) {
      const int l = std::atoi(name.c_str() + 4);
      if (l < first_layer || l >= end_layer) continue;
    }
    w.bytes += tv.bytes;
  }
  return w;
}

}  // namespace troupe
