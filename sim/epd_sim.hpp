#pragma once
// The hybrid EPD simulator behind `troupe bench epd` (issue 36 item 3; the
// xLLM report's Fig. 22 ablation at reduced scale, ../shared/REFERENCES.md
// §3): N instances serving multimodal requests through encode, prefill and
// decode, placed in pools by the strategy the start-up profiler picks
// (runtime/service/epd_policy: profile_epd), each instance's iterations
// planned by the report's batch rule (plan_epd_iteration) and priced by
// the cost model fitted on the real engine (sim/cost_model).
//
// The encoder is a stand-in, as REFERENCES.md's reduced scale suggests:
// an image costs the language model's forward of `image_tokens` rows
// times `encoder_scale`, and adds `image_tokens` placeholder rows to the
// prompt.  (troupe's real encoder, runtime/vision, runs only a small
// random-weights CLIP fixture here; its cost says nothing of a real one.)
//
// Without stage-level scheduling an instance's iteration takes whole
// requests: every pending encode, every waiting prompt in one piece and
// every running decode (`troupe bench epd` runs that ablation with one
// stream, as the report's does).
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/service/epd_policy.hpp"
#include "sim/cost_model.hpp"

namespace troupe {

struct epd_request {
  double arrival_s = 0;
  int32_t images = 1;
  int32_t text_tokens = 32;
  int32_t output_tokens = 16;
};

struct epd_sim_config {
  int32_t instances = 8;
  std::optional<epd_strategy> strategy;  // empty: the profiler's pick
  // Set: run these pools and limits (a profiler's answer, epd_sim_profile),
  // not profile_epd's estimate from the workload at hand.
  std::optional<epd_profile> profile;
  bool stage_scheduling = true;
  bool dual_stream = true;
  double dual_stream_overlap = 0;
  int32_t image_tokens = 576;
  double encoder_scale = 1;
  double ttft_slo_s = 2, tpot_slo_s = 0.1;
  // Image embeddings sent from an encode instance to a prefill one cost a
  // transfer of image_tokens rows of this many bytes (stories15M's 288
  // floats by default).
  int64_t embed_bytes_per_token = 288 * 4;
  cost_model cost;
};

struct epd_sim_result {
  epd_profile profile;
  uint64_t requests = 0;
  uint64_t completed = 0;  // requests the run finished (the rest miss both SLOs)
  double attainment = 0;   // share meeting both SLOs
  double ttft_p50_s = 0, ttft_p99_s = 0, tpot_p50_s = 0, tpot_p99_s = 0;
  uint64_t iterations = 0, encode_batches = 0;
  double mean_encode_batch = 0;
  double simulated_s = 0;
};

// The workload's means per request, and the cost model as the policy's
// costs at those means (the stand-in encoder included).
epd_workload epd_workload_of(const std::vector<epd_request>& reqs, int32_t image_tokens);
epd_costs epd_sim_costs(const epd_sim_config& cfg, const epd_workload& w);

// The profiler by trial (profile_epd_by_trial) with the simulator as its
// engine: each split's goodput measured on a trial workload of its own
// (`trial_requests` drawn with `seed`), as a real start-up would measure.
epd_profile epd_sim_profile(const epd_sim_config& cfg, uint64_t trial_requests, uint64_t seed,
                            double target);

// Throws std::invalid_argument for a bad configuration.
epd_sim_result simulate_epd(const epd_sim_config& cfg, const std::vector<epd_request>& reqs);

// A TextCaps-like workload: Poisson arrivals at `rate` per second, one
// image per request, 16 to 63 text tokens, captions of 8 to 31 tokens.
std::vector<epd_request> textcaps_like_workload(uint64_t n, double rate, uint64_t seed);

// Goodput: the highest rate (bisection to 2%) at which at least `target`
// of the workload's requests meet both SLOs, the workload drawn at each
// rate with the same seed.  The result at that rate comes back in `at`.
double epd_goodput(const epd_sim_config& cfg, uint64_t n, uint64_t seed, double target,
                   epd_sim_result* at = nullptr);

}  // namespace troupe
