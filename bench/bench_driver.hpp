#pragma once
// The serving benchmark's driver: sends a dataset on an arrival schedule
// through a backend (troupe's client protocol, or an OpenAI-compatible HTTP
// server such as llama-server), one thread per request in flight, and
// collects a request_record for each.  Like `vllm bench serve`: a request
// arrives at its scheduled time, then waits for a free slot when
// --max-concurrency is set (an infinite rate with a concurrency cap is a
// closed loop), and its send time is taken when it actually goes out.
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_metrics.hpp"
#include "bench/bench_workload.hpp"

namespace troupe::bench {

// What a backend gets besides the request.
struct request_context {
  std::function<double()> now;  // seconds since the benchmark's clock started
  bool ignore_eos = false;
  double temperature = 0.0;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // silence that fails a request
  std::atomic<long>* tokens_seen = nullptr;  // live output token count, for progress
};

// One way of sending a request to a server.  run() is called from many
// threads at once, ends the request (success or a failure with a code) and
// never hangs longer than the context's timeout of silence.  It fills the
// record's chunk times and tokens, output tokens (the server's count when it
// gives one), prompt tokens when the server says, and the outcome; the
// driver has set send_time and sets end_time.
class bench_backend {
 public:
  virtual ~bench_backend() = default;
  virtual std::string name() const = 0;
  virtual void run(const bench_request& req, const request_context& ctx, request_record& rec) = 0;
};

struct driver_options {
  std::vector<double> arrivals;  // send offsets (s), one per request; shorter cuts the run
  size_t max_concurrency = 0;    // 0: unbounded
  double duration_s = 0;         // > 0: send nothing scheduled after this
  size_t num_warmups = 0;        // sent one by one before the clock starts; not recorded
  request_context request;       // now and tokens_seen are the driver's
  bool progress = true;          // a live line on stderr
};

struct driver_result {
  std::vector<request_record> records;  // one per request sent, in dataset order
  double duration_s = 0;                // first arrival to last completion
};

driver_result run_benchmark(bench_backend& backend, const std::vector<bench_request>& requests,
                            driver_options opts);

}  // namespace troupe::bench
