#include "runtime/service/placement.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <utility>

namespace troupe {

const char* to_string(placement_policy p) {
  switch (p) {
    case placement_policy::round_robin:
      return "round-robin";
    case placement_policy::least_load:
      return "least-load";
    case placement_policy::prefix:
      return "prefix";
    case placement_policy::slo:
      return "slo";
    case placement_policy::load_aware:
      return "load-aware";
  }
  return "?";
}

std::optional<placement_policy> parse_placement_policy(std::string_view name) {
  for (auto p : {placement_policy::round_robin, placement_policy::least_load,
                 placement_policy::prefix, placement_policy::slo, placement_policy::load_aware})
    if (name == to_string(p)) return p;
  return std::nullopt;
}

prefill_model::prefill_model(double forgetting) : fit_(forgetting) {}

// Features scaled so L^2 and L are of similar size (L in thousands).
void prefill_model::observe(double tokens, double ms) {
  const double l = tokens / 1000.0;
  fit_.observe({l * l, l, 1.0}, ms);
}

double prefill_model::predict_ms(double tokens) const {
  if (tokens <= 0) return 0;
  const double l = tokens / 1000.0;
  return std::max(0.0, fit_.predict({l * l, l, 1.0}));
}

double compute_ms_per_page(double prompt_tokens, int32_t page_size, const prefill_model& model) {
  if (model.samples() == 0) return -1;
  const double ps = std::max(1, page_size);
  return model.predict_ms(prompt_tokens) - model.predict_ms(std::max(0.0, prompt_tokens - ps));
}

double tier_weight(double load_ms_per_page, double compute_ms_per_page) {
  if (load_ms_per_page < 0 || compute_ms_per_page <= 0) return 0.5;
  return std::clamp(1.0 - load_ms_per_page / compute_ms_per_page, 0.0, 1.0);
}

int64_t load_score(const instance_snapshot& s) {
  return 4 * int64_t(s.waiting) + s.running;
}

namespace {

// Leading pages of `hashes` that `s` holds (a prefix run: the first miss ends it).
int32_t prefix_run(const instance_snapshot& s, const std::vector<uint64_t>& hashes) {
  int32_t n = 0;
  for (uint64_t h : hashes) {
    if (!s.prefix_hashes.count(h)) break;
    ++n;
  }
  return n;
}

// What a page from the host and from the disk tier is worth against one in
// the arena (tier_weight); an unmeasured disk page is worth no more than a
// host page, nor more than half.
struct tier_weights {
  double host = 0.5, disk = 0.5;
};
tier_weights weights_of(const instance_snapshot& s, double compute_ms_per_page) {
  tier_weights w;
  w.host = tier_weight(s.tier_load_ms_per_page, compute_ms_per_page);
  w.disk = s.disk_load_ms_per_page >= 0 ? tier_weight(s.disk_load_ms_per_page, compute_ms_per_page)
                                        : std::min(0.5, w.host);
  return w;
}

// The slo policy's prediction for `s`: its queued prefill work, then this
// prompt's rows past the pages it holds, plus loading its store's pages
// (at their measured cost; unmeasured: free).
double predicted_ms(const instance_snapshot& s, const placement_request& req,
                    const prefill_model& model) {
  const auto held = held_by(s, req.page_hashes);
  const double rows =
      std::max(1.0, double(req.prompt_tokens) - double(held.total()) * std::max(1, req.page_size));
  return model.predict_ms(double(s.queued_prefill_tokens)) + model.predict_ms(rows) +
         held.host * std::max(0.0, s.tier_load_ms_per_page) +
         held.disk * std::max(0.0, s.disk_load_ms_per_page);
}

const instance_snapshot* least_loaded(const std::vector<const instance_snapshot*>& c) {
  const instance_snapshot* best = nullptr;
  for (const auto* s : c)
    if (!best || load_score(*s) < load_score(*best) ||
        (load_score(*s) == load_score(*best) && s->free_pages > best->free_pages))
      best = s;
  return best;
}

std::string load_text(const instance_snapshot& s) {
  return "load 4x" + std::to_string(s.waiting) + "+" + std::to_string(s.running) + "=" +
         std::to_string(load_score(s));
}

std::string fixed2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

// Algorithm 4-2: the least by (U, queue length, id) while its U is below
// the threshold, else the shortest queue (ties by U, then id).
placement load_aware_pick(const std::vector<const instance_snapshot*>& up,
                          const prefill_model& model, double ttft_target_ms) {
  struct ranked {
    const instance_snapshot* s;
    utilisation u;
  };
  std::vector<ranked> r;
  for (const auto* s : up) r.push_back({s, utilisation_of(*s, model, ttft_target_ms)});
  auto by_load = [](const ranked& a, const ranked& b) {
    if (a.u.total() != b.u.total()) return a.u.total() < b.u.total();
    if (a.s->waiting != b.s->waiting) return a.s->waiting < b.s->waiting;
    return a.s->instance < b.s->instance;
  };
  const ranked* best = &*std::min_element(r.begin(), r.end(), by_load);
  const bool busy = best->u.total() >= load_aware_threshold;
  if (busy)
    best = &*std::min_element(r.begin(), r.end(), [&](const ranked& a, const ranked& b) {
      if (a.s->waiting != b.s->waiting) return a.s->waiting < b.s->waiting;
      return by_load(a, b);
    });
  placement out;
  out.instance = best->s->instance;
  out.why =
      std::string("load-aware: U ") + fixed2(best->u.total()) + " (memory " +
      fixed2(best->u.memory) + " + compute " + fixed2(best->u.compute) + "), " +
      std::to_string(best->s->waiting) + " waiting" +
      (busy ? ", every instance at U >= " + fixed2(load_aware_threshold) + ": the shortest queue"
            : "");
  return out;
}

}  // namespace

utilisation utilisation_of(const instance_snapshot& s, const prefill_model& model,
                           double ttft_target_ms) {
  utilisation u;
  if (s.total_pages > 0)
    u.memory = std::clamp(1.0 - double(s.free_pages) / s.total_pages, 0.0, 1.0);
  if (ttft_target_ms > 0 && s.queued_prefill_tokens > 0)
    u.compute =
        std::clamp(model.predict_ms(double(s.queued_prefill_tokens)) / ttft_target_ms, 0.0, 1.0);
  return u;
}

held_pages held_by(const instance_snapshot& s, const std::vector<uint64_t>& hashes) {
  held_pages out;
  out.device = prefix_run(s, hashes);
  for (size_t i = size_t(out.device); i < hashes.size(); ++i) {
    if (s.tier_hashes.count(hashes[i]))
      ++out.host;
    else if (s.disk_hashes.count(hashes[i]))
      ++out.disk;
    else
      break;
  }
  return out;
}

int32_t held_run(const instance_snapshot& s, const std::vector<uint64_t>& hashes) {
  return held_by(s, hashes).total();
}

int32_t run_after(const std::unordered_set<uint64_t>& store, const std::vector<uint64_t>& hashes,
                  int32_t have) {
  int32_t run = 0;
  while (size_t(have + run) < hashes.size() && store.count(hashes[size_t(have + run)])) ++run;
  return run;
}

kv_pull pick_kv_pull(const std::vector<int32_t>& runs, const std::vector<double>& pull_ms_per_page,
                     double compute_ms_per_page) {
  kv_pull out;
  double best = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    if (runs[k] <= 0) continue;
    const double pull = k < pull_ms_per_page.size() ? pull_ms_per_page[k] : -1;
    double saved_per_page = 1;  // compute time unknown: runs compare by length
    if (compute_ms_per_page > 0)
      saved_per_page = pull >= 0 ? compute_ms_per_page - pull : compute_ms_per_page / 2;
    const double saved = runs[k] * saved_per_page;
    if (saved > best) {
      best = saved;
      out = {int(k), runs[k]};
    }
  }
  return out;
}

