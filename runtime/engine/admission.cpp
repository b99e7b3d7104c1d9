#include "runtime/engine/admission.hpp"

namespace troupe {

const char* to_string(batching_mode m) {
  return m == batching_mode::continuous ? "continuous" : "static";
}

std::optional<batching_mode> parse_batching_mode(std::string_view name) {
  if (name == "continuous") return batching_mode::continuous;
  if (name == "static") return batching_mode::static_batches;
  return std::nullopt;
}

std::vector<uint64_t> admission_order(const std::vector<admission_candidate>& waiting,
                                      const admission_policy& p, admission_state& state,
                                      const std::function<bool(uint64_t)>& alive) {
  for (auto it = state.batch.begin(); it != state.batch.end();)
    it = alive(*it) ? std::next(it) : state.batch.erase(it);
  const bool gated = p.mode == batching_mode::static_batches;
  if (!gated && !p.order) {
    std::vector<uint64_t> all;
    for (const auto& c : waiting) all.push_back(c.key);
    return all;
  }
  // Started sequences first, by arrival; then the new ones.  Only the
  // oldest k_admission_window new ones are planned (a step plans again
  // each time; SLO-ODBS's first fit grows with the queue squared); the
  // rest follow in arrival order.
  std::vector<uint64_t> out, beyond;
  std::vector<batch_candidate> fresh;
  for (const auto& c : waiting) {
    if (c.started)
      out.push_back(c.key);
    else if (gated && !state.batch.empty() && !state.batch.count(c.key))
      continue;
    else if (fresh.size() < k_admission_window)
      fresh.push_back({c.key, c.slo_s, c.predicted_tokens});
    else if (!gated)
      beyond.push_back(c.key);
  }
  if (fresh.empty()) return out;
  auto batches = plan_batches(fresh, p.order.value_or(batch_order::fifo), p.odbs);
  // Static, with no batch running: the plan's first batch becomes it.
  // (With one running, `fresh` holds its members not yet admitted.)
  if (gated && state.batch.empty()) {
    batches.resize(1);
    state.batch.insert(batches.front().begin(), batches.front().end());
    ++state.formed;
  }
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  out.insert(out.end(), beyond.begin(), beyond.end());  // empty when gated
  return out;
}

}  // namespace troupe
