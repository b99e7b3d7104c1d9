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

// One KV page outside a device arena: what the KV store's host and disk
// tiers hold (runtime/kvstore), keyed by its chained prefix hash within a
// KV space.
struct kv_page {
  uint64_t space = 0;           // kv_space_of(the arena's geometry)
  uint64_t hash = 0;            // the page's chained prefix hash (page_hash)
  uint64_t parent = 0;          // the previous page's hash; 0 for a prompt's first page
  int32_t depth = 0;            // the page's index in its prompt (0: the first page)
  std::vector<int32_t> tokens;  // the page's page_size tokens
  std::vector<uint8_t> bytes;   // one page as read_pages returns it

  uint64_t footprint() const { return bytes.size() + tokens.size() * sizeof(int32_t); }
};

// Every field of the geometry, hashed: arenas whose pages are
// interchangeable share a space.
uint64_t kv_space_of(const kv_geometry& g);

// One tier's counters (the kv_pool's stats, `admin kv`, metrics).
struct tier_stats {
  std::string name;        // "host" or "disk"
  uint64_t budget = 0;     // bytes it may hold
  uint64_t bytes = 0;      // bytes it holds
  int64_t pages = 0;       // pages it holds
  uint64_t hits = 0;       // pages found by lookups
  uint64_t misses = 0;     // lookups that ended at a page it lacked
  uint64_t bytes_in = 0;   // bytes stored
  uint64_t bytes_out = 0;  // bytes served
  uint64_t evictions = 0;  // pages that left for room
  uint64_t dropped = 0;    // pages refused or found damaged
  double read_ms = 0;      // time its lookups that found pages took (the disk's reads)
  // The chained prefix hashes it holds, of every space: the router's
  // global prefix index weighs a prompt's pages found here.
  std::vector<uint64_t> hashes;
  std::string check;  // its invariants: empty when they hold
};

// The whole store as `admin kv` shows it (one per process that hosts
// instances; each instance's stats carry its process's).
struct kv_store_stats {
  std::vector<tier_stats> tiers;  // host, then disk when there is one
  uint64_t offered_pages = 0;     // pages instances offered (put)
  uint64_t fetches = 0;           // fetch calls
  uint64_t fetched_pages = 0;     // pages a fetch answered with
  int64_t swaps = 0;              // swapped-out sequences' KV it holds (swap through the store)
  uint64_t swap_bytes = 0;        // their bytes (at most half the host budget)
  uint64_t swaps_kept = 0;        // swapped-out KV it took, since it started
  std::string check;              // the tiers' invariants: empty when they hold
};

// One link pages were pulled over: another process's store (named by its
// actor address), the pages it gave and the time its answers took, a failed
// pull counting its time and no page.  The router's per-link pull cost
// (runtime/service/placement pick_kv_pull).
struct kv_link_timing {
  std::string store;
  uint64_t pages = 0;
  double ms = 0;
  // < 0 before anything was measured; a link that failed every time costs
  // its time per page.
  double ms_per_page() const { return pages > 0 ? ms / double(pages) : ms > 0 ? ms : -1; }
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
// The geometry of a blob from its first bytes (the first chunk of a
// transfer), so a receiver refuses a blob for another arena before the
// rest arrives.  Throws kv_blob_error like decode_kv_blob.
kv_geometry peek_kv_blob_geometry(std::span<const uint8_t> head);

// Empty when a blob of geometry `blob` may be imported into an arena of
// geometry `here`; else the first mismatch, e.g. "head_dim: the blob has
// 48, this instance 64".
std::string geometry_mismatch(const kv_geometry& blob, const kv_geometry& here);

}  // namespace troupe
