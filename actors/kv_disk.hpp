#pragma once
// The kv_disk actor: the KV store's disk tier (runtime/kvstore/disk_tier)
// behind the kv_disk protocol (messages/kv_pool.hpp).  Detached: its file
// reads and writes block its own thread, never CAF's scheduler.  Its
// kv_pool is its only client.
#include <cstdint>
#include <string>

#include "messages/kv_pool.hpp"
#include "runtime/kvstore/tier_policy.hpp"

namespace troupe {

// Opens (creating) the folder and indexes the pages a previous run left
// there; throws std::runtime_error when the folder cannot be used.
kv_disk_actor spawn_kv_disk(caf::actor_system& sys, const std::string& dir, uint64_t budget_bytes,
                            tier_eviction policy);

}  // namespace troupe
