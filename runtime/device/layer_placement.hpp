#pragma once
// Layer placement for a pipeline-parallel model (UELLM's HELR, the thesis's
// Algorithm 3-2, REFERENCES.md 7.1): which devices hold which contiguous
// ranges of a model's layers, in what order, as a plain function of the
// devices, the links between them and the model's size.  Deployment time
// only: it places, it does not migrate.
//
// The model of a step (one token through every layer): a device runs its
// layers one after another at `seconds_per_layer` each, and the hidden
// state crosses one link between consecutive stages, so
//
//   latency = sum over stages of layers * seconds_per_layer
//           + sum over consecutive stages of link latency.
//
// A device can take floor((memory - kv_reserve) / layer_bytes) layers.
//
// The printed algorithm indexes its DP table inconsistently; as the
// references say, it is implemented here as what it means:
//  - for a set S of devices, the best layer split does not depend on their
//    order: one layer each, then the rest to the fastest devices first, up
//    to what each holds (an exchange argument: moving a layer to a faster
//    device with room never costs more);
//  - the best order is the shortest Hamiltonian path over S in the link
//    latencies, which a Held-Karp DP over every subset finds at once
//    (dp[mask][last], O(2^n n^2));
//  - every S that holds the model is scored, the best kept.
//
// Modes (the thesis's a1 on latency, a2 on devices): HE takes the fewest
// devices (ties: lowest latency), LR the lowest latency (ties: fewest
// devices), HELR weighs both:  score = a1 * latency / best_latency
// + a2 * devices / fewest_devices, with a1:a2 0:1 for HE, 1:0 for LR and
// 1:1 for HELR.  Both terms are relative to their optimum so neither unit
// dominates.  (The thesis's "a1 >> a2, e.g. 10:1" for LR, read with these
// relative terms, would trade 10% of latency for half the devices: not
// "lowest latency", so LR is latency alone.)
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct placement_device {
  std::string name;
  double memory_bytes = 0;
  double seconds_per_layer = 0;  // one token through one layer (measured)
};

struct layer_model {
  int32_t layers = 0;
  double layer_bytes = 0;       // weights of one layer
  double kv_reserve_bytes = 0;  // kept free on every device for its KV cache
};

enum class placement_mode { he, lr, helr };

// "he" | "lr" | "helr"; throws std::invalid_argument naming the choices.
placement_mode parse_placement_mode(const std::string& text);
const char* placement_mode_name(placement_mode m);

struct pipeline_stage {
  int32_t device = 0;  // index into the devices given
  int32_t first_layer = 0;
  int32_t layers = 0;
};

struct layer_placement {
  std::vector<pipeline_stage> stages;  // in pipeline order, layers ascending
  double compute_s = 0;                // the step's compute time
  double link_s = 0;                   // the step's link latency
  double latency_s() const { return compute_s + link_s; }
};

// Layers device `d` can hold (0 where not even one fits).
int32_t layer_capacity(const placement_device& d, const layer_model& m);

// The best placement in `mode`.  `link_s[i][j]` is the latency of sending a
// step's hidden state from device i to device j (need not be symmetric).
// At most 16 devices, 1e6 layers, 1e6 s per layer or link.  Throws std::invalid_argument for bad
// input (a non-square link matrix, negative numbers, no layers) and std::runtime_error when no set
// of devices holds the model (the message says how much is needed and what there is).
layer_placement place_layers(const std::vector<placement_device>& devices,
                             const std::vector<std::vector<double>>& link_s,
                             const layer_model& model, placement_mode mode);

// The score `mode` minimizes for `p`, given the best latency and fewest
// devices over every feasible placement (for tests and for reports).
double placement_score(const layer_placement& p, placement_mode mode, double best_latency_s,
                       int32_t fewest_devices);

}  // namespace troupe
