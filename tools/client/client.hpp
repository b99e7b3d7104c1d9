#pragma once
// A C++ client for troupe's wire protocol (messages/client.proto): a ZeroMQ
// DEALER socket that sends ClientMessages and receives ServerMessages.  No
// actors, no engine: link troupe_client alone.  Requests may be pipelined;
// every reply names its request id.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "messages/client.pb.h"

namespace troupe::client {

// A frame the client cannot decode, or a socket that failed.
struct client_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class connection {
 public:
  // Connects (lazily, as ZeroMQ does) to tcp://host:port or ipc://path.
  explicit connection(const std::string& endpoint);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  // Sends one message (protocol_version set).
  void send(wire::ClientMessage msg);
  // Sends raw bytes as one frame: for tests of the server's error paths.
  void send_raw(std::string_view bytes);
  // The next message from the server, or nullopt when none came in time.
  std::optional<wire::ServerMessage> receive(std::chrono::milliseconds timeout);

  void generate(const wire::Generate& gen);
  void cancel(uint64_t request_id);
  // Round trip to the server; false when it did not answer in time.
  bool ping(std::chrono::milliseconds timeout);
  // The same, with the server's answer (model, version, admin port).
  std::optional<wire::Pong> pong(std::chrono::milliseconds timeout);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// What one request came to.
struct result {
  uint64_t request_id = 0;
  bool accepted = false;
  std::vector<int32_t> token_ids;
  std::string text;  // the concatenated text deltas
  std::vector<std::string> deltas;
  wire::Finished finished;  // reason FINISH_UNSPECIFIED if it ended in an Error
  std::optional<wire::Error> error;
  // When this client took the Accepted, and the last message (Finished or
  // Error), in ms since the Unix epoch (system clock); 0 until then.  Clocks
  // of processes on one machine agree, so requests of several clients can
  // be lined up.
  double accepted_unix_ms = 0;
  double finished_unix_ms = 0;
  bool done() const { return error.has_value() || finished.reason() != wire::FINISH_UNSPECIFIED; }
};

// Folds one server message into the result of the request it names
// (results indexed by request id); returns that request id, or nullopt for
// messages naming none (Pong, an Error without an id).
std::optional<uint64_t> apply(const wire::ServerMessage& msg,
                              std::function<result*(uint64_t)> find);

// Runs requests to completion on one connection, pipelined.  on_chunk sees
// every streamed chunk as it arrives.  Requests still open after `timeout`
// of silence end with a client-side Error.
std::vector<result> run(connection& conn, const std::vector<wire::Generate>& requests,
                        std::chrono::milliseconds timeout,
                        const std::function<void(const wire::TokenChunk&)>& on_chunk = {});

std::string to_string(wire::FinishReason r);  // "stop", "length", ...

// The host a client dials to reach a server endpoint's machine:
// tcp://HOST:PORT gives HOST (brackets of an IPv6 address dropped); a
// wildcard (*, 0.0.0.0, ::) or an ipc:// / inproc:// endpoint gives
// 127.0.0.1.  The admin actor is found there, on the port of the Pong.
std::string endpoint_host(const std::string& endpoint);

// Now on the system clock, in ms since the Unix epoch.
double unix_ms_now();

}  // namespace troupe::client
