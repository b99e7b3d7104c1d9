#include "runtime/kvstore/disk_tier.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "runtime/common/elapsed.hpp"
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
    : dir_(std::move(dir)), index_("disk", budget_bytes, policy) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_))
    throw std::runtime_error("KV disk tier: " + dir_.string() + " is not a folder" +
                             (ec ? " (" + ec.message() + ")" : ""));
  // Two processes on one folder would evict and index each other's files.
  lock_fd_ = ::open((dir_ / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) {
    const int err = errno;
    throw std::runtime_error("KV disk tier: cannot write in " + dir_.string() + " (" +
                             std::strerror(err) + "; give --kv-disk-dir a folder of your own)");
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
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
    drop(f.key);  // the same page at another depth: keep the newer
    index_.insert(f.key, f.bytes, f.depth, index_.tick());
  }
  for (const auto& v : index_.evict_for(0)) remove_file(v.key, v.depth);
  if (index_.size() > 0)
    spdlog::info("KV disk tier: {} pages ({} MiB) found in {}", index_.size(),
                 index_.counters().bytes >> 20, dir_.string());
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
  const int32_t depth = index_.depth_of(k);
  if (depth < 0) return;
  index_.erase(k);
  remove_file(k, depth);
}

void disk_tier::remove_file(const kv_page_key& k, int32_t depth) {
  std::error_code ec;
  fs::remove(file_of(k, depth), ec);
}

void disk_tier::put(const std::vector<kv_page>& pages) {
  const uint64_t now = index_.tick();  // one use per call, as in the host tier
  auto& st = index_.counters();
  for (const auto& p : pages) {
    const kv_page_key k{p.space, p.hash};
    if (index_.touch(k, now)) continue;
    const auto bytes = encode_page_file(p);
    if (bytes.size() > index_.budget()) {
      ++st.dropped;
      continue;
    }
    for (const auto& v : index_.evict_for(bytes.size())) remove_file(v.key, v.depth);
    const fs::path file = file_of(k, p.depth);
    fs::path tmp = file;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      if (!out.flush()) {
        std::error_code ec;
        fs::remove(tmp, ec);
        ++st.dropped;
        spdlog::warn("KV disk tier: writing {} failed", tmp.string());
        continue;
      }
    }
    std::error_code ec;
    fs::rename(tmp, file, ec);
    if (ec) {
      fs::remove(tmp, ec);
      ++st.dropped;
      continue;
    }
    index_.insert(k, bytes.size(), p.depth, now);
    st.bytes_in += p.bytes.size();
  }
}

std::vector<kv_page> disk_tier::read_run(uint64_t space, std::span<const uint64_t> hashes) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<kv_page> out;
  const uint64_t now = index_.tick();
  auto& st = index_.counters();
  for (uint64_t h : hashes) {
    const kv_page_key k{space, h};
    const int32_t depth = index_.depth_of(k);
    if (depth < 0) {
      ++st.misses;
      break;
    }
    const fs::path file = file_of(k, depth);
    std::vector<uint8_t> bytes;
    std::error_code size_ec;
    // A file whose size changed since it was indexed is not read at all.
    if (fs::file_size(file, size_ec) == index_.bytes_of(k) && !size_ec) {
      std::ifstream in(file, std::ios::binary);
      if (in) bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    kv_page p;
    std::string why;
    try {
      p = decode_page_file(bytes);
      if (p.space != space || p.hash != h || p.depth != depth)
        why = "its header names another page";
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      spdlog::warn("KV disk tier: dropping {}: {}", file.string(), why);
      drop(k);
      ++st.dropped;
      ++st.misses;
      break;
    }
    index_.hit(k, now);
    st.bytes_out += p.bytes.size();
    out.push_back(std::move(p));
  }
  if (!out.empty()) st.read_ms += ms_since(t0);
  return out;
}

size_t disk_tier::run_length(uint64_t space, std::span<const uint64_t> hashes) const {
  return index_.run_length(space, hashes);
}

std::vector<uint64_t> disk_tier::hashes(uint64_t space) const {
  return index_.hashes(space);
}

tier_stats disk_tier::stats() const {
  return index_.stats();
}

std::string disk_tier::check_invariants() const {
  return index_.check_invariants();
}

}  // namespace troupe
