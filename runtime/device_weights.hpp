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

struct device_layer {
  cl::buffer attn_norm, ffn_norm;
  device_matrix qkv;      // [q | k | v] rows
  device_matrix wo;       // attention output
  device_matrix gate_up;  // [gate | up] rows
  device_matrix down;
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

}  // namespace troupe
