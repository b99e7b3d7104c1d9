#pragma once
// The rate sweep of `troupe bench serve --sweep`: the highest request rate
// at which a goodput target holds (e.g. 90% of the requests sent finish
// within every --goodput SLO).  Each probe is one full run of the same
// seeded workload at one rate; this policy only picks the next rate:
//   - the first probe is at the start rate;
//   - while every probe so far passed, double the rate (capped at the
//     maximum; a pass at the maximum ends the sweep);
//   - once there is a fail above the highest pass, bisect geometrically
//     (sqrt(lo * hi)) until hi / lo - 1 < precision;
//   - while nothing has passed (the start rate failed), halve the rate;
//   - never more than max_probes probes.
// The answer is the highest passing rate (none if every probe failed).  Noisy, non-monotone results
// are read with the highest pass as truth: fails below it are ignored.
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "bench/bench_metrics.hpp"

namespace troupe::bench {

struct sweep_spec {
  double target = 0.9;     // goodput fraction of sent requests needed to pass, in (0, 1]
  double start = 0.25;     // req/s of the first probe
  double max = 0;          // req/s cap on doubling; 0: none (the probe count limits)
  size_t max_probes = 8;   // probes at most
  double precision = 0.1;  // stop bisecting when hi / lo - 1 is below this
  // Throws std::invalid_argument naming the option that is wrong.
  void check() const;
};

struct sweep_probe {
  double rate = 0;              // req/s
  double goodput_fraction = 0;  // good requests / sent requests
  bool pass = false;
};

// The sweep's arguments together (a goodput target needs SLOs to count
// against); throws std::invalid_argument naming the option.
void check_sweep(const sweep_spec& spec, const slo& goals);

// Whether `good` of `sent` requests meet the target; nothing sent fails.
bool meets_target(size_t good, size_t sent, double target);

// The next rate to probe, or nothing when the sweep is done.
std::optional<double> next_sweep_rate(const std::vector<sweep_probe>& probes,
                                      const sweep_spec& spec);

// The highest passing rate, or nothing when no probe passed.
std::optional<double> sweep_answer(const std::vector<sweep_probe>& probes);

// Runs the sweep: calls `probe` at each rate the policy picks, in order,
// until it stops; returns the probes.
std::vector<sweep_probe> run_sweep(const sweep_spec& spec,
                                   const std::function<sweep_probe(double rate)>& probe);

}  // namespace troupe::bench
