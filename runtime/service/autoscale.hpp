#pragma once
// Elastic instance pools (issue 37 item 5): when to start an instance and
// when to retire one, as a plain function of the instances' load.  The
// simulator (troupe bench sim --autoscale) calls it at every window.
//
// The rule: demand is the sequences the instances hold (running and
// waiting); capacity is max_seqs per instance, with instances still
// starting counted as capacity (so one surge does not start one instance
// per window while they load).  Above `grow_load` of capacity, or with a
// window's TTFT over the target, start as many as bring the load back to
// `grow_load` (at least one, at most `max` in all); below `shrink_load`,
// and only if the load after retiring one stays below `grow_load`, retire
// the least-loaded instance, one per `shrink_cooldown_s` and not within
// `shrink_cooldown_s` of a start (hysteresis: no flapping on a level load).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace troupe {

struct autoscale_config {
  int32_t min = 1;
  int32_t max = 1;
  double grow_load = 0.8;         // of capacity: start instances above it
  double shrink_load = 0.3;       // of capacity: retire one below it
  double grow_cooldown_s = 5;     // between starts
  double shrink_cooldown_s = 30;  // between retirements, and after a start
};

// "MIN:MAX" -> the config's bounds; throws std::invalid_argument.
void parse_autoscale_bounds(const std::string& text, autoscale_config& c);

struct scaled_instance {
  uint64_t id = 0;
  bool starting = false;  // started, not serving yet
  bool retirable = true;  // may be the one retired (a node keeps its first)
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t max_seqs = 1;
  double ttft_ms = 0;  // the last window's mean TTFT (0: none)
};

struct autoscale_memory {
  double last_grow_s = -std::numeric_limits<double>::infinity();
  double last_shrink_s = -std::numeric_limits<double>::infinity();
};

struct autoscale_decision {
  int32_t grow = 0;     // instances to start
  uint64_t retire = 0;  // the instance to drain and stop (0: none)
  std::string why;      // empty when nothing changes
};

// `instances`: those serving or starting (not the retiring ones).
autoscale_decision decide_autoscale(const autoscale_config& c,
                                    const std::vector<scaled_instance>& instances,
                                    double ttft_target_ms, double now_s, autoscale_memory& mem);

}  // namespace troupe
