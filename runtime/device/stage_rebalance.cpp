#include "runtime/device/stage_rebalance.hpp"

namespace troupe {

stage_rebalance_move plan_stage_rebalance(const stage_rebalance_inputs& in,
                                          const layer_migration_options& o) {
  stage_rebalance_move m;
  const auto& h = in.load;
  const auto& stages = h.stages;
  if (!(o.threshold > 0) || stages.size() < 2) return m;
  const bool cooling = in.windows_since_move < o.cooldown_windows;
  if (in.away) {
    const auto& a = *in.away;
    const auto d = static_cast<size_t>(a.donor), p = static_cast<size_t>(a.helper);
    // A helper overloaded now (the load shifted) is relieved at once; a
    // home that pays by the estimate waits out the cooldown as moves do.
    if (d < stages.size() && p < stages.size() &&
        (stages[p].busy_s > stages[d].busy_s * (1 + o.threshold) ||
         (!cooling && head_group_pays_home(h, a.donor, a.helper, a.heads, o))))
      m.heads_home = true;
    return m;
  }
  if (cooling) return m;
  if (in.layers) {
    m.layers = plan_layer_move(stages, o);
    if (m.layers) return m;
  }
  if (in.heads) m.heads = plan_head_move(h, o);
  return m;
}

}  // namespace troupe
