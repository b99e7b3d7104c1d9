// troupe bench engine: llama-bench style prompt processing (pp) and token
// generation (tg) throughput of the device actor, one sequence.  tg is a
// greedy generation: each step's token is the last step's greedy draw,
// with two steps on their way as the instance sends them (step overlap),
// so a pipelining device (engine_options::pipeline) runs them back to back.
// (llama-bench's tg feeds random tokens and samples nothing.)  With
// --temperature, tg's draws are seeded samples (top-k, top-p, min-p); with
// penalties, each step carries its window's counts as the instance sends
// them (the tokens drawn so far, but the last, still on the device).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "actors/device.hpp"
#include "runtime/engine/step_overlap.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct bench_flags {
  engine_settings engine;
  int n_prompt = 512;
  int n_gen = 128;
  int reps = 3;
  bool json = false;
  sampling_params sampling;  // tg's draws: greedy unless a temperature is given
};

struct stat {
  double mean = 0, sd = 0;
};

stat summarize(const std::vector<double>& v) {
  stat s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / (v.size() - 1)) : 0.0;
  return s;
}

int run_bench(const bench_flags& f) {
  auto model = open_model(f.engine);
  // As llama-bench: allowed, said.
  if (const int n_ctx = model->hparams().n_ctx_train;
      n_ctx > 0 && std::max(f.n_prompt, 1 + f.n_gen) > n_ctx)
    std::fprintf(stderr,
                 "troupe bench engine: warning: -p %d / -n %d go past the model's training context "
                 "of %d tokens\n",
                 f.n_prompt, f.n_gen, n_ctx);
  actor_env env;
  auto opts = device_options(f.engine);
  opts.max_batch_tokens = std::max(opts.max_batch_tokens, f.n_prompt);
  auto dev = spawn_device(*env.sys, model, opts);
  auto fwd = blocking_forward(*env.sys, dev);
  const auto info = query_info(*env.sys, dev);
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> pick(3, info.n_vocab - 1);
  using clock = std::chrono::steady_clock;

  // One untimed warm-up of each shape (kernel compilation, first touches).
  auto run_pp = [&](int n) {
    linear_pages pages(info.n_pages, info.page_size);
    sequence_slot seq;
    std::vector<int32_t> toks(n);
    for (auto& t : toks) t = pick(rng);
    auto t0 = clock::now();
    feed_tokens(fwd, pages, seq, toks, std::max(n, 1), false);
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  auto run_tg = [&](int n) {
    linear_pages pages(info.n_pages, info.page_size);
    sequence_slot seq;
    const int32_t first = pick(rng), second = pick(rng);
    feed_tokens(fwd, pages, seq, {first}, 1, false);
    // The tokens known to the host: the first two, then the draws answered.
    std::vector<int32_t> history = {first, second};
    // Step k's token: step k-1's draw (a placeholder), except the first's.
    auto decode_step = [&](uint64_t k) {
      pages.reserve(seq, seq.length + 1);
      forward_batch b;
      b.step = k;
      b.tokens = {k == 1 ? second : 0};
      b.positions = {seq.length};
      b.seqs.push_back({0, 1, seq.pages});
      b.logit_rows = {0};
      b.presample.push_back(make_presample_row(0, f.sampling, seq.length + 1, history));
      if (k > 1) {
        b.after = k - 1;
        b.placeholders.push_back({0, 0});
      }
      ++seq.length;
      return b;
    };
    caf::scoped_actor self{*env.sys};
    std::deque<decltype(self->request(dev, caf::infinite, forward_atom::value, forward_batch{}))>
        on_way;
    auto answer = [&] {
      std::string err;
      on_way.front().receive(
          [&](forward_result& r) {
            if (!r.drawn.empty()) history.push_back(r.drawn[0]);
          },
          [&](caf::error& e) { err = self->system().render(e); });
      on_way.pop_front();
      if (!err.empty()) throw std::runtime_error(err);
    };
    auto t0 = clock::now();
    for (int k = 1; k <= n; ++k) {
      on_way.push_back(self->request(dev, caf::infinite, forward_atom::value, decode_step(k)));
      if (on_way.size() == 2) answer();
    }
    while (!on_way.empty()) answer();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  nlohmann::json results = nlohmann::json::array();
  auto report = [&](const char* test, int n, const std::function<double(int)>& fn) {
    if (n <= 0) return;
    fn(std::min(n, 16));
    std::vector<double> tps;
    for (int r = 0; r < f.reps; ++r) tps.push_back(n / fn(n));
    auto s = summarize(tps);
    results.push_back({{"test", std::string(test) + std::to_string(n)},
                       {"tokens_per_s", s.mean},
                       {"stddev", s.sd},
                       {"reps", f.reps}});
    if (!f.json)
      std::printf("| %-28s | %-6s%-5d | %10.2f ± %-8.2f |\n",
                  model->path().substr(model->path().rfind('/') + 1).c_str(), test, n, s.mean,
                  s.sd);
  };
  if (!f.json) {
    std::printf("device: %s\n", info.device_name.c_str());
    std::printf("| %-28s | %-11s | %-21s |\n", "model", "test", "t/s");
  }
  report("pp", f.n_prompt, run_pp);
  report("tg", f.n_gen, run_tg);
  if (f.json)
    std::cout << nlohmann::json{{"device", info.device_name},
                                {"model", model->path()},
                                {"results", results}}
                     .dump()
              << std::endl;
  anon_send_exit(dev, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace

void add_bench_batch(CLI::App& bench);      // cmd_bench_batch.cpp
void add_bench_serve(CLI::App& bench);      // cmd_bench_serve.cpp
void add_bench_sim(CLI::App& bench);        // cmd_bench_sim.cpp
void add_bench_calibrate(CLI::App& bench);  // cmd_bench_calibrate.cpp
void add_bench_experts(CLI::App& bench);    // cmd_bench_experts.cpp
void add_bench_static(CLI::App& bench);     // cmd_bench_static.cpp
void add_bench_epd(CLI::App& bench);        // cmd_bench_epd.cpp
void add_bench_placement(CLI::App& bench);  // cmd_bench_placement.cpp
void add_bench_bandwidth(CLI::App& bench);  // cmd_bench_bandwidth.cpp
void add_bench_compute(CLI::App& bench);    // cmd_bench_compute.cpp

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto f = std::make_shared<bench_flags>();
  auto* cmd = bench->add_subcommand("engine", "llama-bench style pp/tg throughput of one sequence");
  add_engine_flags(*cmd, f->engine);
  cmd->add_option("-p,--n-prompt", f->n_prompt, "prompt tokens (pp test; 0 skips)")
      ->default_val(512)
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", f->n_gen, "generated tokens (tg test; 0 skips)")
      ->default_val(128)
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-r,--reps", f->reps, "repetitions")->default_val(3)->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_option("--temperature", f->sampling.temperature,
                  "tg: sample at this temperature, seeded (0: greedy)")
      ->default_val(0.0f)
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", f->sampling.top_k, "tg: top-k (0: off)")
      ->default_val(0)
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--top-p", f->sampling.top_p, "tg: top-p (1: off)")
      ->default_val(1.0f)
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--min-p", f->sampling.min_p, "tg: min-p (0: off)")
      ->default_val(0.0f)
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--seed", f->sampling.seed, "tg: the draws' seed")
      ->default_val(42)
      ->check(whole_number());
  cmd->add_option("--repetition-penalty", f->sampling.repetition_penalty,
                  "tg: repetition penalty (1: off)")
      ->default_val(1.0f);
  cmd->add_option("--presence-penalty", f->sampling.presence_penalty,
                  "tg: presence penalty (0: off)")
      ->default_val(0.0f);
  cmd->add_option("--frequency-penalty", f->sampling.frequency_penalty,
                  "tg: frequency penalty (0: off)")
      ->default_val(0.0f);
  cmd->add_option("--penalty-last-n", f->sampling.penalty_last_n,
                  "tg: the penalties' window in tokens (-1: the whole sequence)")
      ->default_val(64);
  cmd->callback([f] {
    if (auto err = validate(f->sampling); !err.empty()) throw CLI::ValidationError(err);
    run_bench(*f);
  });
  add_bench_batch(*bench);
  add_bench_experts(*bench);
  add_bench_serve(*bench);
  add_bench_sim(*bench);
  add_bench_static(*bench);
  add_bench_epd(*bench);
  add_bench_placement(*bench);
  add_bench_calibrate(*bench);
  add_bench_bandwidth(*bench);
  add_bench_compute(*bench);
}

}  // namespace troupe::cli
