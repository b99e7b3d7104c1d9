#pragma once
// The cluster simulator behind `troupe bench sim` (issue 11 item 7;
// docs/architecture.md §2.3 "Policies are plain functions"): a discrete-event
// simulation of N instances that calls the very functions the actors call
// (runtime/engine/scheduler plan_step for every step, runtime/service/placement and
// runtime/service/pd_policy for placement and role switching, runtime/service/service_monitor
// for the windows) with step and transfer times from a cost model fitted on
// the real engine (sim/cost_model).  Prefix caching runs on a real
// page_pool per instance (runtime/engine/page_pool: prefix hits, LRU reuse
// of released pages) when the requests carry token ids, and the KV store's
// tiers (issue 39) on the kv_pool's own bookkeeping (sim/sim_store over
// runtime/kvstore/tier_index).  What it leaves out, on purpose: swap
// (preemption recomputes), the router's polling delay (it sees each
// instance's state exactly) and message latency other than KV transfers
// and tier loads.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bench/bench_metrics.hpp"
#include "runtime/engine/scheduler.hpp"
#include "runtime/kvstore/tier_policy.hpp"
#include "runtime/service/autoscale.hpp"
#include "runtime/service/pd_policy.hpp"
#include "runtime/service/placement.hpp"
#include "sim/cost_model.hpp"
#include "sim/sim_pipeline.hpp"

namespace troupe {

struct sim_request {
  double arrival = 0;  // seconds
  int32_t prompt = 0;
  int32_t output = 0;
  bool offline = false;
  // The prompt's token ids, for prefix caching (empty: its own tokens,
  // shared with no other prompt).  Points into the caller's dataset, which
  // outlives simulate().  When given, its length is the prompt's.
  std::span<const int32_t> tokens;
  // Multi-turn conversations: request `after` (an earlier index) ended
  // `think_s` before this one arrives (-1: it arrives at `arrival`).
  long after = -1;
  double think_s = 0;
  int turn = 0;
};

// How requests are placed.
//   mixed:   every instance prefills and decodes; `mixed_policy` places.
//   pd:      prefill and decode instances (`roles`, default half and half);
//            `pd_placement` is slo (the report's: predicted TTFT in pool
//            order, decode under caps, and role switching when enabled),
//            least-load (least queued prefill tokens / fewest running
//            tokens) or round-robin, both without flips.
struct sim_config {
  int32_t instances = 2;
  bool pd = false;
  placement_policy mixed_policy = placement_policy::least_load;
  std::string pd_placement = "slo";
  bool role_switching = false;
  std::vector<instance_role> roles;
  scheduler_limits limits;
  pd_targets targets;  // online requests' SLO; TTFT also sets EDF deadlines
  pd_config pd_cfg;
  double window_s = 1;
  cost_model cost;
  // Elastic pools (issue 37): `instances` start, then the autoscaling
  // policy (runtime/service/autoscale) starts and retires them at every
  // window within [scale.min, scale.max]; a started instance serves after
  // `start_s` (loading its model).  Mixed instances only.
  bool autoscale = false;
  autoscale_config scale;
  double start_s = 2;
  // Prefix caching in each instance's arena, and each instance's process's
  // KV store (issue 39): a host tier of kv_host_bytes (0: no store) and a
  // disk tier of kv_disk_bytes below it; with kv_pull, a prompt's pages may
  // come from another instance's store (pick_kv_pull), at the cost model's
  // transfer rate.
  bool prefix_caching = true;
  uint64_t kv_host_bytes = 0;
  uint64_t kv_disk_bytes = 0;
  tier_eviction tier_policy = tier_eviction::lru;
  bool kv_pull = false;
  // The router's view of the instances' loads (issue 36): 0 sees them as
  // they are; > 0 sees a snapshot at most this old, taken when it expired,
  // as the real router polls every 100 ms (its `poll`).  Prefix hits stay
  // exact (the policies look the prompt's own pages up).
  double router_staleness_s = 0;
  // Pipelined instances (issue 35): each instance over pipeline.stages
  // devices of its own, under a skewed, shifting load, its layers moved
  // between stages by the pipeline's rule where pipeline.migration says
  // (sim/sim_pipeline).  Mixed instances, no autoscaling.
  sim_pipeline_config pipeline;
};

struct sim_stats {
  uint64_t steps = 0;
  uint64_t events = 0;
  uint64_t flips = 0;
  uint64_t transfers = 0;
  uint64_t evacuated = 0;  // decoding sequences moved off instances leaving decode
  uint64_t preemptions = 0;
  uint64_t router_snapshots = 0;  // with router_staleness_s: the snapshots it took
  double transfer_bytes = 0;
  double transfer_ms_total = 0;
  double ttft_mape = 0;  // the TTFT predictor's error
  double simulated_s = 0;
  double wall_s = 0;
  std::vector<std::string> flip_log;  // "t=12.0s instance 3 -> prefill: why"
  // Autoscaling: instance-seconds held (serving, starting, or finishing
  // work while retiring), the most at once, starts and retirements.
  double instance_seconds = 0;
  int32_t peak_instances = 0;
  uint64_t scale_ups = 0, scale_downs = 0;
  std::vector<std::string> scale_log;  // "t=60.0s: load 0.91 of capacity: 4 -> 6 instances"
  // Prefix caching and the KV store: prompt tokens at first admission, and
  // where those not computed came from (the arena, the host and disk tiers,
  // another instance's store); pages arenas offered to their store; the
  // first page-accounting violation found at the end (empty: none).
  uint64_t prompt_tokens = 0;
  uint64_t device_hit_tokens = 0, host_hit_tokens = 0, disk_hit_tokens = 0, pulled_tokens = 0;
  uint64_t spilled_pages = 0;
  std::string kv_check;
  // Pipelined instances: devices in all, layer moves, layers moved and
  // the instances' pauses for them.
  bool pipelined = false;
  int32_t devices = 0;
  uint64_t layer_moves = 0, layers_moved = 0;
  uint64_t head_moves = 0, heads_home = 0;  // KV-head groups sent away, brought home
  double move_pause_ms = 0;
};

struct sim_result {
  std::vector<bench::request_record> records;  // in request order
  std::vector<double> itl_s;  // token intervals of a sample of requests (all when small)
  sim_stats stats;
};

// Throws std::invalid_argument for a bad configuration.
sim_result simulate(const sim_config& cfg, const std::vector<sim_request>& reqs);

}  // namespace troupe
