#pragma once
// The KV store's disk tier: one file per page in a folder, in a byte
// budget, evicted by the tier policy.  Blocking I/O: the kv_disk actor
// (actors/kv_disk, detached) owns one, off the scheduler's threads.
//
// Files are <space>-<hash>-<depth>.kvpage (hex, hex, decimal), written
// to a .tmp name and renamed, so a crash leaves no half page under a real
// name.  Opening a folder indexes the page files already there by name
// and size (oldest modified first in LRU order), so pages survive a
// restart; a file is verified when read (runtime/kvstore/page_file), and
// one that fails is deleted and counted, never served.
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "runtime/kvstore/kv_page.hpp"
#include "runtime/kvstore/tier_index.hpp"

namespace troupe {

class disk_tier {
 public:
  // Creates the folder when missing and locks it (a .lock file, flock): one
  // process's tier a folder.  Throws std::runtime_error when it cannot, when
  // it is not a folder, or when another process holds it.
  disk_tier(std::filesystem::path dir, uint64_t budget_bytes, tier_eviction policy);
  ~disk_tier();
  disk_tier(const disk_tier&) = delete;
  disk_tier& operator=(const disk_tier&) = delete;

  // Writes the pages (one already held is only touched), evicting files to
  // stay in the budget.  A page that cannot be written is counted dropped.
  void put(const std::vector<kv_page>& pages);

  // The leading run of `hashes` it holds, read and verified (each a hit);
  // a miss is counted where the run ends before the list does.
  std::vector<kv_page> read_run(uint64_t space, std::span<const uint64_t> hashes);

  size_t run_length(uint64_t space, std::span<const uint64_t> hashes) const;
  std::vector<uint64_t> hashes(uint64_t space) const;
  const std::filesystem::path& dir() const { return dir_; }
  tier_stats stats() const;
  std::string check_invariants() const;

 private:
  std::filesystem::path file_of(const kv_page_key& k, int32_t depth) const;
  void drop(const kv_page_key& k);
  void remove_file(const kv_page_key& k, int32_t depth);

  std::filesystem::path dir_;
  int lock_fd_ = -1;
  tier_index index_;  // bytes: the files' sizes
};

}  // namespace troupe
