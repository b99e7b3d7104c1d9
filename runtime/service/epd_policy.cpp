#include "runtime/service/epd_policy.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <stdexcept>

namespace troupe {

std::string_view to_string(epd_strategy s) {
  switch (s) {
    case epd_strategy::ep_d:
      return "EP-D";
    case epd_strategy::ed_p:
      return "ED-P";
    case epd_strategy::e_p_d:
      return "E-P-D";
    case epd_strategy::colocated:
      return "EPD";
  }
  return "?";
}

std::optional<epd_strategy> parse_epd_strategy(std::string_view name) {
  for (auto s : k_epd_strategies) {
    const auto want = to_string(s);
    if (name.size() != want.size()) continue;
    bool same = true;
    for (size_t i = 0; i < name.size(); ++i)
      same = same && std::toupper(static_cast<unsigned char>(name[i])) == want[i];
    if (same) return s;
  }
  return std::nullopt;
}

bool runs_encode(epd_strategy s, pd_pool pool) {
  switch (s) {
    case epd_strategy::ep_d:
      return takes_prefill(pool);
    case epd_strategy::ed_p:
      return takes_decode(pool);
    case epd_strategy::e_p_d:
      return pool == pd_pool::encode;
    case epd_strategy::colocated:
      return true;
  }
  return false;
}

bool prefill_where_encoded(epd_strategy s) {
  return s == epd_strategy::ep_d || s == epd_strategy::colocated;
}

encode_choice place_encode(epd_strategy s, const std::vector<encode_load>& loads, size_t& cursor) {
  const size_t n = loads.size();
  for (bool in_pool : {true, false}) {
    const encode_load* best = nullptr;
    size_t best_at = 0;
    // From the cursor on, so that ties go in turn.
    for (size_t k = 0; k < n; ++k) {
      const size_t at = (cursor + k) % n;
      const auto& l = loads[at];
      if (!l.serving || !l.has_encoder || (in_pool && !runs_encode(s, l.pool))) continue;
      if (!best || l.images < best->images ||
          (l.images == best->images && l.load_score < best->load_score)) {
        best = &l;
        best_at = at;
      }
    }
    if (!best) continue;
    cursor = best_at + 1;
    return {best->id, in_pool ? std::string(to_string(s)) + ": " + to_string(best->pool) +
                                    " pool, fewest images waiting"
                              : std::string(to_string(s)) +
                                    ": no instance of its encode pool serving; fewest images "
                                    "waiting of all"};
  }
  return {0, "no serving instance has a vision encoder"};
}

std::vector<epd_stages> epd_pools(epd_strategy s) {
  switch (s) {
    case epd_strategy::ep_d:
      return {{true, true, false}, {false, false, true}};
    case epd_strategy::ed_p:
      return {{false, true, false}, {true, false, true}};
    case epd_strategy::e_p_d:
      return {{true, false, false}, {false, true, false}, {false, false, true}};
    case epd_strategy::colocated:
      return {{true, true, true}};
  }
  return {};
}

std::string pools_text(const std::vector<int32_t>& pools) {
  std::string out;
  for (size_t i = 0; i < pools.size(); ++i) {
    if (i) out += '/';
    out += std::to_string(pools[i]);
  }
  return out;
}

int32_t epd_iteration::prefill_rows() const {
  int32_t n = 0;
  for (int32_t r : partial_rows) n += r;
  for (int32_t r : new_rows) n += r;
  return n;
}

epd_iteration plan_epd_iteration(const epd_queue& q, const epd_limits& lim) {
  epd_iteration it;
  // (1) Every running decode: a decode left out misses its TPOT.
  it.decode_rows = std::min(q.decodes, std::max(lim.max_decode_tokens, 0));
  // (2) Chunked prefills already begun come first (their requests hold KV
  // and wait for their first token), then new ones, within the budget.
  int32_t budget = std::max(lim.max_prefill_tokens, 0);
  for (int32_t left : q.partial_prefills) {
    const int32_t r = std::clamp(left, 0, budget);
    it.partial_rows.push_back(r);
    budget -= r;
  }
  for (int32_t tokens : q.new_prefills) {
    if (budget <= 0) break;
    const int32_t r = std::clamp(tokens, 0, budget);
    it.new_rows.push_back(r);
    budget -= r;
  }
  // (3) Encodes only when no prefill is under way or in this iteration:
  // an encode beside a prefill chunk would stretch the chunk's iteration,
  // and both are compute-bound.
  if (q.partial_prefills.empty() && it.prefill_rows() == 0)
    it.encodes = std::min(q.pending_encodes, std::max(lim.max_encode_batch, 0));
  return it;
}

double combine_streams(double language_ms, double vision_ms, bool dual_stream, double overlap) {
  if (!dual_stream) return language_ms + vision_ms;
  overlap = std::clamp(overlap, 0.0, 1.0);
  return std::max(language_ms, vision_ms) + (1 - overlap) * std::min(language_ms, vision_ms);
}

double epd_iteration_ms(const epd_costs& c, int32_t rows, int32_t decode_rows, int32_t encodes,
                        bool dual_stream) {
  const double language = rows > 0 ? c.language_ms(rows, decode_rows) : 0.0;
  const double vision = encodes > 0 ? c.encode_ms(encodes) : 0.0;
  return combine_streams(language, vision, dual_stream, c.dual_stream_overlap);
}

namespace {

// The largest n in [lo, hi] with fits(n) (lo when none does): fits is
// monotone (a bigger batch never costs less).
int32_t largest_fitting(int32_t lo, int32_t hi, const std::function<bool(int32_t)>& fits) {
  if (!fits(lo)) return lo;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

struct weighed {
  epd_limits limits;
  std::vector<double> work_ms;  // instance time per request, per pool
  bool over_tpot = false;       // decodes' mean iteration is over the TPOT SLO
};

weighed weigh(epd_strategy s, const epd_costs& c, const epd_workload& w, double tpot,
              bool dual_stream) {
  weighed out;
  auto& lim = out.limits;
  const auto pools = epd_pools(s);
  bool prefill_beside_decode = false, encode_beside_decode = false;
  for (const auto& p : pools) {
    prefill_beside_decode |= p.prefill && p.decode;
    encode_beside_decode |= p.encode && p.decode;
  }
  auto iteration = [&](int32_t rows, int32_t decodes, int32_t images) {
    return epd_iteration_ms(c, rows, decodes, images, dual_stream);
  };
  // Decode batch: the whole TPOT budget where decodes run alone, half of
  // it where prefill chunks or encodes join them.
  const double decode_budget = prefill_beside_decode || encode_beside_decode ? tpot / 2 : tpot;
  lim.max_decode_tokens =
      largest_fitting(1, 4096, [&](int32_t d) { return iteration(d, d, 0) <= decode_budget; });
  const int32_t d = lim.max_decode_tokens;
  const int32_t dp = prefill_beside_decode ? d : 0, de = encode_beside_decode ? d : 0;
  lim.max_prefill_tokens =
      largest_fitting(16, 8192, [&](int32_t p) { return iteration(p + dp, dp, 0) <= tpot; });
  lim.max_encode_batch =
      largest_fitting(1, 64, [&](int32_t b) { return iteration(de, de, b) <= tpot; });
  const int32_t p = lim.max_prefill_tokens, b = lim.max_encode_batch;
  // Instance time per request in each pool at its capacity: its encoder
  // batches (the pool's running decodes riding along where it decodes),
  // its prefill chunks (likewise), then the decode-only iterations its
  // output needs.  At capacity every iteration carries a full decode batch,
  // unless the pool's encoder batches and prefill chunks alone are more
  // iterations than its requests have output tokens to fill: then each
  // carries output / (encodes + chunks).  A request's TPOT is the mean
  // iteration of the pool it decodes in: one image may take longer than
  // the SLO beside decodes, but not on average.
  for (const auto& pool : pools) {
    const double encodes = pool.encode ? w.images / b : 0.0;
    const double chunks = pool.prefill ? w.prompt_tokens / p : 0.0;
    double running = 0;
    if (pool.decode) {
      running = static_cast<double>(d);
      if (encodes + chunks > 0) running = std::min(running, w.output_tokens / (encodes + chunks));
      running = std::max(running, 1.0);
    }
    const auto dd = static_cast<int32_t>(std::lround(running));
    double ms = encodes * iteration(dd, dd, b) + chunks * iteration(p + dd, dd, 0);
    double iterations = encodes + chunks;
    if (pool.decode) {
      const double rest = std::max(0.0, w.output_tokens / running - encodes - chunks);
      ms += rest * iteration(dd, dd, 0);
      iterations += rest;
      out.over_tpot |= iterations > 0 && ms / iterations > tpot;
    }
    out.work_ms.push_back(ms);
  }
  return out;
}

// The split of n instances over pools with these per-request times that
// sustains the most requests/s (every pool at least one instance).
double best_split(const std::vector<double>& work_ms, int32_t n, std::vector<int32_t>& split) {
  double best = -1;
  std::vector<int32_t> cur(work_ms.size(), 1);
  std::function<void(size_t, int32_t)> go = [&](size_t i, int32_t left) {
    if (i + 1 == work_ms.size()) {
      cur[i] = left;
      double rate = 1e300;
      for (size_t k = 0; k < cur.size(); ++k)
        rate = std::min(rate, work_ms[k] > 0 ? cur[k] * 1000.0 / work_ms[k] : 1e300);
      if (rate > best) best = rate, split = cur;
      return;
    }
    const int32_t rest = static_cast<int32_t>(work_ms.size() - i - 1);
    for (int32_t k = 1; k <= left - rest; ++k) {
      cur[i] = k;
      go(i + 1, left - k);
    }
  };
  go(0, n);
  return best;
}

}  // namespace

epd_profile profile_epd(const epd_costs& c, const epd_workload& w, double tpot_slo_ms,
                        int32_t instances, bool dual_stream, std::optional<epd_strategy> only) {
  std::vector<epd_strategy> candidates(std::begin(k_epd_strategies), std::end(k_epd_strategies));
  if (only) candidates = {*only};
  epd_profile best;
  bool have = false, best_over = true;
  for (auto s : candidates) {
    const size_t need = epd_pools(s).size();
    if (instances < static_cast<int32_t>(need)) {
      if (only)
        throw std::invalid_argument(std::string(to_string(s)) + " needs " + std::to_string(need) +
                                    " instances, not " + std::to_string(instances));
      continue;
    }
    const auto wd = weigh(s, c, w, tpot_slo_ms, dual_stream);
    std::vector<int32_t> split;
    const double rate = best_split(wd.work_ms, instances, split);
    char line[256];
    std::snprintf(
        line, sizeof line, "%-5s pools %s, encoder batch %d, prefill %d, decode %d: %.2f req/s%s",
        std::string(to_string(s)).c_str(), pools_text(split).c_str(), wd.limits.max_encode_batch,
        wd.limits.max_prefill_tokens, wd.limits.max_decode_tokens, rate,
        wd.over_tpot ? " (its decodes' mean iteration exceeds the TPOT SLO)" : "");
    best.log.emplace_back(line);
    // A strategy whose decodes cannot keep the TPOT SLO comes after every
    // one that can.
    const bool better =
        !have || (best_over && !wd.over_tpot) || (best_over == wd.over_tpot && rate > best.rate);
    if (better) {
      best.strategy = s;
      best.limits = wd.limits;
      best.pools = split;
      best.rate = rate;
      best_over = wd.over_tpot;
      have = true;
    }
  }
  if (!have)
    throw std::invalid_argument("hybrid EPD needs at least 1 instance, not " +
                                std::to_string(instances));
  return best;
}

epd_profile profile_epd_by_trial(const epd_costs& c, const epd_workload& w, double tpot_slo_ms,
                                 int32_t instances, bool dual_stream, const epd_trial& trial,
                                 std::optional<epd_strategy> only) {
  std::vector<epd_strategy> candidates(std::begin(k_epd_strategies), std::end(k_epd_strategies));
  if (only) candidates = {*only};
  epd_profile best;
  bool have = false;
  for (auto s : candidates) {
    if (instances < static_cast<int32_t>(epd_pools(s).size())) {
      if (only) profile_epd(c, w, tpot_slo_ms, instances, dual_stream, s);  // throws, named
      continue;
    }
    auto est = profile_epd(c, w, tpot_slo_ms, instances, dual_stream, s);
    std::vector<int32_t> pools = est.pools;
    epd_limits lim = est.limits;
    double measured = trial(s, lim, pools);
    // Hill climbing: the best single move of the split (one instance from
    // a pool to another) or of a limit (the prefill chunk or the encoder
    // batch doubled or halved: the analytic limits keep every iteration
    // under the TPOT SLO, while a request's TPOT is its mean), while it
    // gains.
    for (int32_t step = 0; step < 2 * instances + 8; ++step) {
      std::vector<int32_t> best_pools;
      std::optional<epd_limits> best_lim;
      double best_rate = measured;
      auto consider = [&](const std::vector<int32_t>& p, const epd_limits& l) {
        const double r = trial(s, l, p);
        if (r > best_rate) best_rate = r, best_pools = p, best_lim = l;
      };
      for (size_t from = 0; from < pools.size(); ++from)
        for (size_t to = 0; to < pools.size(); ++to) {
          if (from == to || pools[from] <= 1) continue;
          auto moved = pools;
          --moved[from];
          ++moved[to];
          consider(moved, lim);
        }
      for (bool up : {true, false}) {
        epd_limits l = lim;
        l.max_prefill_tokens = up ? std::min(8192, 2 * lim.max_prefill_tokens)
                                  : std::max(16, lim.max_prefill_tokens / 2);
        if (l.max_prefill_tokens != lim.max_prefill_tokens) consider(pools, l);
        l = lim;
        l.max_encode_batch =
            up ? std::min(64, 2 * lim.max_encode_batch) : std::max(1, lim.max_encode_batch / 2);
        if (l.max_encode_batch != lim.max_encode_batch) consider(pools, l);
      }
      if (!best_lim) break;
      pools = best_pools;
      lim = *best_lim;
      measured = best_rate;
    }
    est.limits = lim;
    char line[160];
    std::snprintf(
        line, sizeof line, "; by trial, pools %s, encoder batch %d, prefill %d: %.2f req/s",
        pools_text(pools).c_str(), lim.max_encode_batch, lim.max_prefill_tokens, measured);
    best.log.push_back(est.log.at(0) + line);
    if (!have || measured > best.rate) {
      auto log = std::move(best.log);
      best = est;
      best.pools = pools;
      best.rate = measured;
      best.log = std::move(log);
      have = true;
    }
  }
  if (!have)
    throw std::invalid_argument("hybrid EPD needs at least 1 instance, not " +
                                std::to_string(instances));
  return best;
}

}  // namespace troupe
