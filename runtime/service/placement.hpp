#pragma once
// Where the router places a request (issue 10; docs/architecture.md
// §2.3 "Policies are plain functions"): plain functions over the instances'
// load snapshots, so the router actor and the cluster simulator call the same
// code, and tests feed them synthetic snapshots.
//
//   round-robin  each serving instance in turn
//   least-load   vLLM's score 4 x waiting + running, lowest first
//   prefix       the longest run of the prompt's full-page hashes an
//                instance holds in its prefix cache, continued by the pages
//                its process's KV store holds (host, then disk tier), each
//                weighed by what loading a page from its tier costs against
//                computing it (tier_weight, from measured times), so a hit
//                counts most in the arena, then the host, then the disk;
//                ties by load
//   slo          predicted TTFT = the instance's queued prefill work plus
//                this prompt's past what it holds (held_pages), plus loading
//                its store's pages, from a prefill-time model fitted online;
//                the least-loaded instance predicted to meet the target,
//                else the one with the lowest prediction
//   load-aware   BanaServe's load-aware dispatch (Algorithm 4-2): the
//                instance of lowest utilisation U = memory share + compute
//                share (in [0, 2]; ties by queue length) while that U is
//                below load_aware_threshold, else the shortest queue.  Cache
//                hits are ignored on purpose: with the KV store (tiers and
//                pulls from other nodes) a prefix is reachable anywhere.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "runtime/service/rls.hpp"

namespace troupe {

// One instance as the router last heard of it.
struct instance_snapshot {
  uint64_t instance = 0;  // the router's id for it
  bool serving = true;    // false: starting, draining or down; never placed on
  int32_t waiting = 0;
  int32_t running = 0;
  int64_t queued_prefill_tokens = 0;  // prompt tokens admitted or waiting, not computed yet
  int32_t free_pages = 0;
  int32_t total_pages = 0;
  std::unordered_set<uint64_t> prefix_hashes;  // chained hashes of its cached full pages
  // Its process's KV store: the hashes its host tier holds, and what
  // loading a page from the store took on average (ms; < 0: not measured
  // yet); the hashes its disk tier holds, and what a page costs from there
  // (the load plus the disk's read, ms; < 0: not measured yet).
  std::unordered_set<uint64_t> tier_hashes;
  double tier_load_ms_per_page = -1;
  std::unordered_set<uint64_t> disk_hashes;
  double disk_load_ms_per_page = -1;
};

enum class placement_policy { round_robin, least_load, prefix, slo, load_aware };
const char* to_string(placement_policy p);
std::optional<placement_policy> parse_placement_policy(std::string_view name);

// Prefill time as a function of prompt length, t(L) = a L^2 + b L + c in
// ms, fitted online by recursive least squares from measured prefills
// (attention makes it quadratic).  Before any sample it predicts 0.
class prefill_model {
 public:
  explicit prefill_model(double forgetting = 0.999);
  void observe(double tokens, double ms);
  double predict_ms(double tokens) const;  // 0 for 0 tokens
  uint64_t samples() const { return fit_.samples(); }
  const double* coefficients() const { return fit_.coefficients(); }  // a, b, c

 private:
  rls<3> fit_;
};

struct placement_request {
  int32_t prompt_tokens = 0;
  std::vector<uint64_t> page_hashes;  // the prompt's full pages, chained (page_pool's page_hash)
  int32_t page_size = 16;             // tokens a page
};

// The prefill time one page of a prompt saves: the model's marginal cost
// at the prompt's length (-1 before any sample).  What a page from a
// tier or another node's store is weighed against.
double compute_ms_per_page(double prompt_tokens, int32_t page_size, const prefill_model& model);

// What a page found in a KV store tier is worth against one in the arena
// (1) or none (0): 1 - load / compute, clamped, where compute is the
// prefill time the page saves.  Unmeasured (either < 0): 0.5.
double tier_weight(double load_ms_per_page, double compute_ms_per_page);

struct placement {
  uint64_t instance = 0;  // 0: no serving instance
  std::string why;        // for the request's trace
  int32_t prefix_pages = 0;
  double predicted_ttft_ms = 0;
};

// The round-robin cursor; the router keeps one.
struct placement_cursor {
  uint64_t next = 0;
};

placement place(placement_policy policy, const placement_request& req,
                const std::vector<instance_snapshot>& instances, placement_cursor& cursor,
                const prefill_model& model, double ttft_target_ms);

// The leading pages of `hashes` an instance can map without computing:
// its arena's cached run, continued by its KV store's pages, each counted
// where it is (a page in both tiers: the host).
struct held_pages {
  int32_t device = 0, host = 0, disk = 0;
  int32_t total() const { return device + host + disk; }
};
held_pages held_by(const instance_snapshot& s, const std::vector<uint64_t>& hashes);
int32_t held_run(const instance_snapshot& s, const std::vector<uint64_t>& hashes);

// Pulling a prompt's pages from another node's KV store (issue 39): the
// chosen instance holds the first pages of the prompt (held_run);
// `runs[k]` is how many of the pages after those store k holds
// (run_after), and `pull_ms_per_page[k]` what a page from it took to
// arrive over that link, measured by the instance (< 0: not measured yet).
// The store pulled from is the one that saves the most prefill time: a run
// of r pages from a measured link saves r (compute - pull), and a link
// slower than computing saves nothing; an unmeasured link is counted at
// half the compute time (tier_weight's 0.5), so it gets tried and
// measured.  Before the compute time is known, the longest run.
struct kv_pull {
  int store = -1;     // index into runs; -1: pull nothing
  int32_t pages = 0;  // its run
};
kv_pull pick_kv_pull(const std::vector<int32_t>& runs, const std::vector<double>& pull_ms_per_page,
                     double compute_ms_per_page);
// The run of `hashes` a store holds from index `have` on.
int32_t run_after(const std::unordered_set<uint64_t>& store, const std::vector<uint64_t>& hashes,
                  int32_t have);

// Load-aware dispatch's utilisation of an instance, in [0, 2]: the share
// of its KV pages in use plus its prefill backlog's predicted time over the
// TTFT target (capped at 1; 0 until the model has a sample).  The thesis
// sums compute and memory shares the same way (Algorithm 4-1's U_d).
struct utilisation {
  double memory = 0;
  double compute = 0;
  double total() const { return memory + compute; }
};
utilisation utilisation_of(const instance_snapshot& s, const prefill_model& model,
                           double ttft_target_ms);
// Below this utilisation the least-utilised instance takes the request;
// above it every instance is busy and the shortest queue does (the thesis
// gives no value: half the range, where one of the two shares is full).
constexpr double load_aware_threshold = 1.0;

// vLLM's load score: 4 x waiting + running.
int64_t load_score(const instance_snapshot& s);

}  // namespace troupe
