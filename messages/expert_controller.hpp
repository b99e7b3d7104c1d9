#pragma once
// The expert controller protocol (docs/architecture.md §2 "The actors";
// xLLM's dynamic EPLB, REFERENCES.md 6.6): one controller per MoE model reads
// expert load from the devices that run it, and when the expert devices' load
// is uneven it moves experts with a two-phase swap (devices prepare the new
// placement in spare buffers and report ready; only when all are ready does
// it tell them all to commit, which each does at its next step boundary).
#include <caf/all.hpp>
#include "messages/atoms.hpp"

#include "messages/device.hpp"
#include "messages/router.hpp"  // tick_atom

namespace troupe {

struct expert_controller_config {
  double threshold = 1.25;     // max over mean device load that triggers a swap
  double min_gain = 0.05;      // a plan must lower the imbalance by this share
  int32_t interval_ms = 1000;  // how often loads are read
  int32_t spare_slots = 1;     // slots per expert device beyond an even share
  int64_t min_tokens = 256;    // tokens counted before any decision
};

// One layer, over the window since the last swap.
struct expert_layer_status {
  std::vector<int64_t> tokens;      // per expert
  std::vector<double> device_load;  // per expert device
  double imbalance = 1.0;           // max over mean device load
  layer_experts layout;
};

struct expert_status {
  int32_t devices = 0;  // expert devices per engine
  int32_t engines = 0;  // device actors controlled
  std::vector<expert_layer_status> layers;
  std::vector<double> busy_s;  // per expert device, summed over engines
  uint64_t epoch = 0;
  uint64_t swaps = 0;
  uint64_t aborted = 0;                    // swaps given up (a device not ready)
  double last_before = 0, last_after = 0;  // worst layer imbalance around the last swap
  std::string phase = "idle";              // idle, preparing, committing
  std::vector<uint64_t> engine_epochs;     // per engine, the placement it last reported
  uint64_t aligned = 0;                    // engines brought to the placement in use
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_layer_status& x) {
  return f(caf::meta::type_name("expert_layer_status"), x.tokens, x.device_load, x.imbalance,
           x.layout);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_status& x) {
  return f(caf::meta::type_name("expert_status"), x.devices, x.engines, x.layers, x.busy_s, x.epoch,
           x.swaps, x.aborted, x.last_before, x.last_after, x.phase, x.engine_epochs, x.aligned);
}

// expstatus: the controller's view (loads, placement, swaps).
// tick: read the loads now and decide (the controller also ticks itself
//       every interval_ms).
// expadd: (device) one more engine's device: a node's instance that joined
//       the router; it leaves the controller when it goes down.  An engine
//       found on another placement than the controller's (it joined after
//       a swap, or missed a commit) is brought to it alone, prepare then
//       commit.
using expert_controller_actor =
    caf::typed_actor<caf::replies_to<expert_status_atom>::with<expert_status>,
                     caf::reacts_to<tick_atom>, caf::reacts_to<expert_add_atom, device_actor>>;

}  // namespace troupe
