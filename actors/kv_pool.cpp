#include "actors/kv_pool.hpp"

#include <stdexcept>
#include <string>

namespace troupe {

namespace {

// Runs a page_pool call; misuse becomes an error reply naming the call,
// never a dead pool.
template <class F>
auto guarded(const char* what, F&& f) -> caf::result<decltype(f())> {
  try {
    return f();
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::invalid_argument,
                           std::string("kv_pool ") + what + ": " + e.what());
  }
}

}  // namespace

kv_pool_actor::behavior_type kv_pool_behavior(kv_pool_actor::stateful_pointer<kv_pool_state> self,
                                              int n_pages, int page_size, uint64_t salt) {
  self->state.pool = std::make_unique<page_pool>(n_pages, page_size, salt);
  auto pool = [self]() -> page_pool& { return *self->state.pool; };
  return {
      // Grow the tables of one step's whole batch, all or nothing.
      [pool](allocate_atom, const std::vector<alloc_request>& reqs) {
        return guarded("allocate", [&] { return pool().allocate_step(reqs); });
      },
      // Start a sequence on a prompt, mapping its cached prefix.
      [pool](match_atom, uint64_t seq, const std::vector<int32_t>& prompt) {
        return guarded("match", [&] { return pool().match_prefix(seq, prompt); });
      },
      // Index the sequence's newly computed full pages for prefix reuse.
      [pool](commit_atom, uint64_t seq, const std::vector<int32_t>& tokens) {
        return guarded("commit", [&] { return pool().commit_full_pages(seq, tokens); });
      },
      // The child shares all the parent's pages.
      [pool](fork_atom, uint64_t parent, uint64_t child) {
        return guarded("fork", [&] { return pool().fork(parent, child); });
      },
      // Drop a sequence; replies with the pages its table held.
      [pool](free_atom, uint64_t seq) {
        return guarded("free", [&] { return pool().free_sequence(seq); });
      },
      // Shorten a sequence's table to n tokens; replies with the pages dropped.
      [pool](truncate_atom, uint64_t seq, int32_t n_tokens) {
        return guarded("truncate", [&] { return pool().truncate(seq, n_tokens); });
      },
      // A sequence's table, for swap and transfer.
      [pool](export_atom, uint64_t seq) {
        return guarded("export", [&] { return pool().export_pages(seq); });
      },
      // n pages outside any table, for an import (empty when short).
      [pool](reserve_atom, int32_t n) {
        return guarded("reserve", [&] { return pool().reserve(n); });
      },
      // Reserved pages become a new sequence's table.
      [pool](attach_atom, const seq_pages& table) {
        return guarded("attach", [&] {
          pool().attach(table);
          return static_cast<int32_t>(table.pages.size());
        });
      },
      // Reserved pages an import did not use go back.
      [pool](unreserve_atom, const std::vector<int32_t>& pages) {
        return guarded("unreserve", [&] { return pool().unreserve(pages); });
      },
      // Page counts, prefix hit counters, utilization.
      [pool](stats_atom) { return pool().stats(); },
      // The pool's invariants: empty, or the first violation.
      [pool](check_atom) { return pool().check_invariants(); },
  };
}

kv_pool_actor spawn_kv_pool(caf::actor_system& sys, int n_pages, int page_size, uint64_t salt) {
  if (n_pages < 0 || page_size <= 0)
    throw std::invalid_argument("kv_pool: bad geometry, " + std::to_string(n_pages) + " pages of " +
                                std::to_string(page_size) + " tokens");
  return sys.spawn(kv_pool_behavior, n_pages, page_size, salt);
}

}  // namespace troupe
