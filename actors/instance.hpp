#pragma once
// The instance actor: one engine replica over one device (DESIGN.md §3,
// "Step loop").  It keeps the waiting and running sequences, plans each
// step with runtime/scheduler, sends the step to the device, samples each
// sequence's last row, and streams tokens to the sequences' sinks.
//
// The instance owns the page metadata of the device's whole KV arena (a
// runtime/page_pool) rather than asking a kv_pool actor: the scheduler
// needs the exact free-page count and the prefix match of each admission
// before it can plan, which would cost several round trips per step.  So:
// one instance per device arena.
//
// Event-based: it never blocks; the device (detached) does the waiting.
#include <memory>
#include <string>
#include <vector>

#include "messages/device.hpp"
#include "messages/instance.hpp"
#include "runtime/scheduler.hpp"

namespace troupe {

struct instance_options {
  // Step limits; page_size is taken from the device.
  scheduler_limits limits;
  preempt_mode preemption = preempt_mode::recompute;
  // The model's end-of-generation ids (tokenizer::end_of_generation_ids()).
  std::vector<int32_t> eog_tokens;
  bool prefix_caching = true;
  // Each token's bytes (tokenizer::token_bytes), for constrained
  // decoding; without them a constrained request is refused.
  std::shared_ptr<const std::vector<std::string>> token_bytes;
  // Steps kept for stats' recent_steps (the router's model; the cost-model
  // calibration keeps many).
  size_t kept_steps = 16;
  // Speculative decoding: the most n-gram draft tokens a decoding sequence
  // verifies per step when its request does not say (0: off).
  int32_t draft_tokens = 0;
  std::string role = "mixed";  // reported; the router decides the work
  // Co-location's TPOT guard: while online sequences decode, a step slower
  // than this halves the offline rows a step may take beside them, and a
  // step under 80% of it gives 4 back (0: no guard).
  double tpot_target_ms = 0;
  // Step overlap (runtime/step_overlap.hpp): plan and send the next step
  // while the device runs this one.
  bool step_overlap = true;
};

// Asks the device what it holds (blocking, before any actor exists), then
// spawns the instance.  Throws std::invalid_argument for bad limits and
// std::runtime_error when the device does not answer.
instance_actor spawn_instance(caf::actor_system& sys, device_actor dev, instance_options opts);

}  // namespace troupe
