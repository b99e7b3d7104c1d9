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
      [pool](allocate_atom, const std::vector<alloc_request>& reqs) {
        return guarded("allocate", [&] { return pool().allocate_step(reqs); });
      },
      [pool](match_atom, uint64_t seq, const std::vector<int32_t>& prompt) {
        return guarded("match", [&] { return pool().match_prefix(seq, prompt); });
      },
      [pool](commit_atom, uint64_t seq, const std::vector<int32_t>& tokens) {
        return guarded("commit", [&] { return pool().commit_full_pages(seq, tokens); });
      },
      [pool](fork_atom, uint64_t parent, uint64_t child) {
        return guarded("fork", [&] { return pool().fork(parent, child); });
      },
      [pool](free_atom, uint64_t seq) {
        return guarded("free", [&] { return pool().free_sequence(seq); });
      },
      [pool](truncate_atom, uint64_t seq, int32_t n_tokens) {
        return guarded("truncate", [&] { return pool().truncate(seq, n_tokens); });
      },
      [pool](export_atom, uint64_t seq) {
        return guarded("export", [&] { return pool().export_pages(seq); });
      },
      [pool](reserve_atom, int32_t n) {
        return guarded("reserve", [&] { return pool().reserve(n); });
      },
      [pool](attach_atom, const seq_pages& table) {
        return guarded("attach", [&] {
          pool().attach(table);
          return static_cast<int32_t>(table.pages.size());
        });
      },
      [pool](unreserve_atom, const std::vector<int32_t>& pages) {
        return guarded("unreserve", [&] { return pool().unreserve(pages); });
      },
      [pool](stats_atom) { return pool().stats(); },
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
