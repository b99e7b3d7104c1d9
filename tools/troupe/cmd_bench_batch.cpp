// troupe bench batch: offline throughput of one instance with many
// requests in flight (continuous batching), llama-batched-bench style.
// Every request is enqueued at once; each gets a random (seeded) prompt of
// --prompt-len tokens and generates exactly --gen-len tokens, greedy, EOS
// ignored.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/device.hpp"
#include "actors/instance.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tools/troupe/common.hpp"
#include "tools/troupe/local_engine.hpp"

namespace troupe::cli {

namespace {

struct batch_flags {
  engine_settings engine;
  int requests = 64;
  int prompt_len = 128;
  int gen_len = 128;
  int max_batch_tokens = 512;
  int max_seqs = 64;
  int chunk_size = 128;
  unsigned seed = 42;
  bool no_prefix_cache = false;
  bool json = false;
  bool kv_mb_given = false;
};

int run_batch(const batch_flags& f) {
  auto model = open_model(f.engine);
  auto tok = tokenizer::create(model->vocab());
  actor_env env;
  auto opts = device_options(f.engine);
  opts.max_batch_tokens = std::max(opts.max_batch_tokens, f.max_batch_tokens);
  const int pages_per_seq =
      (f.prompt_len + f.gen_len + f.engine.page_size - 1) / f.engine.page_size;
  if (!f.kv_mb_given) {
    // Room for every request at full length (no preemption), plus a
    // little for the warm-up.
    opts.n_pages = f.requests * pages_per_seq + 2 * pages_per_seq + 8;
  }
  auto dev = spawn_device(*env.sys, model, opts);
  const auto info = query_info(*env.sys, dev);

  instance_options io;
  io.limits.max_batch_tokens = f.max_batch_tokens;
  io.limits.max_seqs = f.max_seqs;
  io.limits.chunk_size = std::min(f.chunk_size, f.max_batch_tokens);
  io.limits.page_size = info.page_size;
  io.eog_tokens = tok->end_of_generation_ids();
  io.prefix_caching = !f.no_prefix_cache;
  io.step_overlap = f.engine.step_overlap;
  auto inst = spawn_instance(*env.sys, dev, io);

  std::mt19937 rng(f.seed);
  std::uniform_int_distribution<int32_t> pick(3, info.n_vocab - 1);
  auto make = [&](uint64_t id, int prompt_len, int gen_len) {
    sequence_request r;
    r.id = id;
    r.prompt.resize(static_cast<size_t>(prompt_len));
    for (auto& t : r.prompt) t = pick(rng);
    r.max_tokens = gen_len;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    r.cls = seq_class::offline;
    return r;
  };

  // Untimed warm-up: both step shapes (prefill chunks, batched decode).
  {
    std::vector<sequence_request> warm;
    for (uint64_t i = 0; i < 2; ++i) warm.push_back(make(i, std::min(f.prompt_len, 32), 4));
    run_all(*env.sys, inst, std::move(warm), false);
  }
  const auto before = query_stats(*env.sys, inst);

  std::vector<sequence_request> reqs;
  for (int i = 0; i < f.requests; ++i)
    reqs.push_back(make(static_cast<uint64_t>(i), f.prompt_len, f.gen_len));
  const auto res = run_all(*env.sys, inst, std::move(reqs), true);
  const auto after = query_stats(*env.sys, inst);

  const uint64_t steps = after.steps - before.steps;
  const uint64_t overlapped = after.overlapped_steps - before.overlapped_steps;
  const double idle_ms = after.device_idle_ms - before.device_idle_ms;
  const double idle_ms_per_step = steps ? idle_ms / steps : 0.0;
  const uint64_t prompt_tokens = static_cast<uint64_t>(f.requests) * f.prompt_len;
  const uint64_t prefill_rows = after.prefill_tokens - before.prefill_tokens;
  const uint64_t decode_rows = after.decode_tokens - before.decode_tokens;
  const uint64_t preemptions = (after.preempted_recompute - before.preempted_recompute) +
                               (after.preempted_swap - before.preempted_swap);
  const double gen_tps = res.generated / res.wall_s;
  const double total_tps = (prompt_tokens + res.generated) / res.wall_s;
  const double step_ms = steps ? res.wall_s * 1e3 / steps : 0.0;
  const double decode_phase_s = res.wall_s - res.last_first_token_s;
  const double decode_phase_tps =
      decode_phase_s > 0 ? res.generated_after_prefill / decode_phase_s : 0.0;

  if (f.json) {
    std::cout << nlohmann::json{{"device", info.device_name},
                                {"model", model->path()},
                                {"requests", f.requests},
                                {"prompt_len", f.prompt_len},
                                {"gen_len", f.gen_len},
                                {"max_batch_tokens", f.max_batch_tokens},
                                {"max_seqs", f.max_seqs},
                                {"chunk_size", io.limits.chunk_size},
                                {"n_pages", info.n_pages},
                                {"wall_s", res.wall_s},
                                {"generated_tokens", res.generated},
                                {"prompt_tokens", prompt_tokens},
                                {"gen_tokens_per_s", gen_tps},
                                {"total_tokens_per_s", total_tps},
                                {"steps", steps},
                                {"mean_step_ms", step_ms},
                                {"step_overlap", io.step_overlap},
                                {"overlapped_steps", overlapped},
                                {"device_idle_ms_per_step", idle_ms_per_step},
                                {"prefill_rows", prefill_rows},
                                {"decode_rows", decode_rows},
                                {"all_started_s", res.last_first_token_s},
                                {"decode_phase_tokens_per_s", decode_phase_tps},
                                {"preemptions", preemptions},
                                {"incomplete", res.bad_finishes}}
                     .dump()
              << std::endl;
  } else {
    std::printf("device: %s\nmodel: %s\n", info.device_name.c_str(), model->path().c_str());
    std::printf(
        "requests %d, prompt %d, gen %d, max batch tokens %d, max seqs %d, chunk %d, "
        "KV pages %d\n",
        f.requests, f.prompt_len, f.gen_len, f.max_batch_tokens, f.max_seqs, io.limits.chunk_size,
        info.n_pages);
    std::printf("wall time           %10.3f s\n", res.wall_s);
    std::printf("generated tokens    %10llu  (%.2f t/s)\n",
                static_cast<unsigned long long>(res.generated), gen_tps);
    std::printf("total tokens        %10llu  (%.2f t/s, prompt + generated)\n",
                static_cast<unsigned long long>(prompt_tokens + res.generated), total_tps);
    std::printf("steps               %10llu  (mean %.2f ms/step)\n",
                static_cast<unsigned long long>(steps), step_ms);
    std::printf(
        "step overlap        %10s  (%llu steps sent while one ran; device idle %.3f "
        "ms/step)\n",
        io.step_overlap ? "on" : "off", static_cast<unsigned long long>(overlapped),
        idle_ms_per_step);
    std::printf("rows computed       %10llu prefill, %llu decode\n",
                static_cast<unsigned long long>(prefill_rows),
                static_cast<unsigned long long>(decode_rows));
    std::printf("all started after   %10.3f s; after that %.2f generated t/s\n",
                res.last_first_token_s, decode_phase_tps);
    std::printf("preemptions         %10llu\n", static_cast<unsigned long long>(preemptions));
  }
  if (res.bad_finishes > 0)
    std::fprintf(stderr, "warning: %d requests did not reach max_tokens\n", res.bad_finishes);
  anon_send_exit(inst, caf::exit_reason::user_shutdown);
  anon_send_exit(dev, caf::exit_reason::user_shutdown);
  return res.bad_finishes > 0 ? 1 : 0;
}

}  // namespace

void add_bench_batch(CLI::App& bench) {
  auto f = std::make_shared<batch_flags>();
  auto* cmd = bench.add_subcommand(
      "batch", "offline throughput with many requests in flight (continuous batching)");
  // The one-process engine keys, and step overlap (an instance runs here).
  add_engine_flags(*cmd, f->engine, [](const setting_key& k) {
    return settings_flags::local_keys(k) || k.name() == "engine.step_overlap";
  });
  cmd->add_option("--requests", f->requests, "requests, all enqueued at once")
      ->default_val(64)
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--prompt-len", f->prompt_len, "prompt tokens of each request (random)")
      ->default_val(128)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen-len", f->gen_len, "generated tokens of each request (EOS ignored)")
      ->default_val(128)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "rows of one step")
      ->default_val(512)
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--max-seqs", f->max_seqs, "running sequences at once")
      ->default_val(64)
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--chunk-size", f->chunk_size, "most prefill rows of one sequence per step")
      ->default_val(128)
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--seed", f->seed, "prompt seed")->default_val(42);
  cmd->add_flag("--no-prefix-cache", f->no_prefix_cache, "disable prefix caching");
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f, cmd] {
    // Without --kv-mb the arena is sized to hold every request at once.
    f->kv_mb_given = cmd->count("--kv-mb") > 0;
    const int rc = run_batch(*f);
    if (rc != 0) throw std::runtime_error("bench batch: some requests did not complete");
  });
}

}  // namespace troupe::cli
