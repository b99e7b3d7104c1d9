#pragma once
// The weight bytes one decode step of one sequence reads: the numerator of
// the single-stream decode roofline (bench/memory_bandwidth.hpp; `troupe
// bench bandwidth`).
#include <string>

#include "runtime/model/model_file.hpp"

namespace troupe {

// Every tensor once, except the token embedding where a separate
// classifier exists (the lookup reads one row a token), and of a
// mixture-of-experts layer's expert tensors the n_expert_used / n_expert
// share a token is routed to.  As the file holds them: an engine that
// converts a type (troupe holds some K-quants in other formats) may read
// more or fewer.
double decode_weight_bytes(const model_file& m);

// The share of tensor `name` one token uses: n_expert_used / n_expert for
// a mixture-of-experts layer's expert tensors (`*_exps.*`), 1 for the
// rest.  The decode and prefill rooflines (prefill_flops.hpp) count by it.
double token_share(const model_hparams& h, const std::string& name);

}  // namespace troupe
