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
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/service/placement.hpp"

namespace troupe {

// encode: hybrid EPD's E pool (E-P-D, runtime/service/epd_policy): an
// instance that only runs the vision encoder, taking neither prefill nor
// decode work (flipped to it, an instance finishes what it holds); role
// switching never flips one.
enum class instance_role : uint8_t { mixed, prefill, decode, encode };
const char* to_string(instance_role r);
std::optional<instance_role> parse_role(std::string_view s);

enum class pd_pool : uint8_t {
  mixed,
  prefill,
  decode,
  prefill_to_decode,
  decode_to_prefill,
  encode
};
const char* to_string(pd_pool p);  // "M", "P", "D", "P->D", "D->P", "E"

pd_pool pool_of(instance_role r);  // where an instance of that role starts

// With disaggregation, the role instance `index` (0-based, in the
// service's instance order) starts with: its entry in `roles`, else
// mixed with `mixed_start` (role switching through M: the policy
// disaggregates where the streams say it pays), else the first prefills
// and the rest decode.
instance_role pd_start_role(const std::vector<instance_role>& roles, size_t index,
                            bool mixed_start = false);
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
  int32_t waiting = 0;                   // of those, the ones not admitted yet
  int32_t decoding = 0;                  // sequences decoding
  int64_t running_tokens = 0;            // KV tokens of its decoding sequences
  int32_t used_pages = 0;
  int32_t total_pages = 0;
  int32_t page_size = 16;
  double token_interval_ms = 0;  // mean decode step time of the last window (0: none seen)
  double busy = 0;               // share of the last window its device computed
  double tpot_ms = 0;  // mean TPOT of the requests that finished there in the last window (0: none)
  // How old this view is (the router polls): the instance has worked
  // through this much of the queue shown since (the TTFT predictor).
  double age_ms = 0;

  int64_t queued_prefill_tokens() const;
  int64_t tokens_in_process() const { return queued_prefill_tokens() + running_tokens; }
  // vLLM's load score as least-load placement counts it (4 x waiting +
  // running): a sequence admitted and prefilling is a running one.
  int64_t load_score() const { return 4 * int64_t(waiting) + (prefilling - waiting) + decoding; }
};

// The KV pages `tokens` take, `page_size` tokens a page (rounded up).
inline int32_t kv_pages_for(int64_t tokens, int32_t page_size) {
  const int64_t ps = std::max(1, page_size);
  return static_cast<int32_t>((tokens + ps - 1) / ps);
}

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
  // Flips go through M (mixed) rather than straight between P and D: a
  // burst of prompts turns decode instances mixed, which prefill without
  // giving up their decode work; slow decode turns prefill instances
  // mixed.  A service whose disaggregation does not pay ends all mixed.
  bool via_mixed = true;
  int32_t max_flips = 4;  // instances one window may flip (the shortfall says how many)
  double mixed_slack =
      0.8;            // via M: mixed instances' TPOT under this share of the target: mix more
  bool unmix = true;  // via M: mixed instances whose requests miss TPOT turn P
  // D->P preemption by migration (the "rather than draining"): a
  // flip that takes an instance off decode (D -> P, M -> P) moves its
  // decoding sequences, KV and all, to decode-taking instances under the
  // placement caps at once, so it prefills at full speed from the next
  // step; a sequence that no instance takes under the caps finishes
  // where it is.
  bool preempt_migrate = true;
};

// The TTFT predictor (runtime/service/ttft_predictor.hpp).
struct ttft_model;

struct prefill_choice {
  uint64_t instance = 0;  // 0: no instance takes prefill
  double predicted_ttft_ms = 0;
  bool meets_target = true;  // false: nothing is predicted to meet it (a D->P flip is due)
  std::string why;
};

// Of the P (and M) instances predicted to meet the TTFT target, the one
// with the lowest load score (decoding sequences included; ties: the most
// free KV pages, then the lowest prediction, as least-load placement
// breaks them); else of the
// D->P instances that meet it, else the lowest
// prediction of all, marked as missing.  With no prefill-taking instance
// serving, any serving instance (it will decode there too); 0 when none
// serves.
prefill_choice place_prefill(int32_t prompt_tokens, const std::vector<pd_load>& loads,
                             const ttft_model& m, const pd_targets& t);

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

// D->P preemption by migration: where each decoding sequence of instance
// `from` goes, given their context tokens in the order they should move
// (the caller puts first those whose move frees the most decode work).
// Each goes where place_decode would send it under its caps (fewest
// running tokens, `from` excluded), the loads counting the sequences
// placed before it; 0 where no instance takes it under the caps (it
// stays).  Only under the caps: moving a stream onto an instance already
// over the TPOT or KV cap trades one miss for several.
std::vector<uint64_t> plan_evacuation(uint64_t from, const std::vector<int32_t>& contexts,
                                      std::vector<pd_load> loads, const pd_config& c,
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
  int32_t slack_streak = 0;        // via M: decode steps well under the TPOT target
  int32_t interfered_streak = 0;   // via M: mixed instances' requests over it
  int32_t decode_idle_streak = 0;  // via M: a decode instance idle
  std::map<uint64_t, double> last_flip_s;
};

struct flip_decision {
  uint64_t instance = 0;
  instance_role to = instance_role::mixed;
  std::string why;
};

// The report's role switching, evaluated once per window:
//  - to prefill when at least miss_share of the window's prefill
//    placements were predicted to miss TTFT: the
//    lightest instances (fewest tokens in process) from P->D first, then D,
//    keeping min_decode instances that only decode;
//  - to decode when the decode side's mean token interval, or the mean
//    TPOT of the requests that finished there, exceeds the TPOT target,
//    or its KV use exceeds kv_high, or every prefill instance
//    is idle while decode has work: from D->P first, then P, keeping
//    min_prefill instances that only prefill.
// With via_mixed both go to M instead (an M instance takes both kinds, so
// the minimums, which keep a kind of work served, count M too), and two
// more triggers keep the service disaggregated only where that pays:
//  - P -> M when the decode steps (D and M instances) meet the TPOT
//    target and the requests that finished on mixed instances averaged
//    under mixed_slack of it, or no worse than those on decode instances:
//    one at first (with no mixed instance to judge by), then up to
//    max_flips a window;
//  - D -> M when decode instances idle (nothing decoding, busy under
//    idle_busy): with prefill work they earn their keep, and once the P
//    instances are gone nothing else would reach them;
//  - M -> P (one of at least two M) when the requests that finished on
//    mixed instances missed the TPOT target on average while no prefill
//    was predicted to miss TTFT: their prefills slowed their decode, and
//    prefill has capacity to spare.
// How many flip: the share of the window's
// prefills predicted to miss times the instances taking prefill (at
// least one) for the first trigger, max_flips for the others through M
// (one for the first P -> M without a mixed instance to judge by), one
// for the others straight; never more than max_flips.  A trigger must hold violation_windows
// windows in a row; an instance flipped less than cooldown_s ago is not taken.
std::vector<flip_decision> decide_flips(const std::vector<pd_load>& loads, const pd_window& w,
                                        const pd_targets& t, const pd_config& c, double now_s,
                                        flip_memory& mem);

}  // namespace troupe
