#include "runtime/service/pd_policy.hpp"

#include "runtime/service/ttft_predictor.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace troupe {

const char* to_string(instance_role r) {
  switch (r) {
    case instance_role::mixed:
      return "mixed";
    case instance_role::prefill:
      return "prefill";
    case instance_role::decode:
      return "decode";
    case instance_role::encode:
      return "encode";
  }
  return "?";
}

std::optional<instance_role> parse_role(std::string_view s) {
  if (s == "mixed") return instance_role::mixed;
  if (s == "prefill") return instance_role::prefill;
  if (s == "decode") return instance_role::decode;
  if (s == "encode") return instance_role::encode;
  return std::nullopt;
}

const char* to_string(pd_pool p) {
  switch (p) {
    case pd_pool::mixed:
      return "M";
    case pd_pool::prefill:
      return "P";
    case pd_pool::decode:
      return "D";
    case pd_pool::prefill_to_decode:
      return "P->D";
    case pd_pool::decode_to_prefill:
      return "D->P";
    case pd_pool::encode:
      return "E";
  }
  return "?";
}

pd_pool pool_of(instance_role r) {
  switch (r) {
    case instance_role::prefill:
      return pd_pool::prefill;
    case instance_role::decode:
      return pd_pool::decode;
    case instance_role::encode:
      return pd_pool::encode;
    case instance_role::mixed:
      break;
  }
  return pd_pool::mixed;
}

instance_role pd_start_role(const std::vector<instance_role>& roles, size_t index,
                            bool mixed_start) {
  if (index < roles.size()) return roles[index];
  if (mixed_start) return instance_role::mixed;
  return index == 0 ? instance_role::prefill : instance_role::decode;
}

instance_role role_of(pd_pool p) {
  switch (p) {
    case pd_pool::prefill:
    case pd_pool::decode_to_prefill:
      return instance_role::prefill;
    case pd_pool::decode:
    case pd_pool::prefill_to_decode:
      return instance_role::decode;
    case pd_pool::encode:
      return instance_role::encode;
    case pd_pool::mixed:
      break;
  }
  return instance_role::mixed;
}

pd_pool flip_pool(pd_pool from, instance_role to) {
  if (to == instance_role::mixed) return pd_pool::mixed;  // takes both at once
  // E takes no new work (what the instance holds finishes there); from E,
  // the new role's work at once (an E instance holds none).
  if (to == instance_role::encode) return pd_pool::encode;
  if (from == pd_pool::encode) return pool_of(to);
  if (role_of(from) == to) {
    // Already that role, or flipping back before the old work drained:
    // the work it still has is of the role it returns to.
    return pool_of(to);
  }
  // From P, D->P or M to decode: its prefill work drains first, and the
  // other way round.
  return to == instance_role::decode ? pd_pool::prefill_to_decode : pd_pool::decode_to_prefill;
}

bool takes_prefill(pd_pool p) {
  return p == pd_pool::mixed || p == pd_pool::prefill || p == pd_pool::decode_to_prefill;
}

bool takes_decode(pd_pool p) {
  return p == pd_pool::mixed || p == pd_pool::decode || p == pd_pool::prefill_to_decode;
}

int64_t pd_load::queued_prefill_tokens() const {
  int64_t n = 0;
  for (int32_t q : queued_prefills) n += q;
  return n;
}

pd_pool settle(pd_pool p, const pd_load& l) {
  if (p == pd_pool::prefill_to_decode && l.prefilling == 0) return pd_pool::decode;
  if (p == pd_pool::decode_to_prefill && l.decoding == 0) return pd_pool::prefill;
  return p;
}

