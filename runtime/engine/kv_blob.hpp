#pragma once
// The KV blob (docs/architecture.md §4.9 "Export and import"): a sequence's
// KV pages as the device reads them, with a header that says what they are,
// so the sequence can continue on another instance (migration, the PD
// hand-off).  No sampler state: draws derive from the seed and the position.
// msgpack, so any node or tool can read it.  Import checks the header first:
// a blob from another model or geometry is refused with the mismatch named,
// never written into an arena.  Swap does not use it: a swapped-out
// sequence's pages are read into a plain byte vector the engine holds
// (runtime/engine/engine) and written back as they are.
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

// What the bytes of a page mean.  Two arenas can exchange pages only when
// every field is equal.
struct kv_geometry {
  std::string model_fingerprint;
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;  // tokens per page
  std::string dtype;      // "f16" or "f32"

  // Bytes of one page: K and V of every layer for page_size tokens.
  uint64_t page_bytes() const;
};

struct kv_blob {
  kv_geometry geometry;
  std::vector<int32_t> tokens;  // the tokens whose KV the pages hold, from position 0
  int32_t n_prompt = 0;         // how many of them are the prompt
  std::vector<uint8_t> pages;   // ceil(tokens / page_size) pages, as read_pages returns them
};

// A blob that cannot be read, or does not fit where it is going; what()
// names the field.
struct kv_blob_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<uint8_t> encode_kv_blob(const kv_blob& b);

// Throws kv_blob_error for bytes that are not a troupe KV blob of this
// format version, or whose page data does not match its header.
kv_blob decode_kv_blob(std::span<const uint8_t> bytes);

// Empty when a blob of geometry `blob` may be imported into an arena of
// geometry `here`; else the first mismatch, e.g. "head_dim: the blob has
// 48, this instance 64".
std::string geometry_mismatch(const kv_geometry& blob, const kv_geometry& here);

}  // namespace troupe
