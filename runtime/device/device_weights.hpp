#pragma once
// Model weights resident on an OpenCL device, in the file's own type.
// Quantized tensors are split into structure-of-arrays form (quants,
// scales, mins) so kernels read whole blocks with aligned vector loads;
// see kernels/common.cl for the layouts.
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/model/model_file.hpp"

namespace troupe {

struct device_matrix {
  tensor_type type = tensor_type::f32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features (contiguous)
  cl::buffer q;      // raw values (f32/f16) or quants
  cl::buffer d;      // per-block scales as float (quantized types; KU6: d, dm per 256 values)
  cl::buffer m;      // per-block mins as float (q4_1; Q5_0: fifth bits; KU6: unused)
  // Held from a K-quant (Q4_K as Q4_1, the others as KU6): products take
  // activations quantized as llama.cpp's Q8_K, which is what its K-quant
  // dot products read: integer ones from quantize.cl's quantize_q8_k,
  // float ones (with integer products off) the values round_q8_k rounds
  // them to.
  bool q8_k_acts = false;
};

// Uploads tensors stacked by rows (e.g. Wq, Wk, Wv as one QKV matrix).
// All parts must share row length (throws model_error otherwise).  Parts of
// different types: K-quants together as KU6 (any of them exactly), Q5_0
// or IQ4_NL beside Q8_0 as Q8_0, others as F32 (exact values).  With f32_panels, F32 values are
// held in panels as F32P, Q4_1 ones (not a K-quant's) as Q4_1P and Q8_0 ones as Q8_0P
// (kernels/matmul_panels.cl; the rows a multiple of 16, else std::invalid_argument).
device_matrix upload_matrix(cl::context& ctx, const std::vector<const tensor_view*>& parts,
                            bool f32_panels = false);

// Whether upload_weights holds the model's layer matrices in F32 panels:
// every one F32 in the file, a dense layer with the normal RoPE layout,
// sizes in whole panels, on a CPU device.
bool f32_panels_fit(const cl::context& ctx, const model_file& model);

// Whether upload_weights can hold the layer matrices in Q4_1 panels (Q4_1P,
// integer products, kernels/matmul_panels.cl): every one Q4_1 in the file,
// the shape f32_panels_fit asks, on a CPU device with AVX-512 VNNI.
bool q4_1_panels_fit(const cl::context& ctx, const model_file& model);

// The same for Q8_0 (Q8_0P): every layer matrix Q8_0 in the file but
// ffn_down, which may be a K-quant (held row-major beside the panels).
bool q8_0_panels_fit(const cl::context& ctx, const model_file& model);

// A layer's [q; k; v], as upload_matrix stacks them, but where qkv_kernels
// (the projection runs in matmul_qkv_*, not as a plain matmul: llama_forward's
// QK-norm path), whose V rows may be held apart (kernels/common.cl):
// - Q5_1 q and k beside a Q5_1 or Q8_0 v (also Q5_0 or IQ4_NL, held as
//   Q8_0; a Q5_K_M file's layers whose attn_v fell back from Q6_K to Q8_0
//   where its rows are no whole super-blocks) as Q5_1, q and k packed, the
//   v rows a byte a value (Q8_0's signed quants with no offset), which the
//   QKV kernels read with signed products (loadu_q5_1_v);
// - Q5_0 q and k beside a Q5_0, Q8_0 or IQ4_NL v (a Q4_K_M file's) as
//   Q5_0, q and k packed, the v rows as Q8_0 (loadu_q8_0).
// Each part's own sums.  Without qkv_kernels, a QKV with any Q5_0 part is
// held as Q8_0.
device_matrix upload_qkv(cl::context& ctx, const tensor_view& q, const tensor_view& k,
                         const tensor_view& v, bool qkv_kernels, bool f32_panels = false);

// Uploads a 1-D tensor (norm weights) as F32.
cl::buffer upload_vector(cl::context& ctx, const tensor_view& t);

// Where a layer's experts are: for each expert device (a shard; one where
// experts are not spread), the experts it holds, one slot each.  An expert
// may be in several slots (replicated, on different devices); every expert
// is in at least one.
using expert_layout = std::vector<std::vector<int>>;

// The slots one expert device holds: slots [slot0, slot0 + n) of the
// layer's slot order, with their weights in its own buffers (slot s at
// gate_up rows [(s - slot0) 2F, +2F): gate then up; down rows
// [(s - slot0) D, +D)).
struct expert_shard {
  int slot0 = 0, n = 0;
  device_matrix gate_up, down;
};

// A mixture-of-experts FFN.  Slots are numbered device by device (shard 0's
// first, in layout order).  rep_off/rep_slot list each expert's slots
// (expert e: rep_slot[rep_off[e] .. rep_off[e+1])), for the router kernel,
// which sends a token to replica t mod n.
struct device_moe {
  device_matrix router;  // ffn_gate_inp, [n_expert rows, n_embd]
  expert_layout layout;
  std::vector<expert_shard> shards;
  cl::buffer rep_off, rep_slot;

