#pragma once
// The page metadata of one device KV arena (docs/architecture.md
// §4.4 "KV pages"): page states and refcounts, one page table per sequence,
// the chained prefix-hash index of full pages, and LRU eviction of reusable
// pages.  Pure bookkeeping: no actors and no device.  Each instance's engine
// (runtime/engine/engine) owns one for its arena; the kv_pool actor wraps one too,
// though only a unit test spawns it today.  Whoever drives the device copies
// page data when an answer says so.
//
// Page states: free (nobody's), allocated (reserved outside any page table,
// e.g. while an imported sequence's KV is written), mapped (in at least one
// page table), reusable (in no page table, but its prefix hash still indexes
// it, so a later prompt with the same prefix can map it again).  Invariants,
// checked by check_invariants(): every page is in exactly one state; a
// page's refcount equals the number of page tables holding it; free +
// allocated + mapped + reusable == total.
#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace troupe {

enum class page_state : uint8_t { free, allocated, mapped, reusable };
const char* to_string(page_state s);

// Grow `seq`'s page table to hold positions [0, tokens_needed).  A sequence
// the pool does not know yet starts with an empty table.
struct alloc_request {
  uint64_t seq = 0;
  int32_t tokens_needed = 0;
};

// Copy-on-write: before the step's forward pass writes anything, copy the
// first `tokens` token slots (all layers, K and V) of page `src` to `dst`.
struct page_copy {
  uint64_t seq = 0;  // whose table gets `dst`: a failed copy fails this sequence
  int32_t src = 0;
  int32_t dst = 0;
  int32_t tokens = 0;
};

// A sequence's page table: positions p live in pages[p / page_size].
struct seq_pages {
  uint64_t seq = 0;
  int32_t n_tokens = 0;  // positions the table covers
  std::vector<int32_t> pages;
};

// The answer to allocate_step.  All or nothing: when !ok nothing changed.
struct step_allocation {
  bool ok = false;
  int32_t pages_short = 0;        // when !ok: pages the step lacked
  std::vector<seq_pages> tables;  // when ok: every request's full table, in request order
  std::vector<page_copy> copies;  // when ok: to run before the step's forward pass
};

// The answer to match_prefix: the new sequence's table so far.
struct prefix_match {
  int32_t cached_tokens = 0;  // prompt tokens whose KV is already in `pages`
  std::vector<int32_t> pages;
};

// A reusable page the pool evicted while it records evictions: what the
// KV store's host tier is offered (the caller reads the page's data before
// anything writes it).
struct evicted_page {
  int32_t page = 0;
  uint64_t hash = 0;
  uint64_t parent = 0;
  int32_t depth = 0;  // its index in the prompts it starts
  std::vector<int32_t> tokens;
};

struct pool_stats {
  int32_t page_size = 0;
  int32_t total = 0;
  int32_t free = 0;
  int32_t allocated = 0;
  int32_t mapped = 0;
  int32_t reusable = 0;
  int32_t sequences = 0;
  int64_t cached_tokens = 0;         // distinct token slots covered by some page table
  uint64_t prefix_queries = 0;       // match_prefix calls
  uint64_t prefix_query_tokens = 0;  // prompt tokens looked up
  uint64_t prefix_hit_tokens = 0;    // of those, tokens found cached
  uint64_t evictions = 0;            // reusable pages taken for new use
  uint64_t alloc_failures = 0;       // steps and reservations refused for lack of pages

  int32_t used() const { return allocated + mapped; }
  // Several arenas' counts and counters, added (the service's totals).
  pool_stats& operator+=(const pool_stats& o);
  double hit_rate() const;     // prefix_hit_tokens / prefix_query_tokens
  double utilization() const;  // cached_tokens / (used pages * page_size)
};

// Chained hash of one full page: `prev` is the previous page's hash (0 for
// the first page), `salt` the model's fingerprint, so two models never share
// pages.
uint64_t page_hash(uint64_t prev, const int32_t* tokens, int n, uint64_t salt);
// A salt from a model fingerprint string (device_info::model_fingerprint).
uint64_t fingerprint_salt(std::string_view fingerprint);

// Misuse (an unknown or duplicate sequence, a negative size, a page in the
// wrong state) throws std::invalid_argument naming the sequence or page, and
// changes nothing.  Running out of pages is no error: see allocate_step.
class page_pool {
 public:
  page_pool(int n_pages, int page_size, uint64_t model_salt);

  // Grows every requested table at once, or none: when the free and
  // reusable pages together do not suffice, returns ok = false with the
  // shortfall.  Takes free pages first and evicts reusable pages, least
  // recently released first, only when no free page is left.  A sequence
  // whose partially filled last page is shared (after fork) or hashed (after
  // truncate) gets a fresh copy of it first (see page_copy).
  step_allocation allocate_step(const std::vector<alloc_request>& reqs);

  // Starts sequence `seq` (new, or with an empty table) on `prompt`: maps
  // the cached full pages of the prompt's longest cached prefix into its
  // table (reusable pages become mapped again).  Never covers the whole
  // prompt, so at least one token is left to compute and yield logits.
  prefix_match match_prefix(uint64_t seq, const std::vector<int32_t>& prompt);

