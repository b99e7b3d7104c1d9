// troupe bench sim-calibrate: measures the real engine and writes the cost
// model the cluster simulator runs on (sim/cost_model.hpp).  One
// instance in this process runs single prompts of several lengths,
// decode batches of several sizes and contexts, and a mixed batch; every
// forward pass is one sample (rows, decode rows, attention work, ms).  A
// second instance measures the KV handoff of disaggregation: a prompt
// prefilled on the first (prefill-only), exported, imported by the second.
// A step's cost is its device time plus the instance's host work after it
// (sampling, streaming, planning the next), the period a sequence sees.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <thread>

#include "actors/device.hpp"
#include "actors/instance.hpp"
#include "runtime/text/tokenizer.hpp"
#include "sim/cost_model.hpp"
#include "tools/troupe/admin_link.hpp"
#include "tools/troupe/bench_load.hpp"
#include "tools/troupe/common.hpp"
#include "tools/troupe/local_engine.hpp"

namespace troupe::cli {

namespace {

struct calibrate_flags {
  engine_settings engine;
  admin_target target;  // --server: refit from a live service's steps
  std::string base;     // with --server: the cost model whose other fields are kept
  int max_batch_tokens = 256;
  int max_seqs = 64;
  int chunk_size = 128;
  std::string out = "cost_model.json";
  unsigned seed = 7;
};

struct engine {
  device_actor dev;
  instance_actor inst;
  device_info info;
};

engine start(caf::actor_system& sys, const calibrate_flags& f,
             std::shared_ptr<const model_file> model, const tokenizer& tok) {
  engine e;
  auto opts = device_options(f.engine);
  opts.max_batch_tokens = std::max(opts.max_batch_tokens, f.max_batch_tokens);
  e.dev = spawn_device(sys, std::move(model), opts);
  e.info = query_info(sys, e.dev);
  instance_options io;
  io.limits = {f.max_batch_tokens, f.max_seqs, std::min(f.chunk_size, f.max_batch_tokens),
               e.info.page_size};
  io.eog_tokens = tok.end_of_generation_ids();
  io.prefix_caching = false;  // every prompt is computed, as the simulator assumes
  io.kept_steps = size_t{1} << 20;
  e.inst = spawn_instance(sys, e.dev, io);
  return e;
}

// The KV handoff of one prompt of `len` tokens: (blob bytes, ms from the
// export asked to the import answered).
std::pair<int64_t, double> handoff(caf::actor_system& sys, const engine& a, const engine& b,
                                   std::vector<int32_t> prompt, uint64_t id) {
  caf::scoped_actor self{sys};
  sequence_request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = 4;
  r.ignore_eos = true;
  r.prefill_only = true;
  r.sink = caf::actor_cast<token_sink_actor>(self.ptr());
  std::string err;
  int32_t first = -1;
  self->request(a.inst, caf::infinite, enqueue_atom::value, r)
      .receive([](int32_t) {}, [&](caf::error& e) { err = sys.render(e); });
  while (err.empty() && first < 0)
    self->receive([&](tokens_atom, const token_batch& t) {
      if (!t.tokens.empty()) first = t.tokens[0];
    });
  if (!err.empty()) throw std::runtime_error("calibrate: enqueue: " + err);
  const auto t0 = clock_type::now();
  std::vector<uint8_t> blob;
  self->request(a.inst, caf::infinite, export_atom::value, id)
      .receive([&](std::vector<uint8_t>& x) { blob = std::move(x); },
               [&](caf::error& e) { err = sys.render(e); });
  const int64_t bytes = int64_t(blob.size());
  r.prefill_only = false;
  r.generated = {first};
  self->request(b.inst, caf::infinite, import_atom::value, r, std::move(blob))
      .receive([](int32_t) {}, [&](caf::error& e) { err = sys.render(e); });
  const double ms = seconds_between(t0, clock_type::now()) * 1000;
  if (!err.empty()) throw std::runtime_error("calibrate: handoff: " + err);
  self->send(b.inst, abort_atom::value, id);
  // Until its last batch: the instance holds nothing of it after.
  for (bool done = false; !done;)
    self->receive(
        [&](tokens_atom, const token_batch& t) { done = t.finish != finish_reason::none; });
  return {bytes, ms};
}

int run_calibrate(const calibrate_flags& f) {
  auto model = open_model(f.engine);
  auto tok = tokenizer::create(model->vocab());
  actor_env env;
  auto a = start(*env.sys, f, model, *tok);
  auto b = start(*env.sys, f, model, *tok);
  const int32_t max_len = std::min(a.info.n_ctx, a.info.n_pages * a.info.page_size);
  std::mt19937 rng(f.seed);
  std::uniform_int_distribution<int32_t> pick(3, a.info.n_vocab - 1);
  auto prompt = [&](int n) {
    std::vector<int32_t> p(size_t(std::max(1, n)));
    for (auto& t : p) t = pick(rng);
    return p;
  };
  auto seq = [&](uint64_t id, int len, int gen) {
    sequence_request r;
    r.id = id;
    r.prompt = prompt(std::min(len, max_len - gen - 1));
    r.max_tokens = gen;
    r.ignore_eos = true;
    return r;
  };
  auto run = [&](const char* what, std::vector<sequence_request> reqs) {
    std::fprintf(stderr, "calibrate: %s (%zu sequences)\n", what, reqs.size());
    auto res = run_all(*env.sys, a.inst, std::move(reqs), false);
    if (res.bad_finishes > 0) throw std::runtime_error("calibrate: a sequence did not finish");
  };

  run("warm-up", {seq(0, 32, 4), seq(1, 32, 4)});
  const uint64_t warm_steps = query_stats(*env.sys, a.inst).steps;
  for (int len : {16, 32, 64, 128, 192, 256, 384, 512, 768})
    for (int rep = 0; rep < 2; ++rep) run("one prompt", {seq(0, len, 2)});
  for (int ctx : {64, 256, 512})
    for (int batch : {1, 2, 4, 8, 16, 32}) {
      std::vector<sequence_request> reqs;
      for (int i = 0; i < batch; ++i) reqs.push_back(seq(uint64_t(i), ctx, 24));
      run("decode batch", std::move(reqs));
    }
  {
    std::uniform_int_distribution<int> plen(16, 400), glen(8, 64);
    std::vector<sequence_request> reqs;
    for (int i = 0; i < 48; ++i) reqs.push_back(seq(uint64_t(i), plen(rng), glen(rng)));
    run("mixed batch", std::move(reqs));
  }
  const auto stats = query_stats(*env.sys, a.inst);
  std::vector<step_sample> samples;
  for (const auto& t : stats.recent_steps)
    if (t.step > warm_steps && t.rows > 0)
      samples.push_back({t.rows, t.decode_rows, t.context, t.ms + t.host_ms});
  auto m = cost_model::fit(samples);

  // The KV handoff: blob bytes against time, fitted as fixed + bytes / rate.
  std::fprintf(stderr, "calibrate: KV handoffs between two instances\n");
  std::vector<std::pair<int64_t, double>> moves;
  uint64_t id = 100;
  for (int len : {32, 128, 256, 512, 768})
    for (int rep = 0; rep < 3; ++rep)
      moves.push_back(handoff(*env.sys, a, b, prompt(std::min(len, max_len - 8)), id++));
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : moves) {
    sx += double(x);
    sy += y;
    sxx += double(x) * double(x);
    sxy += double(x) * y;
  }
  const double n = double(moves.size());
  double slope = (n * sxy - sx * sy) / std::max(1e-9, n * sxx - sx * sx);  // ms per byte
  slope = std::max(slope, 1e-9);
  m.transfer_fixed_ms = std::max(0.0, (sy - slope * sx) / n);
  m.transfer_mb_per_s = 1e-3 / slope;

