#pragma once
// The kv_pool protocol: an actor that keeps the page metadata of one KV
// arena (runtime/engine/page_pool.hpp): page tables, refcounts, the prefix
// index.  Serving does not spawn it today (each instance's engine holds its
// own page_pool; docs/architecture.md §1.3); tests/unit/test_page_pool.cpp
// drives it, and the KV store issue makes it the host and disk tiers.
// It never touches page data; where data must move (copy-on-write, swap,
// import) its answers name the pages and the caller drives the device.
#include <caf/all.hpp>
#include "messages/atoms.hpp"

#include "runtime/engine/page_pool.hpp"

namespace troupe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, alloc_request& x) {
  return f(caf::meta::type_name("alloc_request"), x.seq, x.tokens_needed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, page_copy& x) {
  return f(caf::meta::type_name("page_copy"), x.seq, x.src, x.dst, x.tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, seq_pages& x) {
  return f(caf::meta::type_name("seq_pages"), x.seq, x.n_tokens, x.pages);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_allocation& x) {
  return f(caf::meta::type_name("step_allocation"), x.ok, x.pages_short, x.tables, x.copies);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefix_match& x) {
  return f(caf::meta::type_name("prefix_match"), x.cached_tokens, x.pages);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_stats& x) {
  return f(caf::meta::type_name("pool_stats"), x.page_size, x.total, x.free, x.allocated, x.mapped,
           x.reusable, x.sequences, x.cached_tokens, x.prefix_queries, x.prefix_query_tokens,
           x.prefix_hit_tokens, x.evictions, x.alloc_failures);
}

// allocate: grow the tables of one step's whole batch, all or nothing
//           (ok = false with pages_short when the arena lacks pages).
// match:    start sequence `seq` on a prompt, mapping its cached prefix.
// commit:   index the sequence's newly computed full pages (tokens from
//           position 0); replies with the pages newly indexed.
// fork:     (parent, child): the child shares all the parent's pages.
// free:     drop a sequence (finish, cancel, preemption by recompute);
//           replies with the pages its table held (0 if unknown).
// truncate: shorten a sequence's table to n tokens; replies pages dropped.
// export:   a sequence's table, for swap and transfer (then free it).
// reserve:  n pages outside any table, for an import (empty when short);
//           attach them as a new sequence's table, or unreserve them.
// stats:    page counts, prefix hit counters, utilization.
// check:    the page_pool invariants: empty, or the first violation.
// Misuse (unknown sequence, duplicate sequence in a step, bad page) answers
// sec::invalid_argument with the context.
using kv_pool_actor = caf::typed_actor<
    caf::replies_to<allocate_atom, std::vector<alloc_request>>::with<step_allocation>,
    caf::replies_to<match_atom, uint64_t, std::vector<int32_t>>::with<prefix_match>,
    caf::replies_to<commit_atom, uint64_t, std::vector<int32_t>>::with<int32_t>,
    caf::replies_to<fork_atom, uint64_t, uint64_t>::with<int32_t>,
    caf::replies_to<free_atom, uint64_t>::with<int32_t>,
    caf::replies_to<truncate_atom, uint64_t, int32_t>::with<int32_t>,
    caf::replies_to<export_atom, uint64_t>::with<seq_pages>,
    caf::replies_to<reserve_atom, int32_t>::with<std::vector<int32_t>>,
    caf::replies_to<attach_atom, seq_pages>::with<int32_t>,
    caf::replies_to<unreserve_atom, std::vector<int32_t>>::with<int32_t>,
    caf::replies_to<stats_atom>::with<pool_stats>, caf::replies_to<check_atom>::with<std::string>>;

}  // namespace troupe
