#pragma once
// The data-parallel group protocol (docs/architecture.md §2 "The actors";
// xLLM's hierarchical DP balancing, REFERENCES.md 6.7): a group of replicas
// that admits each request to the replica with the most free KV, moves
// sequences from the most to the least loaded replica when their KV-token gap
// grows past a share of the mean, and, in lockstep, makes its replicas step
// together (each round, every replica runs one step; one with nothing to do
// runs a dummy step), as an MoE model whose experts are shared across the
// group needs.
#include <caf/all.hpp>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/instance.hpp"
#include "messages/router.hpp"  // placement_reply, tick_atom

namespace troupe {

struct dp_group_config {
  int32_t interval_ms = 200;  // how often the balance is checked
  double gap_share = 0.2;     // rebalance when (max - min) KV tokens > this x the mean
  int32_t max_moves = 4;      // sequences moved per check at most
  // A sequence moves only with at least this many tokens left to generate
  // (a move costs an export and an import; one about to end is not worth it).
  int32_t min_left = 32;
  // Checks in a row that must find the gap above the threshold before
  // anything moves (hysteresis: arrivals and finishes swing the gap).
  int32_t patience = 2;
  bool rebalance = true;  // false: admission only (the imbalance is still measured)
  bool lockstep = false;  // the replicas step together
};

struct dp_replica_status {
  uint64_t instance = 0;
  std::string state = "serving";  // serving, down
  int64_t capacity_tokens = 0;
  int64_t kv_tokens = 0;  // at the last check
  int32_t sequences = 0;
  uint64_t admitted = 0;
  uint64_t moved_in = 0, moved_out = 0;
  // Lockstep: its steps' time in rounds, the time it waited for the
  // round's slowest replica, and the dummy steps it ran.
  double step_ms = 0;
  double wait_ms = 0;
  uint64_t dummy_steps = 0;
};

struct dp_group_status {
  std::vector<dp_replica_status> replicas;
  dp_group_config config;
  double gap_over_mean = 0;       // (max - min) / mean KV tokens at the last check
  double mean_gap_over_mean = 0;  // averaged over the checks that found load
  int64_t max_gap_tokens = 0;     // the largest gap any check found
  uint64_t checks = 0, loaded_checks = 0;
  uint64_t rebalances = 0;  // checks that moved something
  uint64_t migrations = 0, failed_migrations = 0;
  int64_t migrated_tokens = 0;
  uint64_t rounds = 0;      // lockstep rounds
  double round_ms = 0;      // summed: each round lasts as long as its slowest step
  double straggler_ms = 0;  // summed per round: the slowest step minus the mean step
  std::string last_decision;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dp_group_config& x) {
  return f(caf::meta::type_name("dp_group_config"), x.interval_ms, x.gap_share, x.max_moves,
           x.min_left, x.patience, x.rebalance, x.lockstep);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dp_replica_status& x) {
  return f(caf::meta::type_name("dp_replica_status"), x.instance, x.state, x.capacity_tokens,
           x.kv_tokens, x.sequences, x.admitted, x.moved_in, x.moved_out, x.step_ms, x.wait_ms,
           x.dummy_steps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dp_group_status& x) {
  return f(caf::meta::type_name("dp_group_status"), x.replicas, x.config, x.gap_over_mean,
           x.mean_gap_over_mean, x.max_gap_tokens, x.checks, x.loaded_checks, x.rebalances,
           x.migrations, x.failed_migrations, x.migrated_tokens, x.rounds, x.round_ms,
           x.straggler_ms, x.last_decision);
}

// dpadmit:  (prompt tokens, instances not serving) the replica with the
//           most free KV, of those serving; an error when none serves.  The
//           router relays its placements here, naming the instances it
//           drains or lost.
// dpadd:    (instance) a replica joins the group: an instance on a node
//           that joined the router after the start, or came back.
// dpstatus: the group's balance, moves and rounds.
// tick:     its own timer: read the replicas' sequences, decide, move.
// dpready:  (instance) lockstep: the replica has work for a round.
// dpdone:   (instance, round, step ms, dummy) lockstep: its step of the
//           round is done.
using dp_group_actor = caf::typed_actor<
    caf::replies_to<dp_admit_atom, int32_t, std::vector<uint64_t>>::with<placement_reply>,
    caf::reacts_to<dp_add_atom, router_instance>,
    caf::replies_to<dp_status_atom>::with<dp_group_status>, caf::reacts_to<tick_atom>,
    caf::reacts_to<dp_ready_atom, uint64_t>,
    caf::reacts_to<dp_done_atom, uint64_t, uint64_t, double, bool>>;

}  // namespace troupe
