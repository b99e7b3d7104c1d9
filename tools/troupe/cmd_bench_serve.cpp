// troupe bench serve: a serving load generator with the metrics of
// `vllm bench serve` (same option names where vLLM has one), against a
// running `troupe serve` over the client protocol or, as a peer, against
// any OpenAI-compatible streaming endpoint (llama-server's /v1/completions).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "runtime/bench_driver.hpp"
#include "runtime/bench_openai.hpp"
#include "runtime/bench_sweep.hpp"
#include "tools/client/client.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

using bench::bench_request;
using bench::request_context;
using bench::request_record;

// troupe's client protocol: a pool of DEALER connections, one request at a
// time on each; a connection whose request timed out is dropped, so late
// replies cannot reach the next request.
class troupe_backend final : public bench::bench_backend {
 public:
  explicit troupe_backend(std::string endpoint) : endpoint_(std::move(endpoint)) {}
  std::string name() const override { return "troupe"; }

  void run(const bench_request& req, const request_context& ctx, request_record& rec) override {
    auto conn = take();
    const uint64_t id = next_id_++;
    wire::Generate g;
    g.set_request_id(id);
    if (req.prompt_tokens.empty())
      g.set_text(req.prompt_text);
    else
      for (int32_t t : req.prompt_tokens) g.mutable_tokens()->add_ids(t);
    if (req.output_len > 0) g.set_max_tokens(req.output_len);
    g.mutable_sampling()->set_temperature(static_cast<float>(ctx.temperature));
    g.set_ignore_eos(ctx.ignore_eos);
    g.set_stream(true);
    g.set_request_class(req.offline ? wire::OFFLINE : wire::ONLINE);
    conn->generate(g);
    for (;;) {
      auto msg = conn->receive(ctx.timeout);
      if (!msg) {
        rec.error_code = "timeout";
        rec.error_message = endpoint_ + ": no reply for " + std::to_string(ctx.timeout.count()) +
                            " ms (request " + std::to_string(id) + ")";
        try {
          conn->cancel(id);
        } catch (const std::exception&) {
        }
        return;  // the connection is dropped
      }
      switch (msg->body_case()) {
        case wire::ServerMessage::kAccepted:
          if (msg->accepted().request_id() == id)
            rec.prompt_tokens = static_cast<int>(msg->accepted().prompt_tokens());
          break;
        case wire::ServerMessage::kChunk: {
          const auto& c = msg->chunk();
          if (c.request_id() != id || c.token_ids_size() == 0) break;
          rec.chunk_times.push_back(ctx.now());
          rec.chunk_tokens.push_back(c.token_ids_size());
          rec.output_tokens += c.token_ids_size();
          if (ctx.tokens_seen) *ctx.tokens_seen += c.token_ids_size();
          break;
        }
        case wire::ServerMessage::kFinished: {
          const auto& f = msg->finished();
          if (f.request_id() != id) break;
          finish(f, rec);
          give_back(std::move(conn));
          return;
        }
        case wire::ServerMessage::kError: {
          const auto& e = msg->error();
          if (e.has_request_id() && e.request_id() != id) break;
          rec.error_code = wire::ErrorCode_Name(e.code());
          for (auto& ch : rec.error_code) ch = static_cast<char>(std::tolower(ch));
          rec.error_message = e.message();
          if (e.has_request_id()) give_back(std::move(conn));
          return;
        }
        default:
          break;
      }
    }
  }

 private:
  static void finish(const wire::Finished& f, request_record& rec) {
    rec.output_tokens = static_cast<int>(f.completion_tokens());
    if (f.prompt_tokens() > 0) rec.prompt_tokens = static_cast<int>(f.prompt_tokens());
    switch (f.reason()) {
      case wire::STOP:
      case wire::LENGTH:
      case wire::EOS:
        if (rec.chunk_times.empty()) {
          rec.error_code = "no_output";
          rec.error_message = "finished (" + client::to_string(f.reason()) + ") without a token";
        } else {
          rec.success = true;
        }
        return;
      default:
        rec.error_code = "finish_" + client::to_string(f.reason());
        rec.error_message = f.error();
    }
  }

  std::unique_ptr<client::connection> take() {
    {
      std::lock_guard lock(mu_);
      if (!pool_.empty()) {
        auto c = std::move(pool_.back());
        pool_.pop_back();
        return c;
      }
    }
    return std::make_unique<client::connection>(endpoint_);
  }
  void give_back(std::unique_ptr<client::connection> c) {
    std::lock_guard lock(mu_);
    pool_.push_back(std::move(c));
  }

