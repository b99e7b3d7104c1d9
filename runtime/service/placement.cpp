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

prefill_model::prefill_model(double forgetting) : lambda_(forgetting) {
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) p_[i][j] = i == j ? 1e6 : 0;
}

void prefill_model::observe(double tokens, double ms) {
  // Features scaled so L^2 and L are of similar size (L in thousands).
  const double l = tokens / 1000.0;
  const double x[3] = {l * l, l, 1.0};
  double px[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) px[i] += p_[i][j] * x[j];
  double denom = lambda_;
  for (int i = 0; i < 3; ++i) denom += x[i] * px[i];
  double k[3];
  for (int i = 0; i < 3; ++i) k[i] = px[i] / denom;
  double err = ms;
  for (int i = 0; i < 3; ++i) err -= theta_[i] * x[i];
  for (int i = 0; i < 3; ++i) theta_[i] += k[i] * err;
  double np[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) np[i][j] = (p_[i][j] - k[i] * px[j]) / lambda_;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) p_[i][j] = np[i][j];
  // Forgetting with inputs that do not vary (a steady load repeats the same
  // step shapes) makes P grow without bound until the update is all
  // rounding error (RLS "windup"; millions of steps in the simulator blew
  // predictions up).  Capping P's trace at its starting size keeps the
  // gain bounded.
  const double trace = p_[0][0] + p_[1][1] + p_[2][2];
  if (trace > 3e6 || !std::isfinite(trace)) {
    const double f = std::isfinite(trace) ? 3e6 / trace : 0;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j)
        p_[i][j] = std::isfinite(trace) ? p_[i][j] * f : (i == j ? 1e6 : 0);
  }
  ++samples_;
}

double prefill_model::predict_ms(double tokens) const {
  if (tokens <= 0) return 0;
  const double l = tokens / 1000.0;
  return std::max(0.0, theta_[0] * l * l + theta_[1] * l + theta_[2]);
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

// Pages after the first `from` that `s`'s KV store holds, continuing the run.
int32_t tier_run(const instance_snapshot& s, const std::vector<uint64_t>& hashes, int32_t from) {
  int32_t n = 0;
  for (size_t i = size_t(from); i < hashes.size() && s.tier_hashes.count(hashes[i]); ++i) ++n;
  return n;
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

int32_t held_run(const instance_snapshot& s, const std::vector<uint64_t>& hashes) {
  const int32_t dev = prefix_run(s, hashes);
  return dev + tier_run(s, hashes, dev);
}

kv_pull pick_kv_pull(const std::vector<uint64_t>& hashes, int32_t have,
                     const std::vector<const std::unordered_set<uint64_t>*>& stores,
                     double pull_ms_per_page, double compute_ms_per_page) {
  kv_pull out;
  for (size_t k = 0; k < stores.size(); ++k) {
    // The instance asks it for the pages after the ones it holds; a store
    // answers with the leading run of those.
    int32_t run = 0;
    while (size_t(have + run) < hashes.size() && stores[k]->count(hashes[size_t(have + run)]))
      ++run;
    if (run > out.pages) out = {int(k), run};
  }
  const bool worth =
      pull_ms_per_page <= 0 || compute_ms_per_page <= 0 || pull_ms_per_page < compute_ms_per_page;
  if (!worth) return {};
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
      // The prefill time one of this prompt's pages saves (the model's
      // marginal cost at its length).
      const double ps = std::max(1, req.page_size);
      const double compute = model.samples() == 0
                                 ? -1
                                 : model.predict_ms(req.prompt_tokens) -
                                       model.predict_ms(std::max(0.0, req.prompt_tokens - ps));
      double best_score = 0;
      std::vector<const instance_snapshot*> best;
      std::unordered_map<const instance_snapshot*, std::pair<int32_t, int32_t>> runs;
      for (const auto* s : up) {
        const int32_t dev = prefix_run(*s, req.page_hashes);
        const int32_t tier = tier_run(*s, req.page_hashes, dev);
        runs[s] = {dev, tier};
        const double score = dev + tier_weight(s->tier_load_ms_per_page, compute) * tier;
        if (score > best_score + 1e-9) best.clear(), best_score = score;
        if (std::abs(score - best_score) <= 1e-9) best.push_back(s);
      }
      const auto* s = least_loaded(best);
      const auto [dev, tier] = runs[s];
      out.prefix_pages = dev;
      std::string why = dev > 0 ? std::to_string(dev) + " cached prefix pages" : "";
      if (tier > 0) why += (why.empty() ? "" : " + ") + std::to_string(tier) + " in its KV store";
      return pick(s, (why.empty() ? "no cached prefix anywhere" : why) + ", " + load_text(*s));
    }
    case placement_policy::slo: {
      std::vector<const instance_snapshot*> meet;
      const instance_snapshot* fastest = nullptr;
      double fastest_ms = std::numeric_limits<double>::infinity();
      for (const auto* s : up) {
        const double t = model.predict_ms(double(s->queued_prefill_tokens)) +
                         model.predict_ms(double(req.prompt_tokens));
        if (t <= ttft_target_ms) meet.push_back(s);
        if (t < fastest_ms) fastest_ms = t, fastest = s;
      }
      const auto* s = meet.empty() ? fastest : least_loaded(meet);
      out.predicted_ttft_ms = model.predict_ms(double(s->queued_prefill_tokens)) +
                              model.predict_ms(double(req.prompt_tokens));
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
