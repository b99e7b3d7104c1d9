// troupe bench compute: this machine's F32 arithmetic peak, and with a
// model the prefill roofline it sets (the peak over the operations a prompt
// token costs).  bench/engine_vs_llamacpp.py runs it beside the engines, so
// a pp figure reads as a share of that bound, as tg does of the bandwidth's.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/compute_peak.hpp"
#include "runtime/model/prefill_flops.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct compute_flags {
  std::string model;
  int prompt_len = 512;
  int threads = 2;
  int passes = 5;
  bool json = false;
};

void run_compute(const compute_flags& f) {
  double flops_per_token = 0;
  bool float_weights = false;
  std::string model_path;
  if (!f.model.empty()) {
    engine_settings e;
    e.model = f.model;
    const auto m = open_model(e);
    model_path = m->path();
    flops_per_token = prefill_flops_per_token(*m, f.prompt_len);
    float_weights = float_layer_weights(*m);
  }
  if (!f.json)
    std::fprintf(stderr, "F32 multiply-adds on %d thread(s), best of %d passes...\n", f.threads,
                 f.passes);
  compute_options o;
  o.threads = f.threads;
  o.passes = f.passes;
  const auto peak = f32_fma_peak(o);
  nlohmann::json out = {{"threads", f.threads}, {"isa", peak.isa}, {"f32_gflop_s", peak.flops / 1e9}};
  if (flops_per_token > 0) {
    out["model"] = model_path;
    out["prompt_len"] = f.prompt_len;
    out["prefill_mflop_per_token"] = flops_per_token / 1e6;
    out["float_weights"] = float_weights;
    if (float_weights) out["prefill_roofline_tok_s"] = peak.flops / flops_per_token;
  }
  if (f.json) {
    std::cout << out.dump() << "\n";
    return;
  }
  std::printf("F32 peak: %.1f GFLOP/s (%d threads, %s)\n", peak.flops / 1e9, f.threads,
              peak.isa.c_str());
  if (flops_per_token > 0 && float_weights)
    std::printf("a token of a %d-token prompt costs %.2f MFLOP: at most %.0f tokens/s in F32 (%s)\n",
                f.prompt_len, flops_per_token / 1e6, peak.flops / flops_per_token,
                model_path.c_str());
  else if (flops_per_token > 0)
    std::printf(
        "a token of a %d-token prompt costs %.2f MFLOP (%s); its layers' weights are quantized, "
        "multiplied in integers at up to 4x the F32 rate: the F32 peak bounds nothing\n",
        f.prompt_len, flops_per_token / 1e6, model_path.c_str());
}

}  // namespace

void add_bench_compute(CLI::App& bench) {
  auto f = std::make_shared<compute_flags>();
  auto* cmd = bench.add_subcommand(
      "compute",
      "F32 arithmetic peak, and with --model the prefill roofline it sets "
      "(peak / operations a prompt token costs; for float weights)");
  cmd->add_option("-m,--model", f->model,
                  "model name or path: also report the operations a prompt token costs and the "
                  "tokens/s bound");
  cmd->add_option("-p,--prompt-len", f->prompt_len,
                  "the prompt length the token's attention is averaged over (llama-bench's pp)")
      ->default_val(512)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--threads", f->threads, "threads (match the engine's)")
      ->default_val(2)
      ->check(CLI::Range(1, 256));
  cmd->add_option("--passes", f->passes, "timed passes of 0.2 s; the fastest is reported")
      ->default_val(5)
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f] { run_compute(*f); });
}

}  // namespace troupe::cli
