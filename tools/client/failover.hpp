#pragma once
// Several endpoints of one cluster (issue 37): `troupe serve` processes
// that share the same instances.  The client talks to one of them; when it
// falls silent (pings unanswered for `lost_after`), the service is taken
// as lost, and the requests that had not ended are sent again, whole, to
// the next endpoint that answers and serves the same model.  Greedy and
// seeded requests come out the same there; a stream shown live restarts
// from its first token (the caller is told through on_failover).
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tools/client/client.hpp"

namespace troupe::client {

struct failover_options {
  // No message about any request this long while the server answers
  // pings: the open requests end with a client-side Error, as run() does.
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds probe{1000};       // silence before a ping is sent
  std::chrono::milliseconds lost_after{3000};  // silence (pings unanswered): the service is lost
  std::function<void(const wire::TokenChunk&)> on_chunk;
  // (lost endpoint, next endpoint or "" when none answers, requests sent again)
  std::function<void(const std::string&, const std::string&, size_t)> on_failover;
};

// "tcp://a:1,tcp://b:2" -> its endpoints (spaces trimmed, empty ones
// refused with client_error).
std::vector<std::string> split_endpoints(const std::string& list);

// The endpoint, from `start` on in turn, to talk to: every one is pinged at
// once; the first in that order that answers (within 100 ms of the fastest
// answer, and `wait` in all) and serves `*model` (empty: any, and then set
// to the one it serves); -1 when none does.  Endpoints ZeroMQ cannot dial
// are skipped.
int first_answering(const std::vector<std::string>& endpoints, size_t start,
                    std::chrono::milliseconds wait, std::string* model = nullptr);

// Runs the requests to completion as run() does, moving to another endpoint
// when the one in use is lost.  Throws client_error when no endpoint
// answers at the start; when none answers after a loss, the open requests
// end with an UNAVAILABLE Error.
std::vector<result> run_failover(const std::vector<std::string>& endpoints,
                                 const std::vector<wire::Generate>& requests,
                                 const failover_options& options);

}  // namespace troupe::client
