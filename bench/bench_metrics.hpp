#pragma once
// Serving benchmark metrics with the definitions of `vllm bench serve`
// (vllm/benchmarks/serve.py, calculate_metrics), so troupe's numbers can be
// read beside vLLM's and beside llama-server measured by the same tool.
//
// Per request (times in seconds since the benchmark started):
//   TTFT  = first chunk with output - send time
//   E2E   = last chunk with output - send time      (vLLM's "latency")
//   TPOT  = (E2E - TTFT) / (output_tokens - 1), only when output_tokens > 1
//   ITL   = gaps between successive output chunks (a chunk carrying several
//           tokens is one gap, as in vLLM)
// Over the run (duration from the first send to the last completion):
//   request throughput = completed / duration, output tok/s = output tokens
//   of completed requests / duration, total tok/s adds their prompt tokens,
//   goodput = completed requests meeting every given SLO / duration (TPOT
//   counts as 0 for a request with one output token, as in vLLM).
// Distributions: mean, population std, median and percentiles by linear
// interpolation (numpy's default); an empty set reads as 0, like
// np.mean(x or 0).
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::bench {

// What one request came to, as the client saw it.
struct request_record {
  double send_time = 0;             // when the request left the client
  std::vector<double> chunk_times;  // arrival of each chunk that carried output
  std::vector<int> chunk_tokens;    // tokens in each of those chunks
  double end_time = 0;              // when the response ended (success or not)
  int prompt_tokens = 0;            // from the server when it says, else the dataset's
  int output_tokens = 0;            // from the server's usage when given, else summed chunks
  int cached_tokens = -1;           // prompt tokens the server found cached; -1: it did not say
  int turn = 0;                     // the request's turn in its conversation (multi-turn)
  size_t index = 0;                 // the request's index in the dataset
  bool success = false;
  std::string error_code;  // empty on success: "connect", "timeout", "http_503", ...
  std::string error_message;

  double ttft() const { return chunk_times.empty() ? 0.0 : chunk_times.front() - send_time; }
  double e2e() const { return chunk_times.empty() ? 0.0 : chunk_times.back() - send_time; }
  // 0 for a request with one output token or fewer (vLLM's all_tpots).
  double tpot() const;
  std::vector<double> itls() const;
};

// Latency objectives in milliseconds (vLLM's --goodput ttft:MS tpot:MS e2el:MS).
struct slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
  // Parses "ttft:500" style items; throws std::invalid_argument on bad input.
  static slo parse(const std::vector<std::string>& items);
};

// A distribution in milliseconds.
struct distribution {
  size_t count = 0;
  double mean = 0, std = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
  static distribution of_seconds(std::vector<double> seconds);
};

// numpy.percentile(values, p) with linear interpolation; values need not be
// sorted; an empty set gives 0.
double percentile(std::vector<double> values, double p);

struct metrics {
  size_t requests = 0;  // sent
  size_t completed = 0;
  size_t failed = 0;
  double duration_s = 0;
  long total_input_tokens = 0;   // of completed requests
  long total_output_tokens = 0;  // of completed requests
  double request_throughput = 0;
  double request_goodput = 0;
  size_t good_completed = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::map<std::string, size_t> errors;  // by code
  size_t max_concurrency = 0;            // most requests in flight at once
  // Prefix caching as the server reported it (completed requests that said
  // how many prompt tokens were cached): cached / prompt tokens, over all of
  // them and over later turns (turn > 0) of multi-turn conversations; -1
  // when no request said.  TTFT of the later turns alone.
  double cached_share = -1;
  double later_turns_cached_share = -1;
  distribution later_turns_ttft_ms;
};

metrics compute_metrics(const std::vector<request_record>& records, double duration_s,
                        const slo& goals = {});

nlohmann::json to_json(const metrics& m);
// The summary table, vLLM's layout.
std::string format_summary(const metrics& m, const slo& goals);

}  // namespace troupe::bench
