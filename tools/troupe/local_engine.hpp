#pragma once
// Driving an instance in this process (bench batch, bench sim-calibrate):
// enqueue sequences with the calling thread as their sink and collect
// their tokens until each has its last batch.
#include <caf/all.hpp>
#include <chrono>
#include <vector>

#include "messages/instance.hpp"

namespace troupe::cli {

using clock_type = std::chrono::steady_clock;

double seconds_between(clock_type::time_point a, clock_type::time_point b);

// Throws std::runtime_error when the instance does not answer.
instance_stats query_stats(caf::actor_system& sys, const instance_actor& inst);

struct run_result {
  double wall_s = 0;
  double last_first_token_s = 0;  // when the last sequence got its first token
  uint64_t generated = 0;
  uint64_t generated_after_prefill = 0;  // tokens generated after last_first_token_s
  int preempt_notices = 0;
  int bad_finishes = 0;
};

// Enqueues every request at once (ids must be their index), then collects
// tokens until each has its last batch.  Progress goes to stderr when
// `progress` is set.
run_result run_all(caf::actor_system& sys, const instance_actor& inst,
                   std::vector<sequence_request> reqs, bool progress);

}  // namespace troupe::cli
