#pragma once
// A pipeline stage on a `troupe node` (issue 35): the stage's device actor
// is spawned by the node, in its process, and the pipeline here drives it
// through its handle as it drives a local stage; forward batches, hidden
// states and page parts cross as messages over the cluster's TLS.
#include <caf/all.hpp>
#include <string>

#include "messages/node.hpp"

namespace troupe {

// Connects to the node at `address` (HOST:PORT), asks it for the stage
// (spawnstage) and waits until its layers are loaded.  Blocks: call it
// where spawn_device may block.  Throws std::runtime_error naming the node
// and why (this process has no cluster TLS, the node cannot be reached,
// the node could not load the stage).
device_actor spawn_remote_stage(caf::actor_system& sys, const std::string& address,
                                const stage_spec& spec);

}  // namespace troupe