  m.model = model->path();
  m.machine = a.info.device_name + ", " + std::to_string(std::thread::hardware_concurrency()) +
              " hardware threads";
  m.kv_bytes_per_token = a.info.kv_bytes_per_page / std::max(1, a.info.page_size);
  m.kv_pages = a.info.n_pages;
  m.page_size = a.info.page_size;
  auto j = m.to_json();
  j["limits"] = {{"max_batch_tokens", f.max_batch_tokens},
                 {"max_seqs", f.max_seqs},
                 {"chunk_size", f.chunk_size}};
  auto mv = nlohmann::json::array();
  for (auto [x, y] : moves) mv.push_back({{"bytes", x}, {"ms", y}});
  j["handoffs"] = mv;
  auto steps = nlohmann::json::array();
  for (const auto& x : samples) steps.push_back({x.rows, x.decode_rows, x.context, x.ms});
  j["steps"] = steps;  // rows, decode rows, attention work, ms
  write_json(f.out, j);
  std::printf(
      "cost model of %s: step ms = %.3f + %.5f x prefill rows + %.4f x decode rows + %.3g x "
      "attention work, one decode row alone %.3f (R^2 %.3f, MAPE %.1f%%, %zu steps, %zu read "
      "behind another left out); KV handoff %.2f ms + %.1f MB/s; written to %s\n",
      m.model.c_str(), m.c0, m.c_prefill, m.c_decode, m.c_context, m.c_one, m.fit_r2,
      m.fit_mape * 100, m.samples, m.dropped, m.transfer_fixed_ms, m.transfer_mb_per_s,
      f.out.c_str());
  for (auto* x : {&a, &b}) {
    anon_send_exit(x->inst, caf::exit_reason::user_shutdown);
    anon_send_exit(x->dev, caf::exit_reason::user_shutdown);
  }
  return 0;
}

// The steps a live service's instances kept (engine.step_history), under
// the load it served: the step costs as that deployment sees them (cores
// shared with the service, clients and other instances).  Transfer and KV
// fields come from `base`.
int run_calibrate_from_server(const calibrate_flags& f) {
  auto m = cost_model::load(f.base);
  admin_link link(f.target);
  if (!link.connect()) throw std::runtime_error("calibrate --server: " + link.why());
  auto reply = link.call("steps");
  if (!reply.ok) throw std::runtime_error("calibrate --server: steps: " + reply.message);
  std::vector<step_sample> samples;
  for (const auto& inst : reply.result)
    for (const auto& t : inst["steps"])
      if (t[0].get<int32_t>() > 0)
        samples.push_back({t[0].get<int32_t>(), t[1].get<int32_t>(), t[2].get<int64_t>(),
                           t[3].get<double>() + t[4].get<double>()});
  m.take_step_costs(cost_model::fit(samples));
  m.machine += " (steps of a live service at " + f.target.server + ")";
  write_json(f.out, m.to_json());
  std::printf(
      "cost model refitted from %zu steps of %s (%zu read behind another left out): step ms = "
      "%.3f + %.5f x prefill rows + %.4f x decode rows + %.3g x attention work, one decode row "
      "alone %.3f (R^2 %.3f, MAPE %.1f%%); written to %s\n",
      m.samples, f.target.server.c_str(), m.dropped, m.c0, m.c_prefill, m.c_decode, m.c_context,
      m.c_one, m.fit_r2, m.fit_mape * 100, f.out.c_str());
  return 0;
}

}  // namespace

void add_bench_calibrate(CLI::App& bench) {
  auto f = std::make_shared<calibrate_flags>();
  auto* cmd = bench.add_subcommand(
      "sim-calibrate",
      "measure the engine's step and KV-transfer costs and write the cost model bench sim runs "
      "on (takes a minute or two)");
  add_engine_flags(*cmd, f->engine);
  cmd->add_option("--server", f->target.server,
                  "refit the step costs from a live service's instances (serve with a large "
                  "--step-history, after loading it) instead of measuring here");
  cmd->add_option("--base", f->base, "with --server: the cost model whose other fields are kept")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "rows of one scheduler step")
      ->capture_default_str();
  cmd->add_option("--max-seqs", f->max_seqs, "sequences running at once")->capture_default_str();
  cmd->add_option("--chunk-size", f->chunk_size, "prefill rows of one sequence per step")
      ->capture_default_str();
  cmd->add_option("-o,--out", f->out, "the cost model file (JSON)")->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of the random prompts");
  cmd->callback([f] {
    if (!f->target.server.empty() && f->base.empty())
      throw CLI::ValidationError("--server", "needs --base (the transfer costs come from it)");
    const int rc = f->target.server.empty() ? run_calibrate(*f) : run_calibrate_from_server(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
