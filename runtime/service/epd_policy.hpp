#pragma once
// Hybrid EPD (xLLM §2.1 and §3.3, ../shared/REFERENCES.md §3; issue 36
// item 3): where a multimodal request's three stages run (encode: the
// vision encoder turns images into embeddings; prefill; decode), what one
// instance's iteration takes, and the start-up profiler that picks both.
// Plain functions, called by the EPD simulator (sim/epd_sim, `troupe bench
// epd`) and tested on synthetic inputs (tests/unit/test_epd_policy.cpp).
//
// Strategies, by the pools they make:
//   EP-D   encode fused with prefill in the P pool; decode in the D pool;
//   ED-P   prefill in the P pool; encode beside decode in the D pool;
//   E-P-D  three pools;
//   EPD    every instance runs all three (no disaggregation): the
//          fallback where splitting the stages cannot pay.
// The per-iteration batch rule (§3.3): (1) every running decode; (2) the
// partially computed chunked prefills, then new ones, within the prefill
// token budget; (3) pending encodes, within the encoder batch, only if no
// chunked prefill is under way and no request is in prefill.  Dual stream:
// a vision stream (encodes) and a language stream (prefill and decode) run
// at once, so an iteration holding both costs the longer plus the share of
// the shorter that the two do not hide (`dual_stream_overlap`: 0, nothing
// hidden, is what a 2-core CPU gives; a GPU's two streams hide some).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/service/pd_policy.hpp"

