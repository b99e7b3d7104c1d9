#pragma once
// Prefill/decode disaggregation and dynamic role switching (issue 11; xLLM
// report §3.2, REFERENCES.md §1): plain functions of load snapshots, called
// by the router actor and by the cluster simulator alike
// (docs/architecture.md §2.3 "Policies are plain functions").
//
// Pools, as the report keeps them: P (prefill), D (decode), P->D (was
// prefill, takes decode work now while its prefill work drains), D->P, and
// M (mixed: both kinds, not part of the flipping).  A flip moves an
// instance to the X->Y pool at once; it is promoted to Y once its X work
// is done.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/service/placement.hpp"

namespace troupe {

enum class instance_role : uint8_t { mixed, prefill, decode };
const char* to_string(instance_role r);
std::optional<instance_role> parse_role(std::string_view s);

enum class pd_pool : uint8_t { mixed, prefill, decode, prefill_to_decode, decode_to_prefill };
const char* to_string(pd_pool p);  // "M", "P", "D", "P->D", "D->P"

pd_pool pool_of(instance_role r);  // where an instance of that role starts

// With disaggregation, the role instance `index` (0-based, in the
// service's instance order) starts with: its entry in `roles`, else the
// first prefills and the rest decode.
instance_role pd_start_role(const std::vector<instance_role>& roles, size_t index);
instance_role role_of(pd_pool p);  // the role it has (or is flipping to)
pd_pool flip_pool(pd_pool from, instance_role to);
bool takes_prefill(pd_pool p);  // M, P, D->P
bool takes_decode(pd_pool p);   // M, D, P->D

// One instance as the router or the simulator last saw it.
struct pd_load {
  uint64_t id = 0;
  bool serving = true;
  pd_pool pool = pd_pool::mixed;
  std::vector<int32_t> queued_prefills;  // prompt tokens still to compute, per sequence
  int32_t prefilling = 0;                // sequences with prompt left (waiting included)
  int32_t decoding = 0;                  // sequences decoding
  int64_t running_tokens = 0;            // KV tokens of its decoding sequences
  int32_t used_pages = 0;
  int32_t total_pages = 0;
  int32_t page_size = 16;
  double token_interval_ms = 0;  // mean decode step time of the last window (0: none seen)
  double busy = 0;               // share of the last window its device computed

  int64_t queued_prefill_tokens() const;
  int64_t tokens_in_process() const { return queued_prefill_tokens() + running_tokens; }
};

// Promotes an X->Y instance to Y once its X work is done.
pd_pool settle(pd_pool p, const pd_load& l);

struct pd_targets {
  double ttft_ms = 0;  // 0: no target
  double tpot_ms = 0;
};

// The report gives no windows, hysteresis or caps; these are ours
// (docs/disaggregation.md says why), all config keys.
struct pd_config {
  int32_t min_decode = 1;         // decode-taking instances (D, P->D) kept at least
  int32_t min_prefill = 1;        // prefill-taking instances (P, D->P) kept at least
  int32_t violation_windows = 2;  // consecutive windows a trigger must hold
  double miss_share = 0.1;        // to prefill: this share of a window's prefills predicted to miss
  double cooldown_s = 2;          // an instance flips again only after this
  double idle_busy = 0.2;         // prefill idle: nothing queued and busy below this
  double kv_high = 0.9;           // decode short of KV: used share above this
  double decode_step_cap_ms = 0;  // decode placement cap on the step time (0: the TPOT target)
  double decode_kv_cap = 0.9;     // decode placement cap on the KV share a placement may reach
};

// TTFT predicted on `l` for a prompt: its queued prefill work plus this
// prompt's, each from the prefill-time model.
double predicted_ttft_ms(const pd_load& l, int32_t prompt_tokens, const prefill_model& m);

struct prefill_choice {
  uint64_t instance = 0;  // 0: no instance takes prefill
  double predicted_ttft_ms = 0;
  bool meets_target = true;  // false: nothing is predicted to meet it (a D->P flip is due)
  std::string why;
};

// The P (and M) instance with the least predicted queueing when it meets
// the TTFT target, else the D->P instance that does, else the lowest
// prediction of all, marked as missing.  With no prefill-taking instance
// serving, any serving instance (it will decode there too); 0 when none
// serves.
prefill_choice place_prefill(int32_t prompt_tokens, const std::vector<pd_load>& loads,
                             const prefill_model& m, const pd_targets& t);

struct decode_choice {
  uint64_t instance = 0;
  bool transfer = false;  // the KV moves from the prefill instance
  std::string why;
};

// The prefill instance when it takes decode work (no transfer); else the
// D (or P->D) instance with the fewest running tokens among those under
// the KV and step-time caps; else the fewest running tokens of all; with
// no decode instance at all, the prefill instance.
decode_choice place_decode(uint64_t prefill_instance, int32_t context_tokens,
                           const std::vector<pd_load>& loads, const pd_config& c,
                           const pd_targets& t);

// One monitor window's signals beside the loads.
struct pd_window {
  int32_t unmet_prefills = 0;  // prefill placements predicted to miss the TTFT target
  int32_t prefills = 0;        // prefill placements
};

// What the flip policy remembers between windows (hysteresis, cooldown).
struct flip_memory {
  int32_t to_prefill_streak = 0;
  int32_t to_decode_streak = 0;
  std::map<uint64_t, double> last_flip_s;
};

struct flip_decision {
  uint64_t instance = 0;
  instance_role to = instance_role::mixed;
  std::string why;
};

// The report's role switching, evaluated once per window, at most one flip
// per call:
//  - to prefill when at least miss_share of the window's prefill
//    placements were predicted to miss TTFT: the
//    lightest instance (fewest tokens in process) from P->D first, then D,
//    keeping min_decode decode-taking instances;
//  - to decode when the decode side's mean token interval exceeds the
//    TPOT target, or its KV use exceeds kv_high, or every prefill instance
//    is idle while decode has work: from D->P first, then P, keeping
//    min_prefill prefill-taking instances.
// A trigger must hold violation_windows windows in a row; an instance
// flipped less than cooldown_s ago is not taken.
std::optional<flip_decision> decide_flip(const std::vector<pd_load>& loads, const pd_window& w,
                                         const pd_targets& t, const pd_config& c, double now_s,
                                         flip_memory& mem);

}  // namespace troupe