  std::string endpoint_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;
  std::vector<std::unique_ptr<client::connection>> pool_;
};

struct serve_flags {
  std::string backend = "troupe";
  std::string server = "tcp://127.0.0.1:5555";
  std::string base_url = "http://127.0.0.1:8080";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string dataset = "random";
  std::string dataset_path;
  size_t num_requests = 100;
  double request_rate = bench::infinite_rate;
  double burstiness = 1.0;
  std::string trace;
  size_t max_concurrency = 0;
  double duration = 0;
  size_t num_warmups = 0;
  bench::random_spec random;
  bench::shared_prefix_spec prefix;
  int custom_output_len = 128;
  int32_t vocab_size = 32000;
  int32_t first_token_id = 256;
  bool ignore_eos = false;
  double offline_fraction = 0;
  std::vector<std::string> goodput;
  double temperature = 0;
  double request_timeout = 120;
  uint64_t seed = 0;
  std::string json_out;
  bool no_progress = false;
  bool sweep = false;
  bench::sweep_spec sweep_spec;
};

std::vector<bench_request> make_dataset(const serve_flags& f) {
  std::vector<bench_request> reqs;
  if (f.dataset == "random") {
    auto spec = f.random;
    spec.tokens = {f.first_token_id, f.vocab_size};
    reqs = bench::random_dataset(f.num_requests, spec, f.seed);
  } else if (f.dataset == "shared-prefix") {
    auto spec = f.prefix;
    spec.tokens = {f.first_token_id, f.vocab_size};
    reqs = bench::shared_prefix_dataset(f.num_requests, spec, f.seed);
  } else {
    if (f.dataset_path.empty()) throw CLI::ValidationError("--dataset-path", "jsonl needs a file");
    reqs = bench::jsonl_dataset(f.dataset_path, f.num_requests, f.custom_output_len);
  }
  bench::assign_classes(reqs, f.offline_fraction, f.seed);
  return reqs;
}

