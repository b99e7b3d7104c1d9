#include "runtime/kvstore/blob_stage.hpp"

namespace troupe {

blob_stage::blob_stage(kv_geometry here, uint64_t cap, clock::duration ttl)
    : here_(std::move(here)), cap_(cap), ttl_(ttl), ids_(std::random_device{}()) {}

uint64_t blob_stage::expire(clock::time_point now) {
  uint64_t held = 0;
  for (auto it = blobs_.begin(); it != blobs_.end();) {
    if (now - it->second.touched > ttl_) {
      ++dropped_;
      it = blobs_.erase(it);
    } else {
      held += it->second.total;
      ++it;
    }
  }
  return held;
}

std::string blob_stage::add(uint64_t& id, uint64_t offset, uint64_t total,
                            std::span<const uint8_t> chunk, clock::time_point now) {
  const uint64_t held = expire(now);
  if (id == 0) {
    if (offset != 0) return "a transfer starts at offset 0, not " + std::to_string(offset);
    if (total == 0 || total > cap_)
      return "a blob of " + std::to_string(total) + " bytes; this instance takes at most " +
             std::to_string(cap_);
    if (held + total > 2 * cap_)
      return std::to_string(blobs_.size()) + " transfers in progress hold the room";
    try {
      if (auto why = geometry_mismatch(peek_kv_blob_geometry(chunk), here_); !why.empty())
        return why;
    } catch (const kv_blob_error& e) {
      return e.what();
    }
    do id = ids_();
    while (id == 0 || blobs_.count(id));
    auto& b = blobs_[id];
    b.total = total;
    b.touched = now;
    b.bytes.reserve(total);  // at most cap_, checked above: no doubling growth
  }
  auto it = blobs_.find(id);
  if (it == blobs_.end())
    return "no transfer " + std::to_string(id) + " (finished, or dropped after resting)";
  auto& b = it->second;
  if (offset != b.bytes.size() || total != b.total || chunk.size() > total - offset) {
    auto why = "transfer " + std::to_string(id) + ": a chunk of " + std::to_string(chunk.size()) +
               " bytes at " + std::to_string(offset) + " does not continue its " +
               std::to_string(b.bytes.size()) + " of " + std::to_string(b.total) + " bytes";
    blobs_.erase(it);
    return why;
  }
  b.bytes.insert(b.bytes.end(), chunk.begin(), chunk.end());
  b.touched = now;
  return "";
}

std::optional<std::vector<uint8_t>> blob_stage::take(uint64_t id) {
  auto it = blobs_.find(id);
  if (it == blobs_.end() || it->second.bytes.size() != it->second.total) return std::nullopt;
  auto bytes = std::move(it->second.bytes);
  blobs_.erase(it);
  return bytes;
}

}  // namespace troupe