  // `tokens` are the sequence's tokens from position 0 whose KV the device
  // has computed; indexes its newly completed full pages for later prompts.
  // Returns the number of pages newly indexed.
  int32_t commit_full_pages(uint64_t seq, const std::vector<int32_t>& tokens);

  // `child` (new) shares every page of `parent`; returns the pages shared.
  int32_t fork(uint64_t parent, uint64_t child);

  // Drops the sequence's table: pages no table holds any more become
  // reusable when indexed, else free.  Preemption by recompute is the same.
  // Unknown sequences are ignored (finish and cancel may race).  Returns the
  // number of pages the table held.
  int32_t free_sequence(uint64_t seq);

  // Shortens the table to n_tokens positions; returns the pages dropped.
  int32_t truncate(uint64_t seq, int32_t n_tokens);

  // The table, for swap and transfer: the caller copies these pages' data
  // and then frees the sequence.
  seq_pages export_pages(uint64_t seq) const;

  // Import path: reserve n pages (allocated, in no table; empty when short),
  // write their data, then attach them as a new sequence's table, or give
  // them back with unreserve.
  std::vector<int32_t> reserve(int32_t n);
  void attach(const seq_pages& table);
  int32_t unreserve(const std::vector<int32_t>& pages);

  // KV store tiers: while on, every indexed page evicted for new use is
  // kept (take_evicted) so its data can be offered to a lower tier.
  void record_evictions(bool on) { record_evictions_ = on; }
  std::vector<evicted_page> take_evicted() { return std::exchange(evicted_, {}); }
  bool has_evicted() const { return !evicted_.empty(); }
  // The chained hashes of the prompt's full pages that match_prefix may
  // map (not the page holding the last token).
  std::vector<uint64_t> prompt_hashes(const std::vector<int32_t>& prompt) const;
  // How many of those leading pages the index holds now (mapping nothing).
  int32_t cached_pages(const std::vector<int32_t>& prompt) const;
  // A reserved page whose data comes from a lower tier (the caller writes
  // it before any step reads it) becomes the next full page of `seq`'s
  // table, which holds only full, hashed pages, and joins the index under
  // `hash` (unless another page holds that hash already).
  void append_loaded(uint64_t seq, int32_t page, uint64_t hash, uint64_t parent, int32_t depth,
                     const std::vector<int32_t>& tokens);
  // The page's data is not what its hash says (a lower tier's write
  // failed): it leaves the index; reusable, it becomes free.
  void forget(int32_t page);
  // True when `page` is indexed under `hash`.
  bool indexes(int32_t page, uint64_t hash) const;

  int n_pages() const { return static_cast<int>(pages_.size()); }
  int page_size() const { return page_size_; }
  int32_t pages_for(int64_t tokens) const;
  int32_t available() const;  // free + reusable: what allocation can take
  // The chained hashes of every indexed (cached) full page: what a router
  // compares a prompt's page hashes with (runtime/service/placement, prefix).
  std::vector<uint64_t> indexed_hashes() const;
  bool has_sequence(uint64_t seq) const { return seqs_.count(seq) != 0; }
  // The chained hashes of the sequence's leading full pages known so far.
  const std::vector<uint64_t>& chain(uint64_t seq) const;
  const std::vector<int32_t>& table(uint64_t seq) const;
  page_state state(int32_t page) const;
  int32_t refcount(int32_t page) const;
  pool_stats stats() const;

  // Empty when every invariant holds, else the first violation found.
  std::string check_invariants() const;

 private:
  struct page_meta {
    page_state state = page_state::free;
    int32_t refcount = 0;
    bool hashed = false;  // indexed by `hash` in index_
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    int32_t depth = 0;                     // its index in the prompts it starts
    std::list<int32_t>::iterator lru_pos;  // valid while reusable
  };
  struct sequence {
    int32_t n_tokens = 0;
    std::vector<int32_t> pages;
    std::vector<uint64_t> chain;  // hashes of the leading full pages whose tokens are known
  };

  const sequence& find(uint64_t seq, const char* op) const;
  sequence& find(uint64_t seq, const char* op);
  void check_page(int32_t page, const char* op) const;
  void set_state(int32_t page, page_state s);
  int32_t take_page(page_state s);  // a free page, else the LRU reusable one
  void map_page(int32_t page);      // one more table holds it
  void unmap_page(int32_t page);    // one table fewer holds it
  bool needs_copy(const sequence& s, int32_t shared_released) const;

  int page_size_;
  uint64_t salt_;
  std::vector<page_meta> pages_;
  std::vector<int32_t> page_tokens_;             // tokens of indexed pages, to verify hash hits
  std::vector<int32_t> free_list_;               // stack, so recently freed pages are reused first
  std::list<int32_t> lru_;                       // reusable pages, least recently released first
  std::unordered_map<uint64_t, int32_t> index_;  // prefix hash -> page
  std::unordered_map<uint64_t, sequence> seqs_;
  bool record_evictions_ = false;
  std::vector<evicted_page> evicted_;
  int32_t count_[4] = {0, 0, 0, 0};  // pages per state
  pool_stats counters_;              // the monotonic counters of stats()
};

}  // namespace troupe
