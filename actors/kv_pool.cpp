#include "actors/kv_pool.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <span>
#include <unordered_map>

#include "actors/kv_disk.hpp"
#include "runtime/kvstore/memory_tier.hpp"

namespace troupe {

namespace {

// A disk read of a prefix: seconds at worst; past this the fetch answers
// with what the host tier had.
constexpr auto k_disk_timeout = std::chrono::seconds(30);

struct kv_pool_state {
  std::unique_ptr<memory_tier> host;
  kv_disk_actor disk;  // null: no disk tier
  // The disk tier's last stats: stats answer with them at once (a disk
  // busy with I/O never holds up an instance's stats) and ask for fresh
  // ones behind.
  tier_stats disk_stats;
  bool disk_stats_asked = false;
  kv_store_stats counters;
  // Swapped-out sequences' KV by swap id (an instance's actor id and the
  // sequence's key), at most swap_budget bytes: never evicted, only taken
  // back or dropped.
  std::unordered_map<uint64_t, std::vector<uint8_t>> swaps;
  uint64_t swap_bytes = 0;
  uint64_t swap_budget = 0;
  static inline const char* name = "kv_pool";
};

using self_ptr = kv_pool_actor::stateful_pointer<kv_pool_state>;

// Into the host tier; what it evicts goes down to the disk tier.
void keep(self_ptr self, std::vector<kv_page> pages) {
  auto evicted = self->state.host->put(std::move(pages));
  if (self->state.disk && !evicted.empty())
    self->send(self->state.disk, kv_put_atom::value, std::move(evicted));
}

// A fetch in progress: a prefix's pages may sit partly in the host tier,
// partly on disk, so the run alternates between them until a page is in
// neither.
struct fetch {
  uint64_t space = 0;
  std::vector<uint64_t> hashes;
  std::vector<kv_page> run;
  caf::typed_response_promise<std::vector<kv_page>> rp;
};

// Extends the run from the host tier; true when the fetch is done (every
// page found, or no disk tier to ask for the next).
bool host_run(self_ptr self, fetch& f) {
  auto& st = self->state;
  auto more = st.host->take_run(f.space, std::span(f.hashes).subspan(f.run.size()));
  for (auto& p : more) f.run.push_back(std::move(p));
  return f.run.size() == f.hashes.size() || !st.disk;
}

void finish(self_ptr self, fetch& f) {
  self->state.counters.fetched_pages += f.run.size();
  f.rp.deliver(std::move(f.run));
}

// The host lacks the run's next page: the disk reads from there.
void ask_disk(self_ptr self, std::shared_ptr<fetch> f) {
  std::vector<uint64_t> rest(f->hashes.begin() + std::ptrdiff_t(f->run.size()), f->hashes.end());
  self->request(self->state.disk, k_disk_timeout, kv_fetch_atom::value, f->space, std::move(rest))
      .then(
          [self, f](std::vector<kv_page>& got) {
            if (got.empty()) return finish(self, *f);
            keep(self, got);  // disk -> host: a page read once is likely read again
            for (auto& p : got) f->run.push_back(std::move(p));
            if (host_run(self, *f)) return finish(self, *f);
            ask_disk(self, f);
          },
          [self, f](caf::error&) { finish(self, *f); });
}

kv_pool_actor::behavior_type kv_pool_behavior(self_ptr self, kv_store_options opts,
                                              kv_disk_actor disk) {
  self->state.host = std::make_unique<memory_tier>(opts.host_bytes, opts.policy);
  self->state.disk = std::move(disk);
  self->state.disk_stats.name = "disk";
  self->state.disk_stats.budget = opts.disk_bytes;
  self->state.swap_budget = opts.host_bytes / 2;
  if (self->state.disk) self->link_to(self->state.disk);
  return {
      [self](kv_put_atom, std::vector<kv_page>& pages) {
        self->state.counters.offered_pages += pages.size();
        keep(self, std::move(pages));
      },
      [self](kv_fetch_atom, uint64_t space,
             std::vector<uint64_t>& hashes) -> caf::result<std::vector<kv_page>> {
        auto& st = self->state;
        ++st.counters.fetches;
        auto f = std::make_shared<fetch>();
        f->space = space;
        f->hashes = std::move(hashes);
        if (host_run(self, *f)) {
          st.counters.fetched_pages += f->run.size();
          return std::move(f->run);
        }
        f->rp = self->make_response_promise<std::vector<kv_page>>();
        ask_disk(self, f);
        return f->rp;
      },
      // A swapped-out sequence's KV: kept when it fits, else handed back.
      [self](kv_swap_put_atom, uint64_t id, std::vector<uint8_t>& bytes) -> std::vector<uint8_t> {
        auto& st = self->state;
        if (st.swaps.count(id) || st.swap_bytes + bytes.size() > st.swap_budget)
          return std::move(bytes);
        st.swap_bytes += bytes.size();
        ++st.counters.swaps_kept;
        st.swaps.emplace(id, std::move(bytes));
        return std::vector<uint8_t>{};
      },
      [self](kv_swap_take_atom, uint64_t id) -> caf::result<std::vector<uint8_t>> {
        auto& st = self->state;
        auto it = st.swaps.find(id);
        if (it == st.swaps.end())
          return caf::make_error(caf::sec::invalid_argument,
                                 "no swapped KV " + std::to_string(id) + " in the store");
        auto bytes = std::move(it->second);
        st.swaps.erase(it);
        st.swap_bytes -= bytes.size();
        return bytes;
      },
      [self](kv_swap_drop_atom, uint64_t id) {
        auto& st = self->state;
        auto it = st.swaps.find(id);
        if (it == st.swaps.end()) return;
        st.swap_bytes -= it->second.size();
        st.swaps.erase(it);
      },
      [self](stats_atom) {
        auto& st = self->state;
        kv_store_stats out = st.counters;
        out.swaps = static_cast<int64_t>(st.swaps.size());
        out.swap_bytes = st.swap_bytes;
        out.tiers.push_back(st.host->stats());
        out.check = out.tiers.back().check;
        if (!st.disk) return out;
        out.tiers.push_back(st.disk_stats);
        if (out.check.empty()) out.check = st.disk_stats.check;
        if (!st.disk_stats_asked) {
          st.disk_stats_asked = true;
          self->request(st.disk, k_disk_timeout, stats_atom::value)
              .then(
                  [self](tier_stats& d) {
                    self->state.disk_stats = std::move(d);
                    self->state.disk_stats_asked = false;
                  },
                  [self](caf::error&) { self->state.disk_stats_asked = false; });
        }
        return out;
      },
  };
}

}  // namespace

kv_pool_actor spawn_kv_pool(caf::actor_system& sys, const kv_store_options& opts) {
  kv_disk_actor disk;
  if (!opts.disk_dir.empty())
    disk = spawn_kv_disk(sys, opts.disk_dir, opts.disk_bytes, opts.policy);
  spdlog::info("KV store: host tier {} MiB{}", opts.host_bytes >> 20,
               opts.disk_dir.empty() ? std::string()
                                     : ", disk tier " + std::to_string(opts.disk_bytes >> 20) +
                                           " MiB in " + opts.disk_dir);
  return sys.spawn(kv_pool_behavior, opts, std::move(disk));
}

}  // namespace troupe