prefill_choice place_prefill(int32_t prompt_tokens, const std::vector<pd_load>& loads,
                             const ttft_model& m, const pd_targets& t) {
  prefill_choice best_overall;
  double best_overall_ms = std::numeric_limits<double>::infinity();
  auto meets = [&](double ms) { return t.ttft_ms <= 0 || ms <= t.ttft_ms; };
  // Pool order of the report: P (with M) first, then D->P.
  for (bool flipping : {false, true}) {
    // Of those predicted to meet the target, the least loaded: a mixed
    // instance's decoding sequences count, so a prompt goes where it
    // slows the fewest streams, not merely where it waits least (which
    // piles prompts onto the instances that decode).
    const pd_load* best = nullptr;
    double best_ms = std::numeric_limits<double>::infinity();
    for (const auto& l : loads) {
      if (!l.serving || !takes_prefill(l.pool)) continue;
      if ((l.pool == pd_pool::decode_to_prefill) != flipping) continue;
      const double ms = predict_ttft_ms(l, prompt_tokens, m);
      if (ms < best_overall_ms) {
        best_overall_ms = ms;
        best_overall = {l.id, ms, false, ""};
      }
      if (!meets(ms)) continue;
      const int32_t free_pages = l.total_pages - l.used_pages;
      const int32_t best_free = best ? best->total_pages - best->used_pages : 0;
      if (!best || l.load_score() < best->load_score() ||
          (l.load_score() == best->load_score() &&
           (free_pages > best_free || (free_pages == best_free && ms < best_ms)))) {
        best = &l;
        best_ms = ms;
      }
    }
    if (best)
      return {best->id, best_ms, true,
              std::string(flipping ? "D->P" : to_string(best->pool)) +
                  " pool, least loaded of those predicted to meet the TTFT target"};
  }
  if (best_overall.instance == 0) {
    // No prefill instance serves (drained, lost): any serving instance
    // prefills rather than the request failing (not an E instance: it
    // runs no language work).
    const pd_load* any = nullptr;
    double any_ms = 0;
    for (const auto& l : loads) {
      if (!l.serving || l.pool == pd_pool::encode) continue;
      const double ms = predict_ttft_ms(l, prompt_tokens, m);
      if (!any || ms < any_ms) {
        any = &l;
        any_ms = ms;
      }
    }
    if (!any) return {0, 0, false, "no instance is serving"};
    return {any->id, any_ms, false, "no prefill instance serving: a decode instance prefills"};
  }
  best_overall.why = "no instance predicted to meet the TTFT target; lowest prediction";
  return best_overall;
}

namespace {

// The decode-taking instances other than `except`: the one with the
// fewest running tokens of those under the KV and step-time caps (null:
// none), and of all (`any`).
const pd_load* fewest_running_under_caps(const std::vector<pd_load>& loads, uint64_t except,
                                         int32_t context_tokens, const pd_config& c,
                                         const pd_targets& t, const pd_load** any) {
  const double step_cap = c.decode_step_cap_ms > 0 ? c.decode_step_cap_ms : t.tpot_ms;
  const pd_load* under = nullptr;
  for (const auto& l : loads) {
    if (!l.serving || !takes_decode(l.pool) || l.id == except) continue;
    auto fewer = [&](const pd_load* b) { return !b || l.running_tokens < b->running_tokens; };
    if (any && fewer(*any)) *any = &l;
    const int64_t capacity = int64_t(l.total_pages) * l.page_size;
    const int64_t need = kv_pages_for(context_tokens, l.page_size);
    const bool kv_ok =
        capacity <= 0 || double(l.used_pages + need) <= c.decode_kv_cap * l.total_pages;
    const bool step_ok = step_cap <= 0 || l.token_interval_ms <= step_cap;
    if (kv_ok && step_ok && fewer(under)) under = &l;
  }
  return under;
}

}  // namespace

