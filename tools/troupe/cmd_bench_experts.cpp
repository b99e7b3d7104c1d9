// troupe bench experts: expert parallelism before and after a rebalance.
// A mixture-of-experts model runs with its experts spread over
// --expert-devices one-core sub-devices; --seqs sequences decode together
// (random tokens, a batched decode step per token).  The first phase runs
// the initial placement; then a placement is planned from the expert loads
// the device counted (runtime/device/expert_placement, the controller's policy)
// and swapped in with the device's two-phase protocol (expprepare,
// expcommit); the second phase runs it.  Each phase reports decode
// throughput, tokens per expert device (max over mean) and each expert
// device's kernel time.  A reference engine with the experts on the whole
// device (no sub-devices) runs the same steps for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "actors/device.hpp"
#include "runtime/device/expert_placement.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct experts_flags {
  engine_settings engine;
  int seqs = 8;
  int prompt = 16;
  int steps = 64;
  int reps = 3;
  int spare_slots = 1;
  bool json = false;
};

template <class T, class... Ts>
T ask(caf::actor_system& sys, const device_actor& dev, Ts&&... xs) {
  caf::scoped_actor self{sys};
  T out{};
  self->request(dev, caf::infinite, std::forward<Ts>(xs)...)
      .receive([&](T& r) { out = std::move(r); },
               [&](caf::error& e) { throw std::runtime_error(sys.render(e)); });
  return out;
}

// `seqs` sequences, each with its own run of pages, fed a prompt and then
// decoded together for `steps` steps; seconds of the decode steps.
double decode_run(const forward_fn& fwd, const device_info& info, const experts_flags& f,
                  std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(3, info.n_vocab - 1);
  const int len = f.prompt + f.steps;
  const int pps = (len + info.page_size - 1) / info.page_size;
  if (pps * f.seqs > info.n_pages) throw std::invalid_argument("KV arena too small; raise --kv-mb");
  auto batch_of = [&](int first_pos, int rows_per_seq) {
    forward_batch b;
    for (int s = 0; s < f.seqs; ++s) {
      forward_seq q;
      q.first_row = static_cast<int32_t>(b.tokens.size());
      q.n_rows = rows_per_seq;
      for (int p = 0; p < pps; ++p) q.pages.push_back(s * pps + p);
      for (int r = 0; r < rows_per_seq; ++r) {
        b.tokens.push_back(pick(rng));
        b.positions.push_back(first_pos + r);
      }
      b.logit_rows.push_back(q.first_row + rows_per_seq - 1);
      b.seqs.push_back(std::move(q));
    }
    return b;
  };
  fwd(batch_of(0, f.prompt));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < f.steps; ++i) fwd(batch_of(f.prompt + i, 1));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct phase {
  double tok_s = 0;            // median over reps
  double imbalance = 0;        // worst layer, tokens per expert device, max over mean
  std::vector<double> busy_s;  // per expert device, over the phase
};

nlohmann::json to_json(const phase& p) {
  return {{"decode_tokens_per_s", p.tok_s}, {"imbalance", p.imbalance}, {"busy_s", p.busy_s}};
}

phase measure(caf::actor_system& sys, const device_actor& dev, const forward_fn& fwd,
              const device_info& info, const experts_flags& f, std::mt19937& rng,
              expert_stats* loads) {
  const auto start = ask<expert_stats>(sys, dev, expert_stats_atom::value);  // resets counts
  std::vector<double> tps;
  for (int r = 0; r < f.reps; ++r) tps.push_back(f.seqs * f.steps / decode_run(fwd, info, f, rng));
  std::sort(tps.begin(), tps.end());
  const auto end = ask<expert_stats>(sys, dev, expert_stats_atom::value);
  phase p;
  p.tok_s = tps[tps.size() / 2];
  for (size_t d = 0; d < end.busy_s.size(); ++d)
    p.busy_s.push_back(end.busy_s[d] - (d < start.busy_s.size() ? start.busy_s[d] : 0.0));
  for (int l = 0; l < end.n_layers; ++l) {
    const std::vector<int64_t> tokens(end.tokens.begin() + l * end.n_experts,
                                      end.tokens.begin() + (l + 1) * end.n_experts);
    p.imbalance = std::max(p.imbalance, balance_of(end.layouts[l], tokens).max_over_mean);
  }
  if (loads) *loads = end;
  return p;
}

double max_over_mean(const std::vector<double>& v) {
  double sum = 0, mx = 0;
  for (double x : v) sum += x, mx = std::max(mx, x);
  return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 1.0;
}

