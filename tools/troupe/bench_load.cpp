#include "tools/troupe/bench_load.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

namespace troupe::cli {

void add_load_options(CLI::App& cmd, load_flags& f) {
  // CLI::PositiveNumber refuses inf, the rate that sends everything at once.
  const CLI::Validator positive_rate(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !(v > 0))
          return "request rate must be > 0 or inf (got " + text + ")";
        return {};
      },
      "RATE > 0 or inf");
  cmd.add_option("--dataset-name", f.dataset,
                 "random, jsonl, shared-prefix, multi-turn or azure (an Azure LLM inference "
                 "trace CSV in --dataset-path: its sizes and, without --sweep, its send times)")
      ->transform(
          CLI::IsMember(std::map<std::string, std::string>{{"random", "random"},
                                                           {"jsonl", "jsonl"},
                                                           {"custom", "jsonl"},
                                                           {"shared-prefix", "shared-prefix"},
                                                           {"multi-turn", "multi-turn"},
                                                           {"azure", "azure"},
                                                           {"prefix_repetition", "shared-prefix"}}))
      ->capture_default_str();
  cmd.add_option("--dataset-path", f.dataset_path,
                 "JSONL of {\"prompt\": text or token ids, \"output_tokens\": n}")
      ->check(CLI::ExistingFile);
  cmd.add_option("--num-requests,--num-prompts", f.num_requests, "requests to send")
      ->check(CLI::Range(size_t{1}, size_t{10000000}))
      ->capture_default_str();
  auto* rate =
      cmd.add_option("--request-rate", f.request_rate, "requests per second (inf: all at once)")
          ->check(positive_rate)
          ->capture_default_str();
  cmd.add_option("--burstiness", f.burstiness,
                 "gamma shape of the arrival gaps: 1 is Poisson, < 1 burstier, > 1 steadier")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* trace = cmd.add_option("--trace", f.trace, "replay send times: one timestamp (s) per line")
                    ->check(CLI::ExistingFile);
  cmd.add_option("--duration", f.duration, "seconds: send nothing scheduled later (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--random-input-len", f.random.input_len, "prompt tokens (random dataset)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--random-output-len", f.random.output_len, "output tokens (random dataset)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--random-range-ratio", f.random.range_ratio,
                 "lengths uniform in [L(1-r), L(1+r)]")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  cmd.add_option("--random-prefix-len", f.random.prefix_len,
                 "random tokens shared by every prompt, before its own")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--random-vocab-size", f.vocab_size, "token ids are drawn below this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--random-first-token-id", f.first_token_id,
                 "token ids are drawn from here up (skips special tokens)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--prefix-repetition-num-prefixes", f.prefix.num_groups,
                 "shared-prefix dataset: groups")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--prefix-repetition-prefix-len", f.prefix.prefix_len,
                 "shared-prefix dataset: tokens of each group's prefix")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--prefix-repetition-suffix-len", f.prefix.suffix_len,
                 "shared-prefix dataset: tokens after the prefix")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--prefix-repetition-output-len", f.prefix.output_len,
                 "shared-prefix dataset: output tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--multi-turn-turns", f.multi_turn.turns,
                 "multi-turn dataset: turns per conversation (--num-requests counts turns)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd.add_option("--multi-turn-system-len", f.multi_turn.system_len,
                 "multi-turn dataset: tokens of each conversation's system prompt")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_flag("--multi-turn-shared-system", f.multi_turn.shared_system,
               "multi-turn dataset: one system prompt for every conversation");
  cmd.add_option("--multi-turn-user-len", f.multi_turn.user_len,
                 "multi-turn dataset: tokens of each user message")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--multi-turn-answer-len", f.multi_turn.answer_len,
                 "multi-turn dataset: tokens of each assistant answer in the history")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--multi-turn-output-len", f.multi_turn.output_len,
                 "multi-turn dataset: output tokens of each turn")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--multi-turn-think-s", f.multi_turn.think_s,
                 "multi-turn dataset: seconds between a turn's end and the next turn")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--custom-output-len", f.custom_output_len,
                 "jsonl dataset: output tokens where a line gives none")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--offline-fraction", f.offline_fraction,
                 "share of requests sent as class offline (troupe)")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--goodput", f.goodput, "SLOs in ms: ttft:MS tpot:MS e2el:MS");
  cmd.add_option("--seed", f.seed, "seed of the dataset and the arrivals");
  cmd.add_option(
         "--prompt-salt", f.prompt_salt,
         "other prompts of the same sizes and arrivals: random's token ids, and the "
         "shared-prefix, multi-turn and azure datasets' seed plus this (no effect on jsonl)")
      ->check(CLI::Range(0.0, 1e15))  // checked as text: a negative would wrap
      ->capture_default_str();
  cmd.add_option("--json-out", f.json_out, "write the metrics and per-request records as JSON");
  auto* sweep =
      cmd.add_flag("--sweep", f.sweep,
                   "find the highest request rate meeting --goodput-target (needs --goodput)")
          ->excludes(rate)
          ->excludes(trace);
  cmd.add_option("--goodput-target", f.sweep_spec.target,
                 "sweep: share of sent requests that must finish within every --goodput SLO")
      ->needs(sweep)
      ->capture_default_str();
  cmd.add_option("--sweep-start", f.sweep_spec.start, "sweep: first rate (req/s)")
      ->needs(sweep)
      ->capture_default_str();
  cmd.add_option("--sweep-max", f.sweep_spec.max, "sweep: highest rate probed (req/s; 0: none)")
      ->needs(sweep)
      ->capture_default_str();
  cmd.add_option("--sweep-steps", f.sweep_spec.max_probes, "sweep: probes at most")
      ->needs(sweep)
      ->capture_default_str();
  cmd.add_option("--sweep-precision", f.sweep_spec.precision,
                 "sweep: stop bisecting when lowest fail / highest pass - 1 is below this")
      ->needs(sweep)
      ->capture_default_str();
}

