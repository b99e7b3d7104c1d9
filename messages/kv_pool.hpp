#pragma once
// The KV store's protocols (docs/architecture.md §4.10 "The KV store").
//
// kv_pool: one per process that hosts instances; it holds the host-memory
// tier and, below it, a kv_disk actor's disk tier.  Instances offer the
// indexed pages their arenas evict (put, fire and forget: a step never
// waits on it) and, before a prompt is admitted, fetch the pages of its
// prefix their arena lacks.
// kv_disk: the disk tier, detached (its file I/O blocks).
//
// Also the page pool's counters, which travel in instance_stats.
#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "runtime/engine/kv_blob.hpp"
#include "runtime/engine/page_pool.hpp"
#include "runtime/kvstore/kv_page.hpp"

namespace troupe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_stats& x) {
  return f(caf::meta::type_name("pool_stats"), x.page_size, x.total, x.free, x.allocated, x.mapped,
           x.reusable, x.sequences, x.cached_tokens, x.prefix_queries, x.prefix_query_tokens,
           x.prefix_hit_tokens, x.evictions, x.alloc_failures);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_page& x) {
  return f(caf::meta::type_name("kv_page"), x.space, x.hash, x.parent, x.depth, x.tokens, x.bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_stats& x) {
  return f(caf::meta::type_name("tier_stats"), x.name, x.budget, x.bytes, x.pages, x.hits, x.misses,
           x.bytes_in, x.bytes_out, x.evictions, x.dropped, x.read_ms, x.hashes, x.check);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_link_timing& x) {
  return f(caf::meta::type_name("kv_link_timing"), x.store, x.pages, x.ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_store_stats& x) {
  return f(caf::meta::type_name("kv_store_stats"), x.tiers, x.offered_pages, x.fetches,
           x.fetched_pages, x.swaps, x.swap_bytes, x.swaps_kept, x.check);
}

// put:   pages to keep (an instance's evictions; the pool's own, to disk).
// fetch: (space, hashes): the leading run of the hashes the tiers hold,
//        host first, then disk (pages read from disk move up to the host).
// stats: every tier's counters and invariants.
// swapput:  (id, bytes) keep a swapped-out sequence's KV (an instance's
//           preemption by swap); answers with nothing taken (empty) or,
//           when it does not fit, the bytes back.
// swaptake: (id) that KV, which leaves the store; an error when unknown.
// swapdrop: (id) the sequence ended while swapped: forget it.
using kv_disk_actor = caf::typed_actor<
    caf::reacts_to<kv_put_atom, std::vector<kv_page>>,
    caf::replies_to<kv_fetch_atom, uint64_t, std::vector<uint64_t>>::with<std::vector<kv_page>>,
    caf::replies_to<stats_atom>::with<tier_stats>>;

using kv_pool_actor = caf::typed_actor<
    caf::reacts_to<kv_put_atom, std::vector<kv_page>>,
    caf::replies_to<kv_fetch_atom, uint64_t, std::vector<uint64_t>>::with<std::vector<kv_page>>,
    caf::replies_to<stats_atom>::with<kv_store_stats>,
    caf::replies_to<kv_swap_put_atom, uint64_t, std::vector<uint8_t>>::with<std::vector<uint8_t>>,
    caf::replies_to<kv_swap_take_atom, uint64_t>::with<std::vector<uint8_t>>,
    caf::reacts_to<kv_swap_drop_atom, uint64_t>>;

}  // namespace troupe
