#pragma once

#include <cstdint>
#include <vector>

namespace troupe {

// GELU (tanh form) of every half, as ggml's CPU backend tabulates it for
// ggml_vec_gelu_f32 with GGML_GELU_FP16 (ggml_table_gelu_f16): entry i is
// the half nearest gelu(x) for the half x whose bits are i, gelu computed
// in float with the C library's tanhf.  The FFN kernels (kernels/matmul.cl,
// gelu_from_table) read it with x rounded to half, where |x| < 10 (ggml
// saturates outside), so Gemma's activations are ggml's and cost a lookup
// (a scalar tanh per value was 15% of Gemma 3's prefill).
std::vector<uint16_t> gelu_half_table();

// The "quick" GELU, x / (1 + exp(-1.702 x)), tabulated the same way
// (ggml_table_gelu_quick_f16, GGML_GELU_QUICK_FP16), with no saturation:
// CLIP's encoder MLP (kernels/vision.cl).
std::vector<uint16_t> gelu_quick_half_table();

}  // namespace troupe
