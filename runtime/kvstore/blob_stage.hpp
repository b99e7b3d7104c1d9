#pragma once
// Blobs arriving in chunks (direct KV transfer, docs/architecture.md §4.10
// "The KV store"): a sending instance streams a sequence's KV blob to the
// receiving instance in order; the receiver holds the chunks here until
// the request imports the whole blob.  Everything that arrives from the
// network is bounded: one blob by what the arena can hold, all open
// transfers together by twice that, and a transfer nobody finishes or
// imports is dropped after a while.  The first chunk must begin with a
// blob header for this arena's geometry, so a blob for another model or
// layout is refused before the rest is sent.
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/engine/kv_blob.hpp"

namespace troupe {

class blob_stage {
 public:
  using clock = std::chrono::steady_clock;

  // `cap`: the largest blob taken; `ttl`: how long a transfer may rest.
  blob_stage(kv_geometry here, uint64_t cap, clock::duration ttl);

  // One chunk of transfer `id` at `offset` of `total` bytes.  id 0 opens a
  // transfer (offset 0) and sets id to its name (random: a peer cannot
  // guess another's).  "" when taken, else why
  // not; a chunk that does not continue its transfer drops the transfer.
  std::string add(uint64_t& id, uint64_t offset, uint64_t total, std::span<const uint8_t> chunk,
                  clock::time_point now);
  // The whole blob of transfer `id`, which leaves; none while incomplete
  // or unknown.
  std::optional<std::vector<uint8_t>> take(uint64_t id);

  // Drops the transfers resting past the ttl (also done by add).
  void sweep(clock::time_point now) { expire(now); }

  size_t open() const { return blobs_.size(); }
  uint64_t dropped() const { return dropped_; }  // transfers that expired

 private:
  struct blob {
    std::vector<uint8_t> bytes;
    uint64_t total = 0;
    clock::time_point touched;
  };
  // Drops expired transfers; the bytes the rest will hold.
  uint64_t expire(clock::time_point now);

  kv_geometry here_;
  uint64_t cap_;
  clock::duration ttl_;
  std::unordered_map<uint64_t, blob> blobs_;
  std::mt19937_64 ids_;
  uint64_t dropped_ = 0;
};

}  // namespace troupe
