#include "runtime/kvstore/disk_tier.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "runtime/kvstore/page_file.hpp"

namespace troupe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSuffix = ".kvpage";

// <space>-<hash>-<depth>.kvpage; false for any other name.
bool parse_name(const std::string& name, kv_page_key& k, int32_t& depth) {
  unsigned long long space = 0, hash = 0;
  int d = -1, used = 0;
  if (std::sscanf(name.c_str(), "%16llx-%16llx-%d.kvpage%n", &space, &hash, &d, &used) != 3 ||
      used != int(name.size()) || d < 0)
    return false;
  k = {space, hash};
  depth = d;
  return true;
}

}  // namespace

disk_tier::disk_tier(fs::path dir, uint64_t budget_bytes, tier_eviction policy)
    : dir_(std::move(dir)), budget_(budget_bytes), policy_(policy) {
  st_.name = "disk";
  st_.budget = budget_bytes;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_))
    throw std::runtime_error("KV disk tier: " + dir_.string() + " is not a folder" +
                             (ec ? " (" + ec.message() + ")" : ""));
  // Two processes on one folder would evict and index each other's files.
  lock_fd_ = ::open((dir_ / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw std::runtime_error("KV disk tier: " + dir_.string() +
                             " is in use by another troupe process (give each its own "
                             "--kv-disk-dir)");
  }
  // Index what a previous run left, oldest first so LRU order survives.
  struct found {
    kv_page_key key;
    int32_t depth;
    uint64_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<found> files;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    const std::string name = de.path().filename().string();
    if (name.ends_with(".tmp")) {  // a write a crash interrupted
      fs::remove(de.path(), ec);
      continue;
    }
    kv_page_key k;
    int32_t depth = 0;
    // Only the names this tier writes (so a file is found again under its
    // key); one key once.
    if (!de.is_regular_file(ec) || !parse_name(name, k, depth) ||
        file_of(k, depth).filename() != de.path().filename())
      continue;
    files.push_back({k, depth, de.file_size(ec), de.last_write_time(ec)});
  }
  std::sort(files.begin(), files.end(),
            [](const found& a, const found& b) { return a.mtime < b.mtime; });
  for (const auto& f : files) {
    if (entries_.count(f.key)) {  // the same page at another depth: keep the newer
      drop(f.key);
    }
    entries_[f.key] = {f.bytes, ++tick_, 0, f.depth};
    st_.bytes += f.bytes;
    ++st_.pages;
  }
  evict_for(0);
  if (st_.pages > 0)
    spdlog::info("KV disk tier: {} pages ({} MiB) found in {}", st_.pages, st_.bytes >> 20,
                 dir_.string());
}

disk_tier::~disk_tier() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

fs::path disk_tier::file_of(const kv_page_key& k, int32_t depth) const {
  char name[64];
  std::snprintf(name, sizeof name, "%016" PRIx64 "-%016" PRIx64 "-%d%s", k.space, k.hash, depth,
                kSuffix);
  return dir_ / name;
}

void disk_tier::drop(const kv_page_key& k) {
  auto it = entries_.find(k);
  if (it == entries_.end()) return;
  std::error_code ec;
  fs::remove(file_of(k, it->second.depth), ec);
  st_.bytes -= it->second.bytes;
  --st_.pages;
  entries_.erase(it);
}

void disk_tier::evict_for(uint64_t incoming) {
  if (st_.bytes + incoming <= budget_) return;
  std::vector<tier_entry_use> uses;
  std::vector<kv_page_key> keys;
  for (const auto& [k, e] : entries_) {
    uses.push_back({e.bytes, e.last_use, e.hits, e.depth});
    keys.push_back(k);
  }
  for (size_t i : pick_victims(uses, st_.bytes + incoming - budget_, policy_)) {
    drop(keys[i]);
    ++st_.evictions;
  }
}

void disk_tier::put(const std::vector<kv_page>& pages) {
  const uint64_t now = ++tick_;  // one use per call, as in the host tier
  for (const auto& p : pages) {
    const kv_page_key k{p.space, p.hash};
    if (auto it = entries_.find(k); it != entries_.end()) {
      it->second.last_use = now;
      continue;
    }
    const auto bytes = encode_page_file(p);
    if (bytes.size() > budget_) {
      ++st_.dropped;
      continue;
    }
    evict_for(bytes.size());
    const fs::path file = file_of(k, p.depth);
    fs::path tmp = file;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      if (!out.flush()) {
        std::error_code ec;
        fs::remove(tmp, ec);
        ++st_.dropped;
        spdlog::warn("KV disk tier: writing {} failed", tmp.string());
        continue;
      }
    }
    std::error_code ec;
    fs::rename(tmp, file, ec);
    if (ec) {
      fs::remove(tmp, ec);
      ++st_.dropped;
      continue;
    }
    entries_[k] = {bytes.size(), now, 0, p.depth};
    st_.bytes += bytes.size();
    st_.bytes_in += p.bytes.size();
    ++st_.pages;
  }
}

std::vector<kv_page> disk_tier::read_run(uint64_t space, std::span<const uint64_t> hashes) {
  std::vector<kv_page> out;
  const uint64_t now = ++tick_;
  for (uint64_t h : hashes) {
    const kv_page_key k{space, h};
    auto it = entries_.find(k);
    if (it == entries_.end()) {
      ++st_.misses;
      break;
    }
    const fs::path file = file_of(k, it->second.depth);
    std::vector<uint8_t> bytes;
    std::error_code size_ec;
    // A file whose size changed since it was indexed is not read at all.
    if (fs::file_size(file, size_ec) == it->second.bytes && !size_ec) {
      std::ifstream in(file, std::ios::binary);
      if (in) bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    kv_page p;
    std::string why;
    try {
      p = decode_page_file(bytes);
      if (p.space != space || p.hash != h || p.depth != it->second.depth)
        why = "its header names another page";
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      spdlog::warn("KV disk tier: dropping {}: {}", file.string(), why);
      drop(k);
      ++st_.dropped;
      ++st_.misses;
      break;
    }
    it->second.last_use = now;
    ++it->second.hits;
    ++st_.hits;
    st_.bytes_out += p.bytes.size();
    out.push_back(std::move(p));
  }
  return out;
}

size_t disk_tier::run_length(uint64_t space, std::span<const uint64_t> hashes) const {
  size_t n = 0;
  while (n < hashes.size() && entries_.count({space, hashes[n]})) ++n;
  return n;
}

std::vector<uint64_t> disk_tier::hashes(uint64_t space) const {
  std::vector<uint64_t> out;
  for (const auto& [k, e] : entries_)
    if (k.space == space) out.push_back(k.hash);
  return out;
}

tier_stats disk_tier::stats() const {
  tier_stats out = st_;
  out.hashes.reserve(entries_.size());
  for (const auto& [k, e] : entries_) out.hashes.push_back(k.hash);
  out.check = check_invariants();
  return out;
}

std::string disk_tier::check_invariants() const {
  uint64_t bytes = 0;
  for (const auto& [k, e] : entries_) bytes += e.bytes;
  if (bytes != st_.bytes)
    return "disk tier: " + std::to_string(bytes) + " bytes held, counted " +
           std::to_string(st_.bytes);
  if (int64_t(entries_.size()) != st_.pages)
    return "disk tier: " + std::to_string(entries_.size()) + " pages held, counted " +
           std::to_string(st_.pages);
  if (bytes > budget_)
    return "disk tier: " + std::to_string(bytes) + " bytes over its budget of " +
           std::to_string(budget_);
  return {};
}

}  // namespace troupe