std::string rate_text(double rate) {
  if (std::isinf(rate)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", rate);
  return buf;
}

nlohmann::json rate_json(double rate) {
  return std::isinf(rate) ? nlohmann::json("inf") : nlohmann::json(rate);
}

nlohmann::json records_json(const std::vector<request_record>& records) {
  auto per = nlohmann::json::array();
  for (const auto& r : records)
    per.push_back({{"send_time", r.send_time},
                   {"ttft", r.ttft()},
                   {"e2el", r.e2e()},
                   {"prompt_tokens", r.prompt_tokens},
                   {"output_tokens", r.output_tokens},
                   {"itl", r.itls()},
                   {"success", r.success},
                   {"error", r.error_code},
                   {"error_message", r.error_message}});
  return per;
}

// The first few failures, with their messages.
void show_failures(const std::vector<request_record>& records, int limit) {
  int shown = 0;
  for (size_t i = 0; i < records.size() && shown < limit; ++i)
    if (const auto& r = records[i]; !r.success) {
      std::fprintf(stderr, "request %zu failed: %s: %s\n", i, r.error_code.c_str(),
                   r.error_message.c_str());
      ++shown;
    }
}

// What every run of one invocation shares: the workload, the backend and
// the driver's options; only the arrival schedule changes with the rate.
struct bench_setup {
  bench::slo goals;
  std::vector<bench_request> reqs;
  std::vector<double> trace;  // when replaying one
  bench::driver_options opts;
  std::unique_ptr<bench::bench_backend> backend;
  std::string target;

  struct outcome {
    bench::driver_result result;
    bench::metrics m;
  };
  // One full run; arrivals from the trace or the seeded gamma process at
  // `rate` (the same seed: the same gaps, scaled by 1 / rate).
  outcome run(const serve_flags& f, double rate) {
    auto o = opts;
    o.arrivals =
        trace.empty() ? bench::gamma_arrivals(reqs.size(), rate, f.burstiness, f.seed) : trace;
    outcome out;
    out.result = bench::run_benchmark(*backend, reqs, o);
    out.m = bench::compute_metrics(out.result.records, out.result.duration_s, goals);
    return out;
  }
};

bench_setup make_setup(const serve_flags& f) {
  bench_setup s;
  try {
    s.goals = bench::slo::parse(f.goodput);
    if (f.sweep) bench::check_sweep(f.sweep_spec, s.goals);
    s.reqs = make_dataset(f);
    if (!f.trace.empty()) s.trace = bench::load_trace(f.trace);
    // Checks the rate and burstiness before anything connects.
    bench::gamma_arrivals(1, f.sweep ? f.sweep_spec.start : f.request_rate, f.burstiness, f.seed);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError(e.what());
  }
  s.opts.max_concurrency = f.max_concurrency;
  s.opts.duration_s = f.duration;
  s.opts.num_warmups = f.num_warmups;
  s.opts.progress = !f.no_progress;
  s.opts.request.ignore_eos = f.ignore_eos;
  s.opts.request.temperature = f.temperature;
  s.opts.request.timeout =
      std::chrono::milliseconds(static_cast<long>(std::llround(f.request_timeout * 1000)));

  if (f.backend == "openai") {
    bench::openai_options o;
    o.base_url = f.base_url;
    o.endpoint = f.endpoint;
    o.model = f.model;
    if (const char* key = std::getenv("OPENAI_API_KEY")) o.api_key = key;
    s.backend = std::make_unique<bench::openai_backend>(o);
    s.target = f.base_url + f.endpoint;
  } else {
    // ZeroMQ connects lazily and would queue requests for a server that is
    // not there: ask first, so a wrong endpoint fails now, not after timeouts.
    client::connection probe(f.server);
    if (!probe.ping(std::chrono::seconds(5)))
      throw std::runtime_error("no troupe server answers at " + f.server +
                               " (ping timed out after 5 s); no request was sent");
    s.backend = std::make_unique<troupe_backend>(f.server);
    s.target = f.server;
  }
  return s;
}

nlohmann::json config_json(const serve_flags& f, size_t planned) {
  return {{"dataset", f.dataset},
          {"num_requests", planned},
          {"request_rate", rate_json(f.request_rate)},
          {"burstiness", f.burstiness},
          {"trace", f.trace},
          {"max_concurrency", f.max_concurrency},
          {"duration", f.duration},
          {"num_warmups", f.num_warmups},
          {"ignore_eos", f.ignore_eos},
          {"offline_fraction", f.offline_fraction},
          {"goodput", f.goodput},
          {"seed", f.seed}};
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << j.dump(2) << "\n";
}

void run_single(const serve_flags& f, bench_setup& s) {
  const size_t planned = s.trace.empty() ? s.reqs.size() : std::min(s.reqs.size(), s.trace.size());
  std::fprintf(
      stderr, "bench serve: %s backend, %s, %zu requests, rate %s, burstiness %.2f%s\n",
      s.backend->name().c_str(), s.target.c_str(), planned,
      s.trace.empty() ? rate_text(f.request_rate).c_str() : "trace", f.burstiness,
      f.max_concurrency ? (", max concurrency " + std::to_string(f.max_concurrency)).c_str() : "");
  auto [result, m] = s.run(f, f.request_rate);
  std::cout << bench::format_summary(m, s.goals) << std::flush;
  show_failures(result.records, 5);
  if (!f.json_out.empty()) {
    auto j = bench::to_json(m);
    j["backend"] = s.backend->name();
    j["target"] = s.target;
    j["config"] = config_json(f, planned);
    j["requests"] = records_json(result.records);
    write_json(f.json_out, j);
  }
  if (m.completed == 0 && m.requests > 0) throw CLI::RuntimeError("no request completed", 1);
}

std::string sweep_row(const bench::sweep_probe& p, const bench::metrics& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%10.4g %8.3f %-6s %8.3f %10.2f %9.1f %9.1f %9.1f %9.1f %6zu\n",
                p.rate, p.goodput_fraction, p.pass ? "pass" : "fail", m.request_throughput,
                m.output_throughput, m.ttft_ms.median, m.ttft_ms.p99, m.tpot_ms.median,
                m.tpot_ms.p99, m.failed);
  return buf;
}

