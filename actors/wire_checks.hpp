#pragma once
// The gateway's look at a client frame that protobuf refused (or that is
// too large to parse): which text field is not UTF-8, and which request the
// frame was.  Plain functions of the frame's bytes, no CAF and no socket,
// so that tests/fuzz/fuzz_client_message.cpp runs them alone.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace troupe {

struct utf8_fault {
  std::string field;
  uint64_t id = 0;
  bool has_id = false;
};

// A frame protobuf refused: when it parses with its text fields as bytes,
// the field that is not UTF-8 and the request it belongs to.
std::optional<utf8_fault> invalid_utf8_field(const void* data, size_t size);

// The request id of a Generate frame the gateway refuses unparsed (too
// large, malformed), read from its first bytes: serializers write fields in
// number order, so protocol_version (1), then generate (2) with request_id
// (1) first.  The Error then belongs to that request, not to the connection.
std::optional<uint64_t> peek_generate_id(const void* data, size_t size);

}  // namespace troupe
