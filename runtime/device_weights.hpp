#pragma once
// Model weights resident on an OpenCL device, in the file's own type.
// Quantized tensors are split into structure-of-arrays form (quants,
// scales, mins) so kernels read whole blocks with aligned vector loads;
// see kernels/common.cl for the layouts.
#include <memory>
#include <string>
#include <vector>

#include "runtime/cl_runtime.hpp"
#include "runtime/model_file.hpp"

namespace troupe {

struct device_matrix {
  tensor_type type = tensor_type::f32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features (contiguous)
  cl::buffer q;      // raw values (f32/f16) or quants
  cl::buffer d;      // per-block scales as float (quantized types)
  cl::buffer m;      // per-block mins as float (q4_1)
};

// Uploads tensors stacked by rows (e.g. Wq, Wk, Wv as one QKV matrix).
// All parts must share type and row length; throws model_error otherwise.
device_matrix upload_matrix(cl::context& ctx, const std::vector<const tensor_view*>& parts);

// Uploads a 1-D tensor (norm weights) as F32.
cl::buffer upload_vector(cl::context& ctx, const tensor_view& t);

// A mixture-of-experts FFN.  The experts' weights sit in slots: slot s
// holds expert slot_experts[s] (gate_up rows [s*2F, s*2F + 2F): its gate
// rows then its up rows; down rows [s*D, s*D + D)), so that an expert can
// be held twice (a hot one replicated) and slots can be refilled without
// touching the others.  rep_off/rep_slot list each expert's slots
// (expert e: rep_slot[rep_off[e] .. rep_off[e+1])), for the router kernel.
struct device_moe {
  device_matrix router;   // ffn_gate_inp, [n_expert rows, n_embd]
  device_matrix gate_up;  // [slots x (gate | up)] rows
  device_matrix down;     // [slots x n_embd] rows, n_ff long
  std::vector<int> slot_experts;
  cl::buffer rep_off, rep_slot;

  int n_slots() const { return static_cast<int>(slot_experts.size()); }
};

struct device_layer {
  cl::buffer attn_norm, ffn_norm;
  device_matrix qkv;      // [q | k | v] rows
  device_matrix wo;       // attention output
  device_matrix gate_up;  // [gate | up] rows (dense FFN)
  device_matrix down;
  std::shared_ptr<device_moe> moe;  // set for a mixture-of-experts FFN instead
};

struct device_weights {
  device_matrix embedding;                // token_embd, [n_vocab rows, n_embd]
  std::unique_ptr<device_matrix> output;  // null when tied to the embedding
  cl::buffer output_norm;
  std::vector<device_layer> layers;
  size_t bytes = 0;  // device memory used by weights

  const device_matrix& classifier() const { return output ? *output : embedding; }
};

device_weights upload_weights(cl::context& ctx, const model_file& model);

// Expert e of a stacked expert tensor (ffn_*_exps: shape [cols, rows, n_expert]).
tensor_view expert_slice(const tensor_view& stacked, int e);

// Layer `layer`'s experts uploaded into slots (slot s holding expert
// slot_experts[s]; every expert in at least one slot), with the router.
// Throws model_error for an expert id out of range or an expert in no slot.
std::shared_ptr<device_moe> upload_experts(cl::context& ctx, const model_file& model, int layer,
                                           const std::vector<int>& slot_experts);

}  // namespace troupe