// --sweep: probes chosen by bench::next_sweep_rate, one full run each.
void run_sweep(const serve_flags& f, bench_setup& s) {
  const auto& spec = f.sweep_spec;
  std::fprintf(stderr,
               "bench serve --sweep: %s backend, %s, %zu requests per probe, burstiness %.2f, "
               "target %.3g of requests within %s, start %s req/s, max %s, %zu probes at most, "
               "precision %.3g\n",
               s.backend->name().c_str(), s.target.c_str(), s.reqs.size(), f.burstiness,
               spec.target, CLI::detail::join(f.goodput, " ").c_str(),
               rate_text(spec.start).c_str(),
               spec.max > 0 ? (rate_text(spec.max) + " req/s").c_str() : "none", spec.max_probes,
               spec.precision);
  std::vector<bench::metrics> metrics;
  auto probes_json = nlohmann::json::array();
  size_t completed = 0;
  auto probes = bench::run_sweep(spec, [&](double rate) {
    const size_t k = metrics.size() + 1;
    std::fprintf(stderr, "sweep probe %zu/%zu: %s req/s\n", k, spec.max_probes,
                 rate_text(rate).c_str());
    auto [result, m] = s.run(f, rate);
    bench::sweep_probe p;
    p.rate = rate;
    p.goodput_fraction = m.requests ? static_cast<double>(m.good_completed) / m.requests : 0.0;
    p.pass = bench::meets_target(m.good_completed, m.requests, spec.target);
    std::fprintf(stderr,
                 "sweep probe %zu/%zu: %s req/s: %zu of %zu requests good (%.3f, target %.3g): "
                 "%s; %zu failed\n",
                 k, spec.max_probes, rate_text(rate).c_str(), m.good_completed, m.requests,
                 p.goodput_fraction, spec.target, p.pass ? "pass" : "fail", m.failed);
    show_failures(result.records, 3);
    completed += m.completed;
    if (!f.json_out.empty()) {
      auto j = bench::to_json(m);
      j["request_rate"] = rate;
      j["goodput_fraction"] = p.goodput_fraction;
      j["pass"] = p.pass;
      j["requests"] = records_json(result.records);
      probes_json.push_back(std::move(j));
    }
    metrics.push_back(m);
    return p;
  });

  std::cout << "============== Rate sweep (goodput target " << spec.target << ") ==============\n"
            << "SLOs: " << CLI::detail::join(f.goodput, " ")
            << "; goodput = share of sent requests within every SLO; times in ms\n";
  std::printf("%10s %8s %-6s %8s %10s %9s %9s %9s %9s %6s\n", "rate req/s", "goodput", "result",
              "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "errors");
  std::fflush(stdout);
  for (size_t i = 0; i < probes.size(); ++i) std::cout << sweep_row(probes[i], metrics[i]);
  const auto answer = bench::sweep_answer(probes);
  if (answer)
    std::cout << "highest rate meeting the target: " << rate_text(*answer) << " req/s\n";
  else
    std::cout << "highest rate meeting the target: none (every probe failed, down to "
              << rate_text(probes.back().rate) << " req/s)\n";
  std::cout << std::flush;

  if (!f.json_out.empty()) {
    nlohmann::json j;
    j["backend"] = s.backend->name();
    j["target"] = s.target;
    j["config"] = config_json(f, s.reqs.size());
    j["config"].erase("request_rate");
    j["sweep"] = {{"goodput_target", spec.target},
                  {"goodput", f.goodput},
                  {"start", spec.start},
                  {"max", spec.max > 0 ? nlohmann::json(spec.max) : nlohmann::json(nullptr)},
                  {"max_probes", spec.max_probes},
                  {"precision", spec.precision},
                  {"highest_rate", answer ? nlohmann::json(*answer) : nlohmann::json(nullptr)}};
    j["probes"] = std::move(probes_json);
    write_json(f.json_out, j);
  }
  if (completed == 0) throw CLI::RuntimeError("no request completed in any probe", 1);
}

void run_serve_bench(const serve_flags& f) {
  auto s = make_setup(f);
  if (f.sweep)
    run_sweep(f, s);
  else
    run_single(f, s);
}

}  // namespace

