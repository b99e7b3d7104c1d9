#include "actors/wire_checks.hpp"

#include <google/protobuf/io/coded_stream.h>

#include <algorithm>

#include "messages/client.pb.h"
#include "runtime/text/unicode.hpp"

namespace troupe {

std::optional<utf8_fault> invalid_utf8_field(const void* data, size_t size) {
  wire::LenientClientMessage m;
  if (!m.ParseFromArray(data, static_cast<int>(size)) || !m.has_generate()) return std::nullopt;
  const auto& g = m.generate();
  utf8_fault f{"", g.request_id(), true};
  if (!unicode::is_valid_utf8(g.text())) f.field = "generate.text";
  for (int i = 0; f.field.empty() && i < g.stop_size(); ++i)
    if (!unicode::is_valid_utf8(g.stop(i))) f.field = "generate.stop[" + std::to_string(i) + "]";
  for (int i = 0; f.field.empty() && i < g.chat().messages_size(); ++i) {
    const auto& cm = g.chat().messages(i);
    if (!unicode::is_valid_utf8(cm.role()))
      f.field = "generate.chat.messages[" + std::to_string(i) + "].role";
    else if (!unicode::is_valid_utf8(cm.content()))
      f.field = "generate.chat.messages[" + std::to_string(i) + "].content";
  }
  if (f.field.empty()) return std::nullopt;
  return f;
}

std::optional<uint64_t> peek_generate_id(const void* data, size_t size) {
  google::protobuf::io::CodedInputStream in(static_cast<const uint8_t*>(data),
                                            static_cast<int>(std::min<size_t>(size, 64)));
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    const int field = static_cast<int>(tag >> 3), type = static_cast<int>(tag & 7);
    if (field == 1 && type == 0) {
      uint32_t v;
      if (!in.ReadVarint32(&v)) return std::nullopt;
    } else if (field == 2 && type == 2) {
      uint32_t len;
      uint64_t id;
      if (!in.ReadVarint32(&len) || in.ReadTag() != ((1u << 3) | 0u) || !in.ReadVarint64(&id))
        return std::nullopt;
      return id;
    } else {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace troupe
