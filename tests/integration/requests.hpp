#pragma once
// Requests the integration tests send again and again.
#include <chrono>
#include <cstdint>

#include "messages/client.pb.h"
#include "tools/client/client.hpp"

namespace troupe::testing {

// 240 tokens of "Once upon a time" with EOS ignored: long enough to be
// caught mid-stream (cancel, migrate, drain) on stories15m.
inline wire::Generate long_request(uint64_t id) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text("Once upon a time");
  g.set_max_tokens(240);
  g.set_ignore_eos(true);
  return g;
}

// Applies the connection's messages to the results `find` names until
// `done()` holds; false when no message came for `quiet` first.
template <class Find, class Done>
bool receive_until(client::connection& c, Find&& find, Done&& done,
                   std::chrono::milliseconds quiet) {
  while (!done()) {
    auto m = c.receive(quiet);
    if (!m) return false;
    client::apply(*m, find);
  }
  return true;
}

}  // namespace troupe::testing