void add_bench_serve(CLI::App& bench) {
  // CLI::PositiveNumber refuses inf, the rate that sends everything at once.
  const CLI::Validator positive_rate(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !(v > 0))
          return "request rate must be > 0 or inf (got " + text + ")";
        return {};
      },
      "RATE > 0 or inf");
  auto f = std::make_shared<serve_flags>();
  auto* cmd = bench.add_subcommand(
      "serve", "load a running server (troupe or OpenAI-compatible) like `vllm bench serve`");
  cmd->add_option("--backend", f->backend, "troupe (client protocol) or openai (HTTP streaming)")
      ->check(CLI::IsMember({"troupe", "openai"}))
      ->capture_default_str();
  cmd->add_option("--server", f->server, "troupe server endpoint (ZeroMQ)")->capture_default_str();
  cmd->add_option("--base-url", f->base_url, "OpenAI-compatible server, scheme://host:port")
      ->capture_default_str();
  cmd->add_option("--endpoint", f->endpoint, "completions path on --base-url")
      ->capture_default_str();
  cmd->add_option("--model", f->model, "\"model\" sent to an OpenAI-compatible server");
  cmd->add_option("--dataset-name", f->dataset, "random, jsonl or shared-prefix")
      ->transform(
          CLI::IsMember(std::map<std::string, std::string>{{"random", "random"},
                                                           {"jsonl", "jsonl"},
                                                           {"custom", "jsonl"},
                                                           {"shared-prefix", "shared-prefix"},
                                                           {"prefix_repetition", "shared-prefix"}}))
      ->capture_default_str();
  cmd->add_option("--dataset-path", f->dataset_path,
                  "JSONL of {\"prompt\": text or token ids, \"output_tokens\": n}")
      ->check(CLI::ExistingFile);
  cmd->add_option("--num-requests,--num-prompts", f->num_requests, "requests to send")
      ->check(CLI::Range(size_t{1}, size_t{10000000}))
      ->capture_default_str();
  auto* rate =
      cmd->add_option("--request-rate", f->request_rate, "requests per second (inf: all at once)")
          ->check(positive_rate)
          ->capture_default_str();
  cmd->add_option("--burstiness", f->burstiness,
                  "gamma shape of the arrival gaps: 1 is Poisson, < 1 burstier, > 1 steadier")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* trace =
      cmd->add_option("--trace", f->trace, "replay send times: one timestamp (s) per line")
          ->check(CLI::ExistingFile);
  cmd->add_option("--max-concurrency", f->max_concurrency,
                  "requests in flight at most (with rate inf: a closed loop)")
      ->capture_default_str();
  cmd->add_option("--duration", f->duration, "seconds: send nothing scheduled later (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--num-warmups", f->num_warmups, "untimed requests sent first, one at a time");
  cmd->add_option("--random-input-len", f->random.input_len, "prompt tokens (random dataset)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--random-output-len", f->random.output_len, "output tokens (random dataset)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", f->random.range_ratio,
                  "lengths uniform in [L(1-r), L(1+r)]")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  cmd->add_option("--random-prefix-len", f->random.prefix_len,
                  "random tokens shared by every prompt, before its own")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--random-vocab-size", f->vocab_size, "token ids are drawn below this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--random-first-token-id", f->first_token_id,
                  "token ids are drawn from here up (skips special tokens)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--prefix-repetition-num-prefixes", f->prefix.num_groups,
                  "shared-prefix dataset: groups")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prefix-repetition-prefix-len", f->prefix.prefix_len,
                  "shared-prefix dataset: tokens of each group's prefix")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--prefix-repetition-suffix-len", f->prefix.suffix_len,
                  "shared-prefix dataset: tokens after the prefix")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--prefix-repetition-output-len", f->prefix.output_len,
                  "shared-prefix dataset: output tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--custom-output-len", f->custom_output_len,
                  "jsonl dataset: output tokens where a line gives none")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", f->ignore_eos, "generate the full output length");
  cmd->add_option("--offline-fraction", f->offline_fraction,
                  "share of requests sent as class offline (troupe)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--goodput", f->goodput, "SLOs in ms: ttft:MS tpot:MS e2el:MS");
  cmd->add_option("--temperature", f->temperature, "sampling temperature")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--request-timeout", f->request_timeout,
                  "seconds of silence after which a request fails")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of the dataset and the arrivals");
  cmd->add_option("--json-out", f->json_out, "write the metrics and per-request records as JSON");
  cmd->add_flag("--no-progress,--disable-tqdm", f->no_progress, "no live progress line");
  auto* sweep =
      cmd->add_flag("--sweep", f->sweep,
                    "find the highest request rate meeting --goodput-target (needs --goodput)")
          ->excludes(rate)
          ->excludes(trace);
  cmd->add_option("--goodput-target", f->sweep_spec.target,
                  "sweep: share of sent requests that must finish within every --goodput SLO")
      ->needs(sweep)
      ->capture_default_str();
  cmd->add_option("--sweep-start", f->sweep_spec.start, "sweep: first rate (req/s)")
      ->needs(sweep)
      ->capture_default_str();
  cmd->add_option("--sweep-max", f->sweep_spec.max, "sweep: highest rate probed (req/s; 0: none)")
      ->needs(sweep)
      ->capture_default_str();
  cmd->add_option("--sweep-steps", f->sweep_spec.max_probes, "sweep: probes at most")
      ->needs(sweep)
      ->capture_default_str();
  cmd->add_option("--sweep-precision", f->sweep_spec.precision,
                  "sweep: stop bisecting when lowest fail / highest pass - 1 is below this")
      ->needs(sweep)
      ->capture_default_str();
  cmd->callback([f] { run_serve_bench(*f); });
}

}  // namespace troupe::cli
