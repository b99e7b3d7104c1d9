#include "runtime/service/rebalance.hpp"

#include <algorithm>

namespace troupe {

std::vector<rebalance_move> plan_rebalance(const std::vector<rebalance_load>& loads,
                                           int32_t max_seqs) {
  std::vector<rebalance_move> out;
  if (max_seqs < 1) return out;
  int64_t room = 0;
  std::vector<const rebalance_load*> full;
  for (const auto& l : loads) {
    if (!l.serving) continue;
    if (l.running >= max_seqs && l.waiting > 0)
      full.push_back(&l);
    else if (l.waiting == 0)
      room += std::max(0, max_seqs - l.running);
  }
  std::stable_sort(full.begin(), full.end(), [](const rebalance_load* a, const rebalance_load* b) {
    return a->waiting > b->waiting;
  });
  for (const auto* l : full) {
    if (room <= 0) break;
    const auto n = static_cast<int32_t>(std::min<int64_t>(l->waiting, room));
    out.push_back({l->id, n});
    room -= n;
  }
  return out;
}

}  // namespace troupe
