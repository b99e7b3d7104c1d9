#pragma once
// Queued requests moved to instances that can start them now (issue 37,
// autoscaling): a request waits on the instance it was placed on even when
// an instance started since (or one that emptied) could run it at once.  A
// queued request holds no KV, so moving it costs one placement.  Plain
// policy; the router acts on it (actors/router.cpp).
#include <cstdint>
#include <vector>

namespace troupe {

struct rebalance_load {
  uint64_t id = 0;
  bool serving = true;  // takes new work (not draining, not down)
  int32_t waiting = 0;  // queued sequences
  int32_t running = 0;
};

struct rebalance_move {
  uint64_t from = 0;
  int32_t count = 0;  // queued requests asked to move
};

// Moves from instances that are full (running at max_seqs, so their queue
// cannot start) to the room other serving instances have (max_seqs minus
// what they run and queue), the longest queues first; nothing when no
// instance has room.
std::vector<rebalance_move> plan_rebalance(const std::vector<rebalance_load>& loads,
                                           int32_t max_seqs);

}  // namespace troupe
