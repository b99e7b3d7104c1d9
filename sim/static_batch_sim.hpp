#pragma once
// Static batching on one instance (issue 36 item 2's `--batching static`
// mode): requests arrive, and whenever the instance is free it plans the
// queue into batches with a batch_order (runtime/engine/slo_batching) and
// runs the first (planning over a window of the 32 batches' worth of
// requests that come first by the order's key).  A static batch pads its prompts to the longest and
// runs until its longest output is done; every member returns when the batch does.  Step costs come
// from the cost model fitted on the real engine (sim/cost_model), output lengths are predicted
// online by the bucketed predictor (or known exactly: the oracle), and each request has a
// completion deadline (its SLO).
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine/slo_batching.hpp"
#include "sim/cost_model.hpp"

namespace troupe {

struct static_request {
  double arrival_s = 0;
  int32_t prompt_tokens = 1;
  int32_t output_tokens = 1;
  std::string cls;   // prompt class, the predictor's key
  double slo_s = 0;  // completion deadline, seconds after arrival
};

struct static_batch_config {
  batch_order order = batch_order::fifo;
  odbs_params odbs;
  bool oracle = false;  // predict the exact output length
};

struct static_batch_result {
  uint64_t completed = 0;
  uint64_t batches = 0;
  double violation_rate = 0;  // share of requests done after their deadline
  double mean_latency_s = 0;  // arrival to completion
  double p99_latency_s = 0;
  double output_tokens_per_s = 0;  // useful output tokens over the makespan
  double padding_share = 0;        // decode rows computed for outputs already done
  double bucket_accuracy = 0;      // the predictor's, over every request
};

static_batch_result run_static_batches(const std::vector<static_request>& reqs,
                                       const static_batch_config& cfg, const cost_model& cost);

// A synthetic workload with the thesis's shape: Poisson arrivals at
// `rate` per second; four prompt classes whose output lengths fall in
// [8,16), [64,128), [256,512) and [1024,2048) tokens, one request in ten
// in the bucket above its class's (so a class predicts a bucket, right
// about nine times in ten); prompts of 32 to 255 tokens; deadlines uniform
// in [slo_lo_s, slo_hi_s].
std::vector<static_request> static_workload(uint64_t n, double rate, double slo_lo_s,
                                            double slo_hi_s, uint64_t seed);

}  // namespace troupe
