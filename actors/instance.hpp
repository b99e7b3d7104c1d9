#pragma once
// The instance actor: one engine replica over one device
// (docs/architecture.md §4.1 "The engine and its actor").  The engine's
// logic (sequences, step plans, admission, preemption, sampling, drafts,
// export and import) is runtime/engine/engine, a plain class; this actor is its
// message glue: it hands the engine's commands to the device actor and the
// sequences' sinks in order, feeds the device's answers back, monitors the
// sinks, and steps in a dp_group's rounds when it joins one.
//
// The engine owns the page metadata of the device's whole KV arena (a
// runtime/engine/page_pool): the scheduler needs the exact free-page count
// and the prefix match of each admission before it can plan.  The
// process's kv_pool (the KV store's host and disk tiers) sits below it:
// pages the arena evicts are offered to it without waiting, and a prompt
// whose prefix the arena lacks is looked up there before it is enqueued.
//
// Event-based: it never blocks; the device (detached) does the waiting.
#include <memory>
#include <string>
#include <vector>

#include "messages/device.hpp"
#include "messages/instance.hpp"
#include "messages/kv_pool.hpp"
#include "runtime/engine/engine_types.hpp"
#include "runtime/engine/scheduler.hpp"

namespace troupe {

// Asks the device what it holds (blocking, before any actor exists), then
// spawns the instance.  Throws std::invalid_argument for bad limits and
// std::runtime_error when the device does not answer.
// `tiers`, when not null, is the process's KV store: the instance offers it
// the prefix pages its arena evicts and loads prompts' prefixes back from it.
instance_actor spawn_instance(caf::actor_system& sys, device_actor dev, instance_options opts,
                              kv_pool_actor tiers = {});

}  // namespace troupe
