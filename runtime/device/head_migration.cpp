#include "runtime/device/head_migration.hpp"

#include <algorithm>

namespace troupe {

double attention_share(int n_embd, int n_head, int n_kv, int head_dim, int n_ff, double context) {
  const double att = 2.0 * n_head * head_dim * std::max(context, 0.0);
  const double weights = static_cast<double>(n_embd) * (n_head + 2 * n_kv) * head_dim +
                         static_cast<double>(n_head) * head_dim * n_embd +
                         3.0 * n_embd * static_cast<double>(n_ff);
  return att + weights > 0 ? att / (att + weights) : 0.0;
}

std::optional<head_move_plan> plan_head_move(const head_move_inputs& in,
                                             const layer_migration_options& o) {
  const auto& s = in.stages;
  const size_t n = s.size();
  if (n < 2 || in.n_kv < 2 || in.steps <= 0 || !(in.attention_share > 0)) return std::nullopt;
  double total = 0;
  size_t donor = 0, helper = 0;
  for (size_t i = 0; i < n; ++i) {
    if (s[i].layers <= 0 || !(s[i].busy_s >= 0)) return std::nullopt;
    total += s[i].busy_s;
    if (s[i].busy_s > s[donor].busy_s) donor = i;
    if (s[i].busy_s < s[helper].busy_s) helper = i;
  }
  const double slowest = s[donor].busy_s, mean = total / static_cast<double>(n);
  if (!(mean > 0) || slowest <= mean * (1 + o.threshold) || donor == helper) return std::nullopt;
  double others = 0;
  for (size_t i = 0; i < n; ++i)
    if (i != donor && i != helper) others = std::max(others, s[i].busy_s);
  const auto& d = s[donor];
  const auto& h = s[helper];
  // The helper's time for work that takes the donor one second.
  const double speed = h.busy_s > 0 ? (h.busy_s / h.layers) / (d.busy_s / d.layers) : 1.0;
  const double attention = in.attention_share * d.busy_s;
  const double waits = in.trip_s * d.layers * static_cast<double>(in.steps);
  std::optional<head_move_plan> best;
  for (int32_t g = 1; g < in.n_kv; ++g) {
    const double moved = attention * g / in.n_kv;
    const double after = std::max({others, d.busy_s - moved + waits, h.busy_s + moved * speed});
    const double gain = (slowest - after) / slowest;
    if (!best || gain > best->gain + 1e-12)
      best = head_move_plan{static_cast<int32_t>(donor), static_cast<int32_t>(helper), g, gain};
  }
  if (!best || best->gain < o.min_gain) return std::nullopt;
  if (best->gain * o.horizon_s < head_move_pause_s(o, d.layers, best->heads, in.n_kv))
    return std::nullopt;
  return best;
}

bool head_group_pays_home(const head_move_inputs& in, int32_t donor, int32_t helper, int32_t heads,
                          const layer_migration_options& o) {
  const auto& s = in.stages;
  const auto n = static_cast<int32_t>(s.size());
  if (donor < 0 || donor >= n || helper < 0 || helper >= n || donor == helper || heads <= 0 ||
      heads >= in.n_kv)
    return false;
  const double d = s[static_cast<size_t>(donor)].busy_s, h = s[static_cast<size_t>(helper)].busy_s;
  double others = 0;
  for (int32_t i = 0; i < n; ++i)
    if (i != donor && i != helper) others = std::max(others, s[static_cast<size_t>(i)].busy_s);
  const double waits =
      in.trip_s * s[static_cast<size_t>(donor)].layers * static_cast<double>(in.steps);
  const double work = std::max(0.0, d - waits);
  const double own = in.attention_share * work;  // its n_kv - heads heads' attention
  const double group = std::min(h, own * heads / (in.n_kv - heads));
  const double now = std::max({others, d, h});
  const double home = std::max({others, work + group, h - group});
  return now > 0 && (now - home) / now >= o.min_gain;
}

}  // namespace troupe