std::vector<bench::bench_request> make_dataset(const load_flags& f) {
  std::vector<bench::bench_request> reqs;
  // Datasets whose sizes do not come from the seed take a salted seed.
  const uint64_t salted = f.seed + f.prompt_salt;
  if (f.dataset == "random") {
    auto spec = f.random;
    spec.tokens = {f.first_token_id, f.vocab_size};
    spec.content_salt = f.prompt_salt;
    reqs = bench::random_dataset(f.num_requests, spec, f.seed);
  } else if (f.dataset == "shared-prefix") {
    auto spec = f.prefix;
    spec.tokens = {f.first_token_id, f.vocab_size};
    reqs = bench::shared_prefix_dataset(f.num_requests, spec, salted);
  } else if (f.dataset == "multi-turn") {
    auto spec = f.multi_turn;
    spec.tokens = {f.first_token_id, f.vocab_size};
    reqs = bench::multi_turn_dataset(f.num_requests, spec, salted);
  } else if (f.dataset == "azure") {
    if (f.dataset_path.empty())
      throw CLI::ValidationError("--dataset-path", "azure needs the trace's CSV file");
    reqs = bench::load_azure_trace(f.dataset_path, f.num_requests, {f.first_token_id, f.vocab_size},
                                   salted)
               .requests;
  } else {
    if (f.dataset_path.empty()) throw CLI::ValidationError("--dataset-path", "jsonl needs a file");
    reqs = bench::jsonl_dataset(f.dataset_path, f.num_requests, f.custom_output_len);
  }
  bench::assign_classes(reqs, f.offline_fraction, f.seed);
  return reqs;
}

std::vector<double> send_times(const load_flags& f) {
  if (!f.trace.empty()) return bench::load_trace(f.trace);
  if (f.dataset == "azure" && !f.sweep)  // a sweep takes the sizes, at its own rates
    return bench::load_azure_trace(f.dataset_path, f.num_requests, {f.first_token_id, f.vocab_size},
                                   f.seed)
        .send_s;
  return {};
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

nlohmann::json load_config_json(const load_flags& f, size_t planned) {
  return {{"dataset", f.dataset},
          {"num_requests", planned},
          {"request_rate", rate_json(f.request_rate)},
          {"burstiness", f.burstiness},
          {"trace", f.trace},
          {"duration", f.duration},
          {"offline_fraction", f.offline_fraction},
          {"goodput", f.goodput},
          {"seed", f.seed}};
}

nlohmann::json records_json(const std::vector<bench::request_record>& records,
                            const std::vector<bench::bench_request>& reqs) {
  auto per = nlohmann::json::array();
  for (const auto& r : records) {
    per.push_back({{"send_time", r.send_time},
                   {"ttft", r.ttft()},
                   {"e2el", r.e2e()},
                   {"prompt_tokens", r.prompt_tokens},
                   {"output_tokens", r.output_tokens},
                   {"itl", r.itls()},
                   {"cached_tokens", r.cached_tokens},
                   {"turn", r.turn},
                   {"offline", r.index < reqs.size() && reqs[r.index].offline},
                   {"success", r.success},
                   {"error", r.error_code},
                   {"error_message", r.error_message}});
  }
  return per;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << j.dump(2) << "\n";
}

std::string sweep_row(const bench::sweep_probe& p, const bench::metrics& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%10.4g %8.3f %-6s %8.3f %10.2f %9.1f %9.1f %9.1f %9.1f %6zu\n",
                p.rate, p.goodput_fraction, p.pass ? "pass" : "fail", m.request_throughput,
                m.output_throughput, m.ttft_ms.median, m.ttft_ms.p99, m.tpot_ms.median,
                m.tpot_ms.p99, m.failed);
  return buf;
}

void print_sweep_table(const load_flags& f, const std::vector<bench::sweep_probe>& probes,
                       const std::vector<bench::metrics>& metrics) {
  std::cout << "============== Rate sweep (goodput target " << f.sweep_spec.target
            << ") ==============\n"
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
}

}  // namespace troupe::cli
