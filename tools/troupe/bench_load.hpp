#pragma once
// The load options `troupe bench serve` and `troupe bench sim` share: the
// dataset, the arrival schedule (rate and burstiness, or a trace), the
// online/offline mix, the SLOs and the rate sweep, with `vllm bench
// serve`'s option names; and the JSON both write.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_metrics.hpp"
#include "bench/bench_sweep.hpp"
#include "bench/bench_workload.hpp"

namespace troupe::cli {

struct load_flags {
  std::string dataset = "random";
  std::string dataset_path;
  size_t num_requests = 100;
  double request_rate = bench::infinite_rate;
  double burstiness = 1.0;
  std::string trace;
  double duration = 0;
  bench::random_spec random;
  bench::shared_prefix_spec prefix;
  bench::multi_turn_spec multi_turn;
  int custom_output_len = 128;
  int32_t vocab_size = 32000;
  int32_t first_token_id = 256;
  double offline_fraction = 0;
  std::vector<std::string> goodput;
  uint64_t seed = 0;
  uint64_t prompt_salt = 0;  // nonzero: other prompts of the same sizes (make_dataset)
  std::string json_out;
  bool sweep = false;
  bench::sweep_spec sweep_spec;
};

// Adds the shared options to `cmd`.
void add_load_options(CLI::App& cmd, load_flags& f);

// The requests the flags describe (classes assigned).  Throws
// CLI::ValidationError or std::invalid_argument on bad flags.
std::vector<bench::bench_request> make_dataset(const load_flags& f);
// The send times to replay: --trace's, else an azure dataset's own (not
// under --sweep, which sets its own rates); empty for the rate schedule.
std::vector<double> send_times(const load_flags& f);

std::string rate_text(double rate);
nlohmann::json rate_json(double rate);
nlohmann::json load_config_json(const load_flags& f, size_t planned);
// Per request: send time, TTFT, E2E, tokens, token intervals, class, outcome.
nlohmann::json records_json(const std::vector<bench::request_record>& records,
                            const std::vector<bench::bench_request>& reqs);
void write_json(const std::string& path, const nlohmann::json& j);

// One row of the sweep table, and its header.
std::string sweep_row(const bench::sweep_probe& p, const bench::metrics& m);
void print_sweep_table(const load_flags& f, const std::vector<bench::sweep_probe>& probes,
                       const std::vector<bench::metrics>& metrics);

}  // namespace troupe::cli
