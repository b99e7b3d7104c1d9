// troupe bench bandwidth: this machine's memory read bandwidth, and with a
// model the single-stream decode roofline it sets (bandwidth over the
// weight bytes a decode step reads).  bench/engine_vs_llamacpp.py runs it
// beside the engines, so a tg figure reads as a share of that bound.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/memory_bandwidth.hpp"
#include "runtime/model/decode_bytes.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct bandwidth_flags {
  std::string model;
  int threads = 2;
  int mib = 1024;
  int passes = 5;
  bool json = false;
};

void run_bandwidth(const bandwidth_flags& f) {
  double weight_bytes = 0;
  std::string model_path;
  if (!f.model.empty()) {
    engine_settings e;
    e.model = f.model;
    const auto m = open_model(e);
    model_path = m->path();
    weight_bytes = decode_weight_bytes(*m);
  }
  if (!f.json)
    std::fprintf(stderr, "streaming %d MiB with %d thread(s), best of %d passes...\n", f.mib,
                 f.threads, f.passes);
  bandwidth_options o;
  o.threads = f.threads;
  o.bytes = static_cast<size_t>(f.mib) << 20;
  o.passes = f.passes;
  const double bw = read_bandwidth(o);
  nlohmann::json out = {{"threads", f.threads}, {"buffer_mib", f.mib}, {"read_gb_s", bw / 1e9}};
  if (weight_bytes > 0) {
    out["model"] = model_path;
    out["decode_weight_mb"] = weight_bytes / 1e6;
    out["decode_roofline_tok_s"] = bw / weight_bytes;
  }
  if (f.json) {
    std::cout << out.dump() << "\n";
    return;
  }
  std::printf("read bandwidth: %.1f GB/s (%d threads)\n", bw / 1e9, f.threads);
  if (weight_bytes > 0)
    std::printf("decode reads %.1f MB of weights a token: at most %.0f tokens/s (%s)\n",
                weight_bytes / 1e6, bw / weight_bytes, model_path.c_str());
}

}  // namespace

void add_bench_bandwidth(CLI::App& bench) {
  auto f = std::make_shared<bandwidth_flags>();
  auto* cmd = bench.add_subcommand(
      "bandwidth",
      "memory read bandwidth, and with --model the single-stream decode roofline it sets "
      "(bandwidth / weight bytes read a token)");
  cmd->add_option("-m,--model", f->model,
                  "model name or path: also report its weight bytes a decode step reads and "
                  "the tokens/s bound");
  cmd->add_option("-t,--threads", f->threads, "reader threads (match the engine's)")
      ->default_val(2)
      ->check(CLI::Range(1, 256));
  cmd->add_option("--mib", f->mib, "buffer size in MiB (well past the caches)")
      ->default_val(1024)
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--passes", f->passes, "timed passes; the fastest is reported")
      ->default_val(5)
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f] { run_bandwidth(*f); });
}

}  // namespace troupe::cli
