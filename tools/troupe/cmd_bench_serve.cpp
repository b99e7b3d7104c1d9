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

#include "bench/bench_driver.hpp"
#include "bench/bench_openai.hpp"
#include "bench/bench_sweep.hpp"
#include "tools/client/client.hpp"
#include "tools/troupe/bench_load.hpp"
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
    rec.cached_tokens = static_cast<int>(f.cached_tokens());
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

struct serve_flags : load_flags {
  std::string backend = "troupe";
  std::string server = "tcp://127.0.0.1:5555";
  std::string base_url = "http://127.0.0.1:8080";
  std::string endpoint = "/v1/completions";
  std::string model;
  size_t max_concurrency = 0;
  size_t num_warmups = 0;
  bool ignore_eos = false;
  double temperature = 0;
  double request_timeout = 120;
  bool no_progress = false;
  bool sweep_same_prompts = false;
};

// The first few failures, with their messages.
void show_failures(const std::vector<request_record>& records, int limit) {
  int shown = 0;
  for (size_t i = 0; i < records.size() && shown < limit; ++i)
    if (const auto& r = records[i]; !r.success) {
      std::fprintf(stderr, "request %zu failed: %s: %s\n", r.index, r.error_code.c_str(),
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
    s.trace = send_times(f);
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
  auto j = load_config_json(f, planned);
  j["max_concurrency"] = f.max_concurrency;
  j["num_warmups"] = f.num_warmups;
  j["ignore_eos"] = f.ignore_eos;
  return j;
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
    j["requests"] = records_json(result.records, s.reqs);
    write_json(f.json_out, j);
  }
  if (m.completed == 0 && m.requests > 0)
    throw std::runtime_error("no request completed");  // main prints it
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
  // A jsonl file's prompts are the file's: every probe sends them.
  const bool new_prompts = !f.sweep_same_prompts && f.dataset != "jsonl";
  std::vector<bench::metrics> metrics;
  auto probes_json = nlohmann::json::array();
  size_t completed = 0;
  auto probes = bench::run_sweep(spec, [&](double rate) {
    const size_t k = metrics.size() + 1;
    std::fprintf(stderr, "sweep probe %zu/%zu: %s req/s\n", k, spec.max_probes,
                 rate_text(rate).c_str());
    // Probe k's prompts under salt + k - 1 (the same sizes, other token
    // ids): a server's prompt cache (or troupe's KV store) must not answer
    // a probe with an earlier probe's prefills, which would make the
    // later, faster probes look cheaper.
    const uint64_t salt = new_prompts ? f.prompt_salt + (k - 1) : f.prompt_salt;
    if (salt != f.prompt_salt) {
      auto fk = f;
      fk.prompt_salt = salt;
      s.reqs = make_dataset(fk);
    }
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
      j["prompt_salt"] = salt;
      j["goodput_fraction"] = p.goodput_fraction;
      j["pass"] = p.pass;
      j["requests"] = records_json(result.records, s.reqs);
      probes_json.push_back(std::move(j));
    }
    metrics.push_back(m);
    return p;
  });

  print_sweep_table(f, probes, metrics);
  const auto answer = bench::sweep_answer(probes);

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
  if (completed == 0) throw std::runtime_error("no request completed in any probe");
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
  add_load_options(*cmd, *f);
  cmd->add_option("--max-concurrency", f->max_concurrency,
                  "requests in flight at most (with rate inf: a closed loop)")
      ->capture_default_str();
  cmd->add_option("--num-warmups", f->num_warmups, "untimed requests sent first, one at a time");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "generate the full output length");
  cmd->add_option("--temperature", f->temperature, "sampling temperature")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--request-timeout", f->request_timeout,
                  "seconds of silence after which a request fails")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--no-progress,--disable-tqdm", f->no_progress, "no live progress line");
  cmd->add_flag("--sweep-same-prompts", f->sweep_same_prompts,
                "sweep: send every probe the same prompts (default: probe k's are other prompts "
                "of the same sizes, --prompt-salt + k - 1, so no prompt cache answers a probe "
                "with an earlier one's work; a jsonl dataset's are always the file's)");
  cmd->callback([f] { run_serve_bench(*f); });
}

}  // namespace troupe::cli
