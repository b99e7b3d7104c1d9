#include "actors/kv_disk.hpp"

#include <memory>

#include "runtime/kvstore/disk_tier.hpp"

namespace troupe {

namespace {

kv_disk_actor::behavior_type kv_disk_behavior(kv_disk_actor::pointer,
                                              std::shared_ptr<disk_tier> tier) {
  return {
      [tier](kv_put_atom, const std::vector<kv_page>& pages) { tier->put(pages); },
      [tier](kv_fetch_atom, uint64_t space, const std::vector<uint64_t>& hashes) {
        return tier->read_run(space, hashes);
      },
      [tier](stats_atom) { return tier->stats(); },
  };
}

}  // namespace

kv_disk_actor spawn_kv_disk(caf::actor_system& sys, const std::string& dir, uint64_t budget_bytes,
                            tier_eviction policy) {
  // Opened here, so a folder that cannot be used fails the caller at once.
  auto tier = std::make_shared<disk_tier>(dir, budget_bytes, policy);
  return sys.spawn<caf::detached>(kv_disk_behavior, std::move(tier));
}

}  // namespace troupe
