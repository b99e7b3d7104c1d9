#pragma once
// Requests the integration tests send again and again.
#include <cstdint>

#include "messages/client.pb.h"

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

}  // namespace troupe::testing
