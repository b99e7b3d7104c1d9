#pragma once
// The kv_pool actor: owns the page metadata of one device KV arena (a
// page_pool) and answers the kv_pool protocol (messages/kv_pool.hpp).  Thin
// and event-based: every handler is a page_pool call, without blocking.
#include <memory>

#include "messages/kv_pool.hpp"
#include "runtime/engine/page_pool.hpp"

namespace troupe {

struct kv_pool_state {
  std::unique_ptr<page_pool> pool;
  static inline const char* name = "kv_pool";
};

// The behavior, for spawn_kv_pool.  Throws
// std::invalid_argument for a bad geometry (n_pages < 0, page_size <= 0).
kv_pool_actor::behavior_type kv_pool_behavior(kv_pool_actor::stateful_pointer<kv_pool_state> self,
                                              int n_pages, int page_size, uint64_t salt);

// Checks the geometry before any actor exists (std::invalid_argument), then
// spawns the pool.  `salt` is the model's fingerprint (fingerprint_salt).
kv_pool_actor spawn_kv_pool(caf::actor_system& sys, int n_pages, int page_size, uint64_t salt);

}  // namespace troupe
