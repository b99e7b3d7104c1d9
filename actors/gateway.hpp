#pragma once
// The gateway actor: one per service, owning a ZeroMQ ROUTER socket bound to
// the configured endpoints (docs/architecture.md §2 "The actors",
// §2.2 "Processes, threads and boundaries").  It decodes client frames
// (anything malformed gets an Error naming the problem, never a crash),
// spawns a request actor per Generate, routes Cancel by (client, request id),
// answers Ping, and sends the request actors' frames back.  Detached: it
// polls the socket with a short timeout between its mailbox messages.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "actors/request.hpp"
#include "messages/gateway.hpp"

namespace troupe {

struct gateway_options {
  std::vector<std::string> endpoints;  // tcp://host:port (port * picks one), ipc://path
  size_t max_frame_bytes = 1 << 20;    // larger frames are refused with an Error
  int32_t max_inflight = 1024;         // requests in flight, all clients together
  int poll_ms = 2;                     // socket poll timeout between mailbox rounds
  size_t trace_history = 1024;         // finished requests' traces kept for inspection
  // Frames queued for one client (ZeroMQ's send high-water mark, beyond
  // what the kernel's socket buffers hold) before it counts as a slow
  // reader: its requests are then cancelled, and only their terminal
  // frames wait for it.
  int32_t client_backlog = 10000;
};

struct gateway_handle {
  gateway_actor actor;
  std::vector<std::string> endpoints;  // as bound (a wildcard port resolved)
};

// Binds the socket before the actor exists, so a bad or busy endpoint is
// reported to the caller (std::runtime_error naming it).
gateway_handle spawn_gateway(caf::actor_system& sys, std::shared_ptr<const serve_context> ctx,
                             gateway_options opts);

}  // namespace troupe
