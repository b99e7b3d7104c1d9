#include "runtime/service/pd_policy.hpp"

#include <algorithm>
#include <cmath>
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
  }
  return "?";
}

std::optional<instance_role> parse_role(std::string_view s) {
  if (s == "mixed") return instance_role::mixed;
  if (s == "prefill") return instance_role::prefill;
  if (s == "decode") return instance_role::decode;
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
  }
  return "?";
}

pd_pool pool_of(instance_role r) {
  switch (r) {
    case instance_role::prefill:
      return pd_pool::prefill;
    case instance_role::decode:
      return pd_pool::decode;
    case instance_role::mixed:
      break;
  }
  return pd_pool::mixed;
}

instance_role pd_start_role(const std::vector<instance_role>& roles, size_t index) {
  if (index < roles.size()) return roles[index];
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
    case pd_pool::mixed:
      break;
  }
  return instance_role::mixed;
}

pd_pool flip_pool(pd_pool from, instance_role to) {
  if (to == instance_role::mixed) return pd_pool::mixed;  // takes both at once
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

double predicted_ttft_ms(const pd_load& l, int32_t prompt_tokens, const prefill_model& m) {
  double ms = m.predict_ms(prompt_tokens);
  for (int32_t q : l.queued_prefills) ms += m.predict_ms(q);
  return ms;
}

prefill_choice place_prefill(int32_t prompt_tokens, const std::vector<pd_load>& loads,
                             const prefill_model& m, const pd_targets& t) {
  prefill_choice best_overall;
  double best_overall_ms = std::numeric_limits<double>::infinity();
  auto meets = [&](double ms) { return t.ttft_ms <= 0 || ms <= t.ttft_ms; };
  // Pool order of the report: P (with M) first, then D->P.
  for (bool flipping : {false, true}) {
    const pd_load* best = nullptr;
    double best_ms = std::numeric_limits<double>::infinity();
    for (const auto& l : loads) {
      if (!l.serving || !takes_prefill(l.pool)) continue;
      if ((l.pool == pd_pool::decode_to_prefill) != flipping) continue;
      const double ms = predicted_ttft_ms(l, prompt_tokens, m);
      if (ms < best_ms ||
          (ms == best_ms && best && l.tokens_in_process() < best->tokens_in_process())) {
        best = &l;
        best_ms = ms;
      }
      if (ms < best_overall_ms) {
        best_overall_ms = ms;
        best_overall = {l.id, ms, false, ""};
      }
    }
    if (best && meets(best_ms))
      return {best->id, best_ms, true,
              std::string(flipping ? "D->P" : to_string(best->pool)) +
                  " pool, least predicted queueing"};
  }
  if (best_overall.instance == 0) {
    // No prefill instance serves (drained, lost): any serving instance
    // prefills rather than the request failing.
    const pd_load* any = nullptr;
    double any_ms = 0;
    for (const auto& l : loads) {
      if (!l.serving) continue;
      const double ms = predicted_ttft_ms(l, prompt_tokens, m);
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

decode_choice place_decode(uint64_t prefill_instance, int32_t context_tokens,
                           const std::vector<pd_load>& loads, const pd_config& c,
                           const pd_targets& t) {
  for (const auto& l : loads)
    if (l.id == prefill_instance && l.serving && takes_decode(l.pool))
      return {l.id, false, "the prefill instance decodes (no transfer)"};
  const double step_cap = c.decode_step_cap_ms > 0 ? c.decode_step_cap_ms : t.tpot_ms;
  const pd_load* under = nullptr;
  const pd_load* any = nullptr;
  for (const auto& l : loads) {
    if (!l.serving || !takes_decode(l.pool)) continue;
    auto fewer = [&](const pd_load* b) { return !b || l.running_tokens < b->running_tokens; };
    if (fewer(any)) any = &l;
    const int64_t capacity = int64_t(l.total_pages) * l.page_size;
    const int64_t need = (context_tokens + l.page_size - 1) / std::max(1, l.page_size);
    const bool kv_ok =
        capacity <= 0 || double(l.used_pages + need) <= c.decode_kv_cap * l.total_pages;
    const bool step_ok = step_cap <= 0 || l.token_interval_ms <= step_cap;
    if (kv_ok && step_ok && fewer(under)) under = &l;
  }
  if (under) return {under->id, true, "D pool, fewest running tokens under the caps"};
  if (any) return {any->id, true, "D pool, fewest running tokens (every one over a cap)"};
  return {prefill_instance, false, "no decode instance: the prefill instance decodes"};
}

namespace {

bool cooling(const flip_memory& mem, uint64_t id, double now_s, const pd_config& c) {
  auto it = mem.last_flip_s.find(id);
  return it != mem.last_flip_s.end() && now_s - it->second < c.cooldown_s;
}

// The lightest instance of `first`, else of `second`, not cooling down.
const pd_load* lightest(const std::vector<pd_load>& loads, pd_pool first, pd_pool second,
                        const flip_memory& mem, double now_s, const pd_config& c) {
  for (pd_pool pool : {first, second}) {
    const pd_load* best = nullptr;
    for (const auto& l : loads)
      if (l.serving && l.pool == pool && !cooling(mem, l.id, now_s, c) &&
          (!best || l.tokens_in_process() < best->tokens_in_process()))
        best = &l;
    if (best) return best;
  }
  return nullptr;
}

}  // namespace

std::optional<flip_decision> decide_flip(const std::vector<pd_load>& loads, const pd_window& w,
                                         const pd_targets& t, const pd_config& c, double now_s,
                                         flip_memory& mem) {
  int32_t n_decode = 0, n_prefill = 0;
  int64_t used = 0, total = 0, decoding = 0;
  double interval_sum = 0;
  int32_t interval_n = 0;
  bool prefill_idle = true;
  for (const auto& l : loads) {
    if (!l.serving) continue;
    if (l.pool == pd_pool::decode || l.pool == pd_pool::prefill_to_decode) {
      ++n_decode;
      used += l.used_pages;
      total += l.total_pages;
      decoding += l.decoding;
      if (l.token_interval_ms > 0) {
        interval_sum += l.token_interval_ms;
        ++interval_n;
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
  if (t.tpot_ms > 0 && interval > t.tpot_ms)
    decode_why = "mean token interval " + std::to_string(int(std::lround(interval))) +
                 " ms over the TPOT target";
  else if (total > 0 && double(used) > c.kv_high * double(total))
    decode_why = "decode KV use over " + std::to_string(int(std::lround(c.kv_high * 100))) + "%";
  else if (n_prefill > 0 && prefill_idle && decoding > 0)
    decode_why = "prefill instances idle while decode works";
  mem.to_decode_streak = decode_why.empty() ? 0 : mem.to_decode_streak + 1;

  auto flip = [&](const pd_load* l, instance_role to, std::string why) {
    mem.last_flip_s[l->id] = now_s;
    mem.to_prefill_streak = 0;
    mem.to_decode_streak = 0;
    return flip_decision{l->id, to, std::move(why)};
  };
  if (mem.to_prefill_streak >= c.violation_windows && n_decode > c.min_decode) {
    if (const pd_load* l =
            lightest(loads, pd_pool::prefill_to_decode, pd_pool::decode, mem, now_s, c))
      return flip(l, instance_role::prefill,
                  std::to_string(w.unmet_prefills) + " of " + std::to_string(w.prefills) +
                      " prefills predicted to miss the TTFT target");
  }
  if (mem.to_decode_streak >= c.violation_windows && n_prefill > c.min_prefill) {
    if (const pd_load* l =
            lightest(loads, pd_pool::decode_to_prefill, pd_pool::prefill, mem, now_s, c))
      return flip(l, instance_role::decode, decode_why);
  }
  return std::nullopt;
}

}  // namespace troupe