int run_experts(const experts_flags& f) {
  auto model = open_model(f.engine);
  const auto& hp = model->hparams();
  if (hp.n_expert == 0) throw std::invalid_argument(model->path() + " is not a mixture of experts");
  if (f.engine.expert_devices < 2)
    throw std::invalid_argument("--expert-devices must be 2 or more for this benchmark");
  actor_env env;
  auto opts = device_options(f.engine);
  opts.max_batch_tokens = std::max(opts.max_batch_tokens, f.seqs * f.prompt);
  auto dev = spawn_device(*env.sys, model, opts);
  const auto info = query_info(*env.sys, dev);
  auto fwd = blocking_forward(*env.sys, dev);
  std::mt19937 rng(42);
  decode_run(fwd, info, f, rng);  // warm-up: kernel builds, first touches

  expert_stats loads;
  const phase before = measure(*env.sys, dev, fwd, info, f, rng, &loads);
  // The controller's policy on the loads just counted, swapped in with the
  // device's two-phase protocol.
  const int D = loads.devices;
  const int slots = (hp.n_expert + D - 1) / D + f.spare_slots;
  expert_plan plan{1, {}};
  for (int l = 0; l < hp.n_layer; ++l)
    plan.layouts.push_back(
        plan_expert_layout(std::vector<int64_t>(loads.tokens.begin() + l * hp.n_expert,
                                                loads.tokens.begin() + (l + 1) * hp.n_expert),
                           D, slots));
  const auto t0 = std::chrono::steady_clock::now();
  ask<uint64_t>(*env.sys, dev, expert_prepare_atom::value, plan);
  const double prepare_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ask<uint64_t>(*env.sys, dev, expert_commit_atom::value, plan.epoch);
  decode_run(fwd, info, f, rng);  // warm-up of the new buffers
  const phase after = measure(*env.sys, dev, fwd, info, f, rng, nullptr);
  anon_send_exit(dev, caf::exit_reason::user_shutdown);

  // The same steps with the experts on the whole device.
  auto ref_opts = opts;
  ref_opts.expert_devices = 0;
  auto ref = spawn_device(*env.sys, model, ref_opts);
  auto ref_fwd = blocking_forward(*env.sys, ref);
  decode_run(ref_fwd, info, f, rng);
  std::vector<double> ref_tps;
  for (int r = 0; r < f.reps; ++r)
    ref_tps.push_back(f.seqs * f.steps / decode_run(ref_fwd, info, f, rng));
  std::sort(ref_tps.begin(), ref_tps.end());
  const double ref_tok_s = ref_tps[ref_tps.size() / 2];
  anon_send_exit(ref, caf::exit_reason::user_shutdown);

  if (f.json) {
    std::cout << nlohmann::json{{"model", model->path()},  {"device", info.device_name},
                                {"expert_devices", D},     {"seqs", f.seqs},
                                {"steps", f.steps},        {"before", to_json(before)},
                                {"after", to_json(after)}, {"prepare_ms", prepare_ms},
                                {"plan", plan.layouts},    {"whole_device_tokens_per_s", ref_tok_s}}
                     .dump()
              << std::endl;
    return 0;
  }
  std::printf("model %s, %d expert devices, %d sequences x %d decode steps, median of %d\n",
              model->path().c_str(), D, f.seqs, f.steps, f.reps);
  std::printf("| %-24s | %10s | %18s | %-24s | %14s |\n", "placement", "decode t/s",
              "tokens max/mean", "busy s per device", "busy max/mean");
  auto row = [&](const char* name, const phase& p) {
    std::string busy;
    for (double b : p.busy_s) busy += (busy.empty() ? "" : " / ") + std::to_string(b).substr(0, 5);
    std::printf("| %-24s | %10.1f | %18.3f | %-24s | %14.3f |\n", name, p.tok_s, p.imbalance,
                busy.c_str(), max_over_mean(p.busy_s));
  };
  row("initial", before);
  row("rebalanced", after);
  std::printf(
      "prepare (upload of the new placement): %.1f ms; whole device, no expert devices: "
      "%.1f t/s\n",
      prepare_ms, ref_tok_s);
  return 0;
}

}  // namespace

void add_bench_experts(CLI::App& bench) {
  auto f = std::make_shared<experts_flags>();
  auto* cmd = bench.add_subcommand(
      "experts",
      "MoE expert parallelism: decode throughput and device load before and after a "
      "rebalance");
  add_engine_flags(*cmd, f->engine);
  cmd->add_option("--seqs", f->seqs, "sequences decoding together")
      ->default_val(8)
      ->check(CLI::Range(1, 256));
  cmd->add_option("--prompt", f->prompt, "prompt tokens per sequence")
      ->default_val(16)
      ->check(CLI::Range(1, 4096));
  cmd->add_option("-n,--steps", f->steps, "decode steps per run")
      ->default_val(64)
      ->check(CLI::Range(1, 4096));
  cmd->add_option("-r,--reps", f->reps, "runs per phase (the median is reported)")
      ->default_val(3)
      ->check(CLI::Range(1, 100));
  cmd->add_option("--spare-slots", f->spare_slots, "slots per expert device beyond an even share")
      ->default_val(1)
      ->check(CLI::Range(0, 256));
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f] { run_experts(*f); });
}

}  // namespace troupe::cli
