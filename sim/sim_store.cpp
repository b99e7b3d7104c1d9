#include "sim/sim_store.hpp"

namespace troupe {

namespace {
// The simulator has one model and geometry: one KV space.
constexpr uint64_t k_space = 1;
}  // namespace

sim_store::sim_store(uint64_t host_bytes, uint64_t disk_bytes, uint64_t page_bytes,
                     tier_eviction policy)
    : page_bytes_(page_bytes), host_("host", host_bytes, policy) {
  if (disk_bytes > 0) disk_.emplace("disk", disk_bytes, policy);
}

void sim_store::into_disk(const kv_page_key& k, int32_t depth, uint64_t now) {
  if (!disk_ || page_bytes_ > disk_->budget()) return;
  if (disk_->touch(k, now)) return;
  disk_->evict_for(page_bytes_);
  disk_->insert(k, page_bytes_, depth, now);
  disk_->counters().bytes_in += page_bytes_;
}

void sim_store::into_host(const kv_page_key& k, int32_t depth, uint64_t now) {
  if (host_.touch(k, now)) return;
  if (page_bytes_ > host_.budget()) return into_disk(k, depth, disk_ ? disk_->tick() : 0);
  const uint64_t disk_now = disk_ ? disk_->tick() : 0;
  for (const auto& v : host_.evict_for(page_bytes_)) into_disk(v.key, v.depth, disk_now);
  host_.insert(k, page_bytes_, depth, now);
  host_.counters().bytes_in += page_bytes_;
}

void sim_store::put(const std::vector<evicted_page>& pages) {
  const uint64_t now = host_.tick();  // one use per offer, as memory_tier::put
  for (const auto& p : pages) into_host({k_space, p.hash}, p.depth, now);
}

sim_store::fetched sim_store::fetch(std::span<const uint64_t> hashes) {
  fetched out;
  const uint64_t now = host_.tick();
  const uint64_t disk_now = disk_ ? disk_->tick() : 0;
  for (uint64_t h : hashes) {
    const kv_page_key k{k_space, h};
    if (host_.contains(k)) {
      host_.hit(k, now);
      host_.counters().bytes_out += page_bytes_;
      ++out.host;
      out.from.push_back(0);
      continue;
    }
    if (disk_ && disk_->contains(k)) {
      disk_->hit(k, disk_now);
      disk_->counters().bytes_out += page_bytes_;
      into_host(k, disk_->depth_of(k), now);
      ++out.disk;
      out.from.push_back(1);
      continue;
    }
    break;
  }
  return out;
}

int32_t sim_store::run_length(std::span<const uint64_t> hashes) const {
  int32_t n = 0;
  for (uint64_t h : hashes) {
    if (!in_host(h) && !in_disk(h)) break;
    ++n;
  }
  return n;
}

bool sim_store::in_host(uint64_t hash) const {
  return host_.contains({k_space, hash});
}

bool sim_store::in_disk(uint64_t hash) const {
  return disk_ && disk_->contains({k_space, hash});
}

std::string sim_store::check_invariants() const {
  if (auto why = host_.check_invariants(); !why.empty()) return why;
  return disk_ ? disk_->check_invariants() : std::string();
}

}  // namespace troupe
