// troupe::decode_kv_blob (runtime/engine/kv_blob): the input is a blob as it
// arrives from another instance or node; and the same bytes as a KV store
// page file read from disk (runtime/kvstore/page_file).  kv_blob_error is
// the documented error channel of both; what decodes must encode back to
// the same thing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "runtime/engine/kv_blob.hpp"
#include "runtime/kvstore/page_file.hpp"

namespace {

void page_file(const uint8_t* data, size_t size) {
  troupe::kv_page p;
  try {
    p = troupe::decode_page_file(std::span<const uint8_t>(data, size));
  } catch (const troupe::kv_blob_error&) {
    return;
  }
  const auto again = troupe::decode_page_file(troupe::encode_page_file(p));
  if (again.hash != p.hash || again.parent != p.parent || again.depth != p.depth ||
      again.tokens != p.tokens || again.bytes != p.bytes || again.space != p.space)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  page_file(data, size);
  troupe::kv_blob b;
  try {
    b = troupe::decode_kv_blob(std::span<const uint8_t>(data, size));
  } catch (const troupe::kv_blob_error&) {
    return 0;
  }
  // What decodes is self-consistent: it round-trips and matches itself.
  const auto again = troupe::decode_kv_blob(troupe::encode_kv_blob(b));
  if (again.tokens != b.tokens || again.pages != b.pages || again.n_prompt != b.n_prompt ||
      !troupe::geometry_mismatch(again.geometry, b.geometry).empty())
    std::abort();
  return 0;
}
