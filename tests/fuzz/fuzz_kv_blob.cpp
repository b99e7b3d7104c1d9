// troupe::decode_kv_blob (runtime/engine/kv_blob): the input is a blob as it
// arrives from another instance or node.  kv_blob_error is the documented
// error channel; a blob that decodes must encode back to the same blob.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "runtime/engine/kv_blob.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
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