  int n_slots() const { return shards.empty() ? 0 : shards.back().slot0 + shards.back().n; }
};

// Qwen2-MoE's shared expert: a dense FFN every token runs, scaled by
// sigmoid(gate . x).
struct device_shared_expert {
  device_matrix gate_up;  // [gate | up] rows
  device_matrix down;
  device_matrix gate;  // ffn_gate_inp_shexp: one row
};

struct device_layer {
  cl::buffer attn_norm, ffn_norm;
  cl::buffer q_norm, k_norm;                 // per-head QK-norm weights (Gemma 3); else null
  cl::buffer post_attn_norm, post_ffn_norm;  // sandwich norms (Gemma 3); else null
  device_matrix qkv;                         // [q | k | v] rows
  cl::buffer qkv_bias;    // [bq | bk | bv] as F32 (Qwen2); null where the file has none
  device_matrix wo;       // attention output
  device_matrix gate_up;  // [gate | up] rows (dense FFN)
  device_matrix down;
  std::shared_ptr<device_moe> moe;               // set for a mixture-of-experts FFN instead
  std::unique_ptr<device_shared_expert> shared;  // beside moe, where the model has one
};

struct device_weights {
  // Where the step runs as one launch: the layers' tensors, which are
  // sub-buffers of it (runtime/device/weight_arena.hpp); null otherwise.
  cl::buffer arena;
  device_matrix embedding;                // token_embd, [n_vocab rows, n_embd]
  std::unique_ptr<device_matrix> output;  // null when tied to the embedding
  cl::buffer output_norm;
  std::vector<device_layer> layers;
  size_t bytes = 0;  // device memory used by weights

  const device_matrix& classifier() const { return output ? *output : embedding; }
};

// Experts of MoE layers spread over `expert_devices` devices
// (initial_expert_layout).  Layers [first_layer, end_layer) only (a
// pipeline stage's; end_layer 0: to the last), layers[0] being first_layer;
// the embedding, the output norm and the classifier always.  Where
// int8_panels and q4_1_panels_fit (q8_0_panels_fit), the layer matrices
// as Q4_1P (Q8_0P).
device_weights upload_weights(cl::context& ctx, const model_file& model, int expert_devices = 1,
                              int first_layer = 0, int end_layer = 0, bool int8_panels = false);

// Experts 0..n-1 split into `devices` contiguous runs, one slot each.
expert_layout initial_expert_layout(int n_expert, int devices);

// Expert e of a stacked expert tensor (ffn_*_exps: shape [cols, rows, n_expert]).
tensor_view expert_slice(const tensor_view& stacked, int e);

// Layer `layer`'s experts uploaded as `layout` places them, with the
// router.  Throws model_error for an expert id out of range, an expert in
// no slot or a device with no slot.
std::shared_ptr<device_moe> upload_experts(cl::context& ctx, const model_file& model, int layer,
                                           const expert_layout& layout);

}  // namespace troupe