namespace troupe {

enum class epd_strategy { ep_d, ed_p, e_p_d, colocated };
// Every strategy, in the order the profilers weigh them.
inline constexpr epd_strategy k_epd_strategies[] = {epd_strategy::ep_d, epd_strategy::ed_p,
                                                    epd_strategy::e_p_d, epd_strategy::colocated};
std::string_view to_string(epd_strategy s);
std::optional<epd_strategy> parse_epd_strategy(std::string_view name);

// The stages an instance of a pool runs.
struct epd_stages {
  bool encode = false, prefill = false, decode = false;
};
// A strategy's pools, in the order of epd_profile::pools: EP-D and ED-P
// have two (the P side first), E-P-D three (E, P, D), EPD one.
std::vector<epd_stages> epd_pools(epd_strategy s);
// A split of instances over pools as "7/1".
std::string pools_text(const std::vector<int32_t>& pools);

// --- The real router's encode placement (troupe serve --epd) ---

// Whether an instance of `pool` runs the encode stage under `s`: EP-D
// the instances taking prefill (M, P, D->P), ED-P those taking decode (M,
// D, P->D), E-P-D the E pool, EPD every one.
bool runs_encode(epd_strategy s, pd_pool pool);
// Whether the prefill goes where the images were encoded: EP-D's fused
// encode and prefill, and EPD's one instance for all three stages.
bool prefill_where_encoded(epd_strategy s);

// One instance as encode placement sees it.
struct encode_load {
  uint64_t id = 0;
  bool serving = true;
  bool has_encoder = true;  // instances on other nodes have none
  pd_pool pool = pd_pool::mixed;
  int32_t images = 0;      // images placed on its encoder and not yet encoded
  int64_t load_score = 0;  // pd_load::load_score (its language work)
};

struct encode_choice {
  uint64_t instance = 0;  // 0: no serving instance has an encoder
  std::string why;
};

// The simulator's router rule (sim/epd_sim): of the serving instances with
// an encoder whose pool runs encode, the fewest images waiting, then the
// least language work; ties in turn from `cursor` (which advances).  With
// none in the strategy's pool (an E instance lost, say), any serving
// instance with an encoder, so that the request is served rather than
// refused.
encode_choice place_encode(epd_strategy s, const std::vector<encode_load>& loads, size_t& cursor);

// What an instance's iteration may take (the profiler's answer).
struct epd_limits {
  int32_t max_encode_batch = 1;      // images
  int32_t max_prefill_tokens = 256;  // prefill rows
  int32_t max_decode_tokens = 64;    // decode rows (one per running decode)
};

// One instance's work when an iteration is planned.
struct epd_queue {
  int32_t decodes = 0;                    // running decodes
  std::vector<int32_t> partial_prefills;  // tokens left of prefills begun, oldest first
  std::vector<int32_t> new_prefills;      // tokens of prefills not begun, in arrival order
  int32_t pending_encodes = 0;            // images waiting for the encoder
};

struct epd_iteration {
  int32_t decode_rows = 0;
  std::vector<int32_t> partial_rows;  // rows of each partial prefill (same order)
  std::vector<int32_t> new_rows;      // rows of the new prefills begun, a prefix of them
  int32_t encodes = 0;
  int32_t prefill_rows() const;
  bool empty() const { return decode_rows == 0 && prefill_rows() == 0 && encodes == 0; }
};

// The per-iteration batch rule above.
epd_iteration plan_epd_iteration(const epd_queue& q, const epd_limits& lim);

// What an iteration costs, in ms.  `language_ms` prices a forward pass of
// rows with decode_rows of them decodes (the cost model's step time, its
// attention work estimated by the caller); `encode_ms` an encoder batch.
struct epd_costs {
  std::function<double(int32_t rows, int32_t decode_rows)> language_ms;
  std::function<double(int32_t images)> encode_ms;
  double dual_stream_overlap = 0;  // share of the shorter stream hidden, [0, 1]
};
// The two streams' times as one iteration's: their sum without dual
// stream; with it, the longer plus the part of the shorter not hidden.
double combine_streams(double language_ms, double vision_ms, bool dual_stream, double overlap);
double epd_iteration_ms(const epd_costs& c, int32_t rows, int32_t decode_rows, int32_t encodes,
                        bool dual_stream);

// The workload the profiler plans for: means per request.
struct epd_workload {
  double images = 1;
  double prompt_tokens = 600;  // text and image placeholder tokens
  double output_tokens = 20;
};

struct epd_profile {
  epd_strategy strategy = epd_strategy::e_p_d;
  epd_limits limits;
  std::vector<int32_t> pools;    // instances per pool, in epd_pools(strategy)'s order
  double rate = 0;               // requests/s the split sustains, by the profiler's estimate
  std::vector<std::string> log;  // one line per strategy weighed
};

// The start-up profiler (§2.1).  Binary search finds the largest decode
// batch whose iteration stays under the TPOT SLO (under half of it where
// prefill chunks or encodes share its iterations), then the largest
// prefill chunk and encoder batch that keep those shared iterations under
// it (at least 16 rows and 1 image).  Each strategy's best split of
// `instances` into its pools is priced by the instance time a request
// needs in each pool at those limits (iteration by iteration: encoder
// batches and prefill chunks carry the pool's decodes, then decode-only
// iterations finish its output), and the strategy with the highest
// sustainable rate is chosen, one whose decodes' mean iteration is over
// the TPOT SLO only if every one's is.  `only`: that strategy, not weighing others.
// Throws std::invalid_argument for fewer instances than the pools need.
epd_profile profile_epd(const epd_costs& c, const epd_workload& w, double tpot_slo_ms,
                        int32_t instances, bool dual_stream,
                        std::optional<epd_strategy> only = std::nullopt);

// The profiler by trial, as the report's runs on the engine at start-up:
// each strategy's limits and split come from profile_epd, then `trial`
// measures the split's goodput (requests/s at the SLOs), and split and
// limits climb (one instance moved between two pools, or the prefill
// chunk or encoder batch doubled or halved, at a time) while that gains;
// the strategy measured best wins.  `rate` is then the
// measured goodput; the log gives estimate and measurement per strategy.
using epd_trial =
    std::function<double(epd_strategy, const epd_limits&, const std::vector<int32_t>& pools)>;
epd_profile profile_epd_by_trial(const epd_costs& c, const epd_workload& w, double tpot_slo_ms,
                                 int32_t instances, bool dual_stream, const epd_trial& trial,
                                 std::optional<epd_strategy> only = std::nullopt);

}  // namespace troupe