placement place(placement_policy policy, const placement_request& req,
                const std::vector<instance_snapshot>& instances, placement_cursor& cursor,
                const prefill_model& model, double ttft_target_ms) {
  std::vector<const instance_snapshot*> up;
  for (const auto& s : instances)
    if (s.serving) up.push_back(&s);
  placement out;
  if (up.empty()) {
    out.why = "no serving instance";
    return out;
  }
  auto pick = [&](const instance_snapshot* s, std::string why) {
    out.instance = s->instance;
    out.why = std::string(to_string(policy)) + ": " + std::move(why);
    return out;
  };
  switch (policy) {
    case placement_policy::round_robin: {
      const auto* s = up[cursor.next++ % up.size()];
      return pick(s, "turn of instance " + std::to_string(s->instance));
    }
    case placement_policy::least_load: {
      const auto* s = least_loaded(up);
      return pick(s, load_text(*s));
    }
    case placement_policy::prefix: {
      const double compute = compute_ms_per_page(req.prompt_tokens, req.page_size, model);
      double best_score = 0;
      std::vector<const instance_snapshot*> best;
      std::unordered_map<const instance_snapshot*, held_pages> runs;
      for (const auto* s : up) {
        const auto held = held_by(*s, req.page_hashes);
        runs[s] = held;
        const auto w = weights_of(*s, compute);
        const double score = held.device + w.host * held.host + w.disk * held.disk;
        if (score > best_score + 1e-9) best.clear(), best_score = score;
        if (std::abs(score - best_score) <= 1e-9) best.push_back(s);
      }
      const auto* s = least_loaded(best);
      const auto held = runs[s];
      out.prefix_pages = held.device;
      std::string why = held.device > 0 ? std::to_string(held.device) + " cached prefix pages" : "";
      const int32_t tier = held.host + held.disk;
      if (tier > 0) {
        why += (why.empty() ? "" : " + ") + std::to_string(tier) + " in its KV store";
        if (held.disk > 0) why += " (" + std::to_string(held.disk) + " on disk)";
      }
      return pick(s, (why.empty() ? "no cached prefix anywhere" : why) + ", " + load_text(*s));
    }
    case placement_policy::slo: {
      std::vector<const instance_snapshot*> meet;
      const instance_snapshot* fastest = nullptr;
      double fastest_ms = std::numeric_limits<double>::infinity();
      for (const auto* s : up) {
        const double t = predicted_ms(*s, req, model);
        if (t <= ttft_target_ms) meet.push_back(s);
        if (t < fastest_ms) fastest_ms = t, fastest = s;
      }
      const auto* s = meet.empty() ? fastest : least_loaded(meet);
      out.predicted_ttft_ms = predicted_ms(*s, req, model);
      out.prefix_pages = held_by(*s, req.page_hashes).device;
      char t_ms[32];
      std::snprintf(t_ms, sizeof t_ms, "%.1f", out.predicted_ttft_ms);
      const std::string t = "predicted TTFT " + std::string(t_ms) + " ms (target " +
                            std::to_string(int64_t(ttft_target_ms)) + ")";
      return pick(s, meet.empty() ? t + ", none meets it: the fastest" : t + ", " + load_text(*s));
    }
    case placement_policy::load_aware:
      return load_aware_pick(up, model, ttft_target_ms);
  }
  return out;
}

}  // namespace troupe