decode_choice place_decode(uint64_t prefill_instance, int32_t context_tokens,
                           const std::vector<pd_load>& loads, const pd_config& c,
                           const pd_targets& t) {
  for (const auto& l : loads)
    if (l.id == prefill_instance && l.serving && takes_decode(l.pool))
      return {l.id, false, "the prefill instance decodes (no transfer)"};
  const pd_load* any = nullptr;
  // (The prefill instance does not take decode work here: excluding it changes nothing.)
  const pd_load* under = fewest_running_under_caps(loads, 0, context_tokens, c, t, &any);
  if (under) return {under->id, true, "D pool, fewest running tokens under the caps"};
  if (any) return {any->id, true, "D pool, fewest running tokens (every one over a cap)"};
  return {prefill_instance, false, "no decode instance: the prefill instance decodes"};
}

std::vector<uint64_t> plan_evacuation(uint64_t from, const std::vector<int32_t>& contexts,
                                      std::vector<pd_load> loads, const pd_config& c,
                                      const pd_targets& t) {
  std::vector<uint64_t> to;
  to.reserve(contexts.size());
  for (int32_t context : contexts) {
    const pd_load* d = fewest_running_under_caps(loads, from, context, c, t, nullptr);
    to.push_back(d ? d->id : 0);
    if (!d) continue;
    // Its KV and streams as they will be with this one.
    auto& l = loads[size_t(d - loads.data())];
    ++l.decoding;
    l.running_tokens += context;
    l.used_pages += kv_pages_for(context, l.page_size);
  }
  return to;
}

namespace {

bool cooling(const flip_memory& mem, uint64_t id, double now_s, const pd_config& c) {
  auto it = mem.last_flip_s.find(id);
  return it != mem.last_flip_s.end() && now_s - it->second < c.cooldown_s;
}

// The lightest instances of each pool in turn, not cooling down: at most
// `n`.
std::vector<const pd_load*> lightest(const std::vector<pd_load>& loads,
                                     std::initializer_list<pd_pool> pools, const flip_memory& mem,
                                     double now_s, const pd_config& c, int32_t n) {
  std::vector<const pd_load*> out;
  for (pd_pool pool : pools) {
    std::vector<const pd_load*> of;
    for (const auto& l : loads)
      if (l.serving && l.pool == pool && !cooling(mem, l.id, now_s, c)) of.push_back(&l);
    std::stable_sort(of.begin(), of.end(), [](const pd_load* a, const pd_load* b) {
      return a->tokens_in_process() < b->tokens_in_process();
    });
    for (const auto* l : of)
      if (int32_t(out.size()) < n) out.push_back(l);
  }
  return out;
}

}  // namespace

