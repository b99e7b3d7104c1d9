#pragma once
// The admin endpoint: how tools outside the process (troupe client admin,
// troupe shell) reach the admin actor.  A ZeroMQ ROUTER socket on loopback
// by default; each request is one JSON frame naming a command and carrying
// a secret, each reply one JSON frame (docs/security.md has the protocol).
//
// Why not CAF's middleman: its BASP layer allocates whatever payload a
// 32-byte header announces before anyone is authenticated (1 GiB per
// connection from any local process).  ZeroMQ refuses a frame larger than
// ZMQ_MAXMSGSIZE from its header alone, before allocating, so what an
// unauthenticated peer can make this endpoint hold is bounded.
#include <caf/all.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "messages/admin.hpp"
#include "net/admin_request.hpp"  // admin_command_is_read_only

namespace troupe {

struct admin_endpoint_options {
  std::string host = "127.0.0.1";
  int port = 0;                          // 0: one the OS picks
  std::string control_secret;            // every command
  std::string read_secret;               // read commands only (instances, requests, trace, kv)
  int64_t max_message_bytes = 64 << 10;  // larger frames drop the peer unread
  int poll_ms = 20;
  std::chrono::milliseconds call_timeout{10000};     // per admin-actor call
  nlohmann::json config = nlohmann::json::object();  // the service's effective config (`config`)
};

struct admin_endpoint_handle {
  caf::actor actor;
  int port = 0;  // the one bound
};

// Binds and spawns the endpoint (detached: it waits on its socket).  Throws
// std::runtime_error naming service.admin_port when it cannot bind.
admin_endpoint_handle spawn_admin_endpoint(caf::actor_system& sys, admin_actor admin,
                                           admin_endpoint_options opts);

}  // namespace troupe
