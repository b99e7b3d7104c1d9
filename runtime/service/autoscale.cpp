#include "runtime/service/autoscale.hpp"

#include "runtime/config/settings.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace troupe {

void parse_autoscale_bounds(const std::string& text, autoscale_config& c) {
  if (auto why = check_autoscale(text); !why.empty())
    throw std::invalid_argument("--autoscale: " + why);
  const auto colon = text.find(':');
  c.min = std::stoi(text.substr(0, colon));
  c.max = std::stoi(text.substr(colon + 1));
}

autoscale_decision decide_autoscale(const autoscale_config& c,
                                    const std::vector<scaled_instance>& instances,
                                    double ttft_target_ms, double now_s, autoscale_memory& mem) {
  autoscale_decision d;
  const int32_t n = static_cast<int32_t>(instances.size());
  int64_t demand = 0, capacity = 0, per = 1;
  bool slow = false;
  for (const auto& i : instances) {
    demand += i.running + i.waiting;
    capacity += std::max(1, i.max_seqs);
    per = std::max<int64_t>(per, i.max_seqs);
    if (!i.starting && ttft_target_ms > 0 && i.ttft_ms > ttft_target_ms) slow = true;
  }
  char buf[160];
  // Below the floor (an instance lost): back to it at once.
  if (n < c.min) {
    d.grow = c.min - n;
    std::snprintf(buf, sizeof buf, "%d instances, below the minimum %d", n, c.min);
    d.why = buf;
    mem.last_grow_s = now_s;
    return d;
  }
  const double load = capacity > 0 ? double(demand) / double(capacity) : 0;
  if ((load > c.grow_load || slow) && n < c.max && now_s - mem.last_grow_s >= c.grow_cooldown_s) {
    // Enough to bring the load to grow_load, at least one.
    const double want = std::ceil(double(demand) / (c.grow_load * double(per)));
    d.grow = std::clamp<int32_t>(static_cast<int32_t>(want) - n, 1, c.max - n);
    std::snprintf(buf, sizeof buf, "load %.2f of capacity%s: %d -> %d instances", load,
                  slow ? ", TTFT over target" : "", n, n + d.grow);
    d.why = buf;
    mem.last_grow_s = now_s;
    return d;
  }
  if (load < c.shrink_load && n > c.min && !slow &&
      now_s - mem.last_shrink_s >= c.shrink_cooldown_s &&
      now_s - mem.last_grow_s >= c.shrink_cooldown_s) {
    // The least-loaded serving instance goes, if the rest stay below grow_load.
    // One serving instance always stays (the others may still be starting).
    const scaled_instance* victim = nullptr;
    int32_t serving = 0;
    for (const auto& i : instances) {
      if (i.starting) continue;
      ++serving;
      if (!i.retirable) continue;
      if (!victim || i.running + i.waiting < victim->running + victim->waiting) victim = &i;
    }
    if (!victim || serving < 2) return d;
    const int64_t rest = capacity - std::max(1, victim->max_seqs);
    if (rest <= 0 || double(demand) / double(rest) >= c.grow_load) return d;
    d.retire = victim->id;
    std::snprintf(buf, sizeof buf, "load %.2f of capacity: retire instance %llu (%d -> %d)", load,
                  static_cast<unsigned long long>(victim->id), n, n - 1);
    d.why = buf;
    mem.last_shrink_s = now_s;
  }
  return d;
}

}  // namespace troupe