std::vector<flip_decision> decide_flips(const std::vector<pd_load>& loads, const pd_window& w,
                                        const pd_targets& t, const pd_config& c, double now_s,
                                        flip_memory& mem) {
  int32_t n_decode = 0, n_prefill = 0, n_mixed = 0;
  int64_t used = 0, total = 0, decoding = 0;
  double interval_sum = 0, mixed_interval_sum = 0, mixed_tpot_sum = 0, decode_tpot_sum = 0;
  int32_t interval_n = 0, mixed_interval_n = 0, mixed_tpot_n = 0, decode_tpot_n = 0;
  bool prefill_idle = true;
  for (const auto& l : loads) {
    if (!l.serving) continue;
    if (l.pool == pd_pool::mixed) {
      ++n_mixed;
      if (l.token_interval_ms > 0) {
        mixed_interval_sum += l.token_interval_ms;
        ++mixed_interval_n;
      }
      if (l.tpot_ms > 0) {
        mixed_tpot_sum += l.tpot_ms;
        ++mixed_tpot_n;
      }
    }
    if (l.pool == pd_pool::decode || l.pool == pd_pool::prefill_to_decode) {
      ++n_decode;
      used += l.used_pages;
      total += l.total_pages;
      decoding += l.decoding;
      if (l.token_interval_ms > 0) {
        interval_sum += l.token_interval_ms;
        ++interval_n;
      }
      if (l.tpot_ms > 0) {
        decode_tpot_sum += l.tpot_ms;
        ++decode_tpot_n;
      }
    }
    if (l.pool == pd_pool::prefill || l.pool == pd_pool::decode_to_prefill) {
      ++n_prefill;
      if (!l.queued_prefills.empty() || l.busy >= c.idle_busy) prefill_idle = false;
    }
  }

  // D -> P: prefill cannot meet TTFT.
  const bool want_prefill =
      w.unmet_prefills > 0 && double(w.unmet_prefills) >= c.miss_share * double(w.prefills);
  mem.to_prefill_streak = want_prefill ? mem.to_prefill_streak + 1 : 0;
  // P -> D: decode is slow, short of KV, or prefill idles while decode works.
  std::string decode_why;
  const double interval = interval_n > 0 ? interval_sum / interval_n : 0;
  const double decode_tpot = decode_tpot_sum / std::max(1, decode_tpot_n);
  if (t.tpot_ms > 0 && interval > t.tpot_ms)
    decode_why = "mean token interval " + std::to_string(int(std::lround(interval))) +
                 " ms over the TPOT target";
  else if (t.tpot_ms > 0 && decode_tpot_n > 0 && decode_tpot > t.tpot_ms)
    decode_why = "requests on decode instances averaged a TPOT of " +
                 std::to_string(int(std::lround(decode_tpot))) + " ms, over the target";
  else if (total > 0 && double(used) > c.kv_high * double(total))
    decode_why = "decode KV use over " + std::to_string(int(std::lround(c.kv_high * 100))) + "%";
  else if (n_prefill > 0 && prefill_idle && decoding > 0)
    decode_why = "prefill instances idle while decode works";
  mem.to_decode_streak = decode_why.empty() ? 0 : mem.to_decode_streak + 1;
  // Through M: decode with room to spare takes prefill work too (P -> M),
  // read from the window's decode steps; mixed instances whose requests
  // missed the TPOT target give prefill up (M -> P), read from the
  // requests themselves (a step's time says little of a stream's: one
  // long prefill step among many short ones is a slow step, not a slow
  // stream).  Not while prefills miss TTFT: a burst needs every
  // instance that prefills.
  const double decode_interval =
      (interval_sum + mixed_interval_sum) / std::max(1, interval_n + mixed_interval_n);
  const double mixed_tpot = mixed_tpot_sum / std::max(1, mixed_tpot_n);
  // Mixing is tried where decode meets the TPOT target, and goes on while
  // the requests that finished on mixed instances stay under mixed_slack
  // of it, or do no worse than those on decode instances: the streams
  // themselves say whether the prefills hurt.
  const bool mixed_fine = mixed_tpot_n == 0 || mixed_tpot < c.mixed_slack * t.tpot_ms ||
                          (decode_tpot_n > 0 && mixed_tpot <= decode_tpot);
  const bool slack = c.via_mixed && t.tpot_ms > 0 && n_prefill > 0 &&
                     interval_n + mixed_interval_n > 0 && decode_interval < t.tpot_ms && mixed_fine;
  const bool interfered = c.via_mixed && c.unmix && t.tpot_ms > 0 && mixed_tpot_n > 0 &&
                          mixed_tpot > t.tpot_ms && w.unmet_prefills == 0;
  // Through M: idle decode instances (nothing decoding, the device nearly
  // idle) earn their keep with prefill work mixed in; with the P
  // instances gone, nothing else would ever reach them.
  bool decode_idle = false;
  for (const auto& l : loads)
    if (c.via_mixed && l.serving && l.pool == pd_pool::decode && l.decoding == 0 &&
        l.busy < c.idle_busy)
      decode_idle = true;
  mem.decode_idle_streak = decode_idle ? mem.decode_idle_streak + 1 : 0;
  mem.slack_streak = slack ? mem.slack_streak + 1 : 0;
  mem.interfered_streak = interfered ? mem.interfered_streak + 1 : 0;

  // Through M, the instances that keep serving a kind count M too.
  const int32_t mixed_too = c.via_mixed ? n_mixed : 0;
  std::vector<flip_decision> out;
  // The role a trigger flips to: M through mixed, else its own.
  auto via = [&](instance_role to) { return c.via_mixed ? instance_role::mixed : to; };
  auto flip = [&](const std::vector<const pd_load*>& ls, instance_role to, const std::string& why) {
    for (const auto* l : ls) {
      mem.last_flip_s[l->id] = now_s;
      out.push_back({l->id, to, why});
    }
    mem.to_prefill_streak = 0;
    mem.to_decode_streak = 0;
    mem.slack_streak = 0;
    mem.interfered_streak = 0;
    mem.decode_idle_streak = 0;
    return out;
  };
  if (mem.to_prefill_streak >= c.violation_windows) {
    // The shortfall: prefill capacity grows by the share predicted to miss.
    const double share = double(w.unmet_prefills) / double(std::max(1, w.prefills));
    const int32_t want =
        std::max<int32_t>(1, int32_t(std::ceil(share * double(n_prefill + n_mixed) - 1e-9)));
    const int32_t spare = n_decode + mixed_too - c.min_decode;
    const int32_t n = std::min({want, std::max(1, c.max_flips), spare, n_decode});
    if (n > 0) {
      auto ls = lightest(loads, {pd_pool::prefill_to_decode, pd_pool::decode}, mem, now_s, c, n);
      if (!ls.empty())
        return flip(ls, via(instance_role::prefill),
                    std::to_string(w.unmet_prefills) + " of " + std::to_string(w.prefills) +
                        " prefills predicted to miss the TTFT target");
    }
  }
  if (mem.to_decode_streak >= c.violation_windows && n_prefill + mixed_too > c.min_prefill) {
    // Through M nothing is lost by a flip (a mixed instance prefills
    // still): as many as a window may.
    auto ls = lightest(loads, {pd_pool::decode_to_prefill, pd_pool::prefill}, mem, now_s, c,
                       c.via_mixed ? std::max(1, c.max_flips) : 1);
    if (!ls.empty()) return flip(ls, via(instance_role::decode), decode_why);
  }
  if (mem.slack_streak >= c.violation_windows) {
    // One first, to see what mixing does to the streams; then as many as
    // a window may flip while they say it does no harm.
    auto ls = lightest(loads, {pd_pool::decode_to_prefill, pd_pool::prefill}, mem, now_s, c,
                       mixed_tpot_n == 0 ? 1 : std::max(1, c.max_flips));
    if (!ls.empty())
      return flip(ls, instance_role::mixed,
                  mixed_tpot_n == 0
                      ? "decode steps of " + std::to_string(int(std::lround(decode_interval))) +
                            " ms meet the TPOT target: a prefill instance tries mixing"
                      : "requests on mixed instances averaged a TPOT of " +
                            std::to_string(int(std::lround(mixed_tpot))) +
                            " ms, with room under the target: prefill instances mix");
  }
  if (mem.decode_idle_streak >= c.violation_windows) {
    std::vector<const pd_load*> idle;
    for (const auto* l :
         lightest(loads, {pd_pool::decode}, mem, now_s, c, std::max(1, c.max_flips)))
      if (l->decoding == 0 && l->busy < c.idle_busy) idle.push_back(l);
    if (!idle.empty()) return flip(idle, instance_role::mixed, "decode instances idle");
  }
  if (mem.interfered_streak >= c.violation_windows && n_mixed > 1) {
    // Straight to P (not through the decode-side minimums: M keeps both).
    auto ls = lightest(loads, {pd_pool::mixed}, mem, now_s, c, 1);
    if (!ls.empty())
      return flip(ls, instance_role::prefill,
                  "requests on mixed instances averaged a TPOT of " +
                      std::to_string(int(std::lround(mixed_tpot))) +
                      " ms, over the target: one disaggregates");
  }
  return out;
}

}  // namespace troupe
