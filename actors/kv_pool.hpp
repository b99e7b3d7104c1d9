#pragma once
// The kv_pool actor: the KV store of one process that hosts instances
// (docs/architecture.md §4.10 "The KV store"): the host-memory tier
// (runtime/kvstore/memory_tier) and, when configured, a kv_disk actor
// below it for the disk tier.  Thin and event-based: puts and host hits
// are memory operations; what the disk must answer comes back as a
// message.
#include <cstdint>
#include <string>

#include "messages/kv_pool.hpp"
#include "runtime/kvstore/tier_policy.hpp"

namespace troupe {

struct kv_store_options {
  uint64_t host_bytes = 0;  // the host tier's budget; 0: no store
  std::string disk_dir;     // the disk tier's folder; empty: no disk tier
  uint64_t disk_bytes = 0;  // the disk tier's budget
  tier_eviction policy = tier_eviction::lru;
  bool enabled() const { return host_bytes > 0 || !disk_dir.empty(); }
};

// One per process that hosts instances (troupe serve spawns it beside its
// local instances, a node's spawner with its first instance), handed to
// each instance.  Throws std::runtime_error when the disk folder cannot be
// used.
kv_pool_actor spawn_kv_pool(caf::actor_system& sys, const kv_store_options& opts);

}  // namespace troupe
