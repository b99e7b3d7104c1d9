#pragma once
// The machine's single-precision arithmetic peak, the ceiling of prefill:
// a prompt's tokens share each weight read, so prefill is bound by the
// multiply-adds, and a model costing F operations a token
// (runtime/model/prefill_flops.hpp) cannot prefill faster than peak / F
// tokens a second.  `troupe bench compute` reports both; engine benchmarks
// read their pp figures as a share of that bound (docs/bench_engine.md).
#include <string>

namespace troupe {

struct compute_options {
  int threads = 2;       // each running its own chains of fused multiply-adds
  double seconds = 0.2;  // the length of one timed pass
  int passes = 5;        // the best pass is the figure (the machine is shared)
};

struct compute_peak {
  double flops = 0;  // floating-point operations a second, an FMA counting two
  std::string isa;   // the vector instructions used: "avx512f", "avx2+fma" or "generic"
};

// F32 fused multiply-adds on the widest vectors the CPU offers, in enough
// independent chains to fill its pipelines, `threads` threads at once.
// Throws std::invalid_argument on options out of range (threads 1-256,
// seconds 0.01-60, passes 1-1000).
compute_peak f32_fma_peak(const compute_options& o);

}  // namespace troupe
