#pragma once
// The arithmetic one prompt token costs: the numerator of the prefill
// roofline (bench/compute_peak.hpp; `troupe bench compute`), as
// decode_bytes is the decode roofline's.
#include "runtime/model/model_file.hpp"

namespace troupe {

// Floating-point operations a token of a `prompt_len`-token prompt costs,
// an FMA counting two: every weight matrix of the layers once (of a
// mixture-of-experts layer's expert tensors the n_expert_used / n_expert
// share a token is routed to), and attention's two products (q.k and the
// weighted sum of v) over the positions the token sees, averaged over the
// prompt (a windowed layer sees at most its window).  Left out, as
// llama-bench's pp figure leaves them out: the classifier (a prompt's logits
// are the last token's only) and the embedding lookup; also the norms,
// RoPE and softmax, whose share is a few percent.  Throws
// std::invalid_argument on a prompt_len below 1.
double prefill_flops_per_token(const model_file& m, int prompt_len);

// Whether every layer matrix holds F32 or F16 weights, multiplied in F32,
// so that the F32 peak bounds prefill.  Quantized weights go through
// integer products (troupe's and llama.cpp's), which run at up to four
// times the F32 rate, and BF16 ones may go through BF16 products
// (llama.cpp's, with AVX512_BF16) at twice it: for such models the F32
// roofline is no bound.
bool float_layer_weights(const model_file& m);

}  // namespace troupe
