#include "runtime/device/stage_rebalance.hpp"

namespace troupe {

rebalance_move plan_rebalance(const rebalance_inputs& in, const layer_migration_options& o) {
  rebalance_move m;
  if (!(o.threshold > 0) || in.stages.size() < 2) return m;
  if (in.away) {
    const auto d = static_cast<size_t>(in.away->donor), h = static_cast<size_t>(in.away->helper);
    if (d < in.stages.size() && h < in.stages.size() &&
        in.stages[h].busy_s > in.stages[d].busy_s * (1 + o.threshold))
      m.heads_home = true;
    return m;
  }
  if (in.layers) {
    m.layers = plan_layer_move(in.stages, o);
    if (m.layers) return m;
  }
  if (in.heads) {
    head_move_inputs h;
    h.stages = in.stages;
    h.n_kv = in.n_kv;
    h.attention_share = in.attention_share;
    h.trip_s = in.trip_s;
    h.steps = in.steps;
    m.heads = plan_head_move(h, o);
  }
  return m;
}

}  // namespace troupe
