#pragma once
// The engine of one replica, as a plain class: the sequences it holds, each
// in one state at a time, the step plan (runtime/engine/scheduler), admission and
// preemption against the KV page pool (runtime/engine/page_pool), sampling and
// stop conditions, n-gram drafts, the TPOT guard, step overlap, KV export
// and import, and lockstep rounds in a data-parallel group.
//
// It talks to nothing: what it wants done outside (a forward pass on the
// device, a page read or write, tokens for a sequence's stream) it appends
// to its outbox as commands, in the order they must happen, and the caller
// carries them out (actors/instance.cpp sends them as messages; a test
// records them).  What comes back (a step's result, pages read) goes in
// through the on_* methods.  The device serves its messages in order, and
// the engine relies on that: a page read issued before a step sees the
// pages before the step reuses them.
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "runtime/engine/engine_types.hpp"
#include "runtime/engine/forward_batch.hpp"
#include "runtime/engine/kv_blob.hpp"
#include "runtime/engine/page_pool.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/scheduler.hpp"
#include "runtime/text/token_constraint.hpp"

namespace troupe {

// Where a sequence is, one place at a time.  Running means prefilling or
// decoding; the scheduler sees running and queued sequences (waiting,
// swapped, importing) and never those whose KV is in flight.
enum class seq_state : uint8_t {
  waiting,       // queued with no KV of its own: new, or preempted to be recomputed
  prefilling,    // running, more than one token left to compute
  decoding,      // running, one token a step
  swapping_out,  // preempted, its KV being read into the host tier
  swapped,       // queued, its KV in the host tier (`blob`)
  exporting,     // its KV being read for another instance; leaves when read
  parked,        // prefill-only (disaggregation): first token out, KV held for export
  importing,     // queued, its KV from another instance (`blob`)
  finished,      // out of the engine, its last batch sent
};

// The commands an engine asks its caller to carry out, in order.
namespace engine_cmd {
// Run a forward pass; answer with on_step_done or on_step_failed.  A dummy
// step (lockstep, nothing to compute) is answered with on_dummy_done.
struct forward {
  uint64_t step = 0;
  forward_batch batch;
  bool dummy = false;
};
// Copy KV pages (copy-on-write of a shared partial page); on failure, fail
// the owners.
struct copy_pages {
  std::vector<int32_t> src, dst;
  std::vector<uint64_t> owners;
};
// Read a preempted sequence's pages into the host tier; answer with
// on_swapped_out or on_swap_out_failed.
struct swap_out {
  uint64_t key = 0;
  std::vector<int32_t> pages;
};
// Swap through the KV store: a swapped-out sequence whose KV the
// instance put in its process's kv_pool (on_swapped_to_store) is fetched
// back once the arena has room for it (answer: on_swap_fetched or
// on_swap_fetch_failed); one that ends there is dropped from the store.
struct swap_fetch {
  uint64_t key = 0;
};
struct swap_drop {
  uint64_t key = 0;
};
// Write host-tier (or imported) KV back into pages; on failure, fail(key).
struct swap_in {
  uint64_t key = 0;
  std::vector<int32_t> pages;
  std::vector<uint8_t> data;
};
// Read an exporting sequence's pages into its blob; then end_export(key).
struct export_read {
  uint64_t key = 0;
  std::vector<int32_t> pages;
};
// KV store: read these pages (indexed pages the pool evicted, `meta` in
// the same order) and offer them to the process's kv_pool.  It comes
// before any command that may write them; its failure costs nothing but
// the offer.
// A copy (copy_of != 0): full pages of running sequence `copy_of`, read
// the same way and put to the kv_pool its request keeps copies in.
struct spill {
  std::vector<int32_t> pages;
  std::vector<evicted_page> meta;
  uint64_t copy_of = 0;
};
// KV store: write a prompt prefix's pages loaded from a tier into these
// arena pages (already indexed: they come before any step that reads
// them); on failure, on_load_failed(pages).
struct load {
  std::vector<int32_t> pages;
  std::vector<uint8_t> data;
};
// Tokens for a sequence's stream.  A batch whose finish is not none is the
// sequence's last: the engine holds nothing of it afterwards.
struct emit {
  uint64_t key = 0;
  token_batch batch;
};
// Tell a sequence's stream it was preempted (swapped: its KV is in the
// host tier; else it is recomputed).  It resumes by itself.
struct preempted {
  uint64_t key = 0;
  uint64_t id = 0;
  bool swapped = false;
};
// Lockstep: ask the group for a round (answer: on_round), and report that
// the step of a round ended after `ms`.
struct ask_round {};
struct round_done {
  uint64_t round = 0;
  double ms = 0;
  bool dummy = false;
};
}  // namespace engine_cmd

using engine_command =
    std::variant<engine_cmd::forward, engine_cmd::copy_pages, engine_cmd::swap_out,
                 engine_cmd::swap_in, engine_cmd::export_read, engine_cmd::spill, engine_cmd::load,
                 engine_cmd::swap_fetch, engine_cmd::swap_drop, engine_cmd::emit,
                 engine_cmd::preempted, engine_cmd::ask_round, engine_cmd::round_done>;

// A sequence as the data-parallel group sees it, for moves.
struct engine_seq_view {
  uint64_t key = 0;
  uint64_t id = 0;
  int64_t tokens = 0;     // prompt + generated
  bool decoding = false;  // running one token a step
  int32_t left = 0;       // tokens it may still generate
  bool queued = false;    // waiting with no KV: moving it elsewhere costs only a placement
};

class engine {
 public:
  engine(device_info info, instance_options opts);

  // The commands appended since the last call, oldest first.
  std::vector<engine_command> take_commands();

  // --- Requests.  Each returns "" (done) or why it was refused. ---

  // A new sequence, queued.  `key` names it in commands from now on;
  // `ahead` is how many sequences wait before it.  `tier`: pages of its
  // prompt's prefix the KV store holds, kept with it while it waits; its
  // admission writes those that continue the arena's cached run into pages
  // of its own (a load command) instead of computing them.
  std::string enqueue(sequence_spec r, uint64_t& key, int32_t& ahead,
                      std::vector<kv_page> tier = {});
  // A sequence whose first `n_kv` tokens' KV comes in a blob (migration,
  // disaggregation): queued as a swapped-out one.
  std::string import(sequence_spec r, const std::vector<uint8_t>& blob, uint64_t& key,
                     int32_t& n_kv);
  // Export request `id`: the blob's header and tokens.  With no pages to
  // read, the blob is whole and the sequence has left; else an export_read
  // command asks for them, and the sequence leaves at end_export(key).
  struct export_start {
    uint64_t key = 0;
    kv_blob blob;
    std::vector<int32_t> pages;
  };
  std::string begin_export(uint64_t id, export_start& out);
  // The pages were read (or the read failed): true when the sequence was
  // still exporting and has now left.
  bool end_export(uint64_t key);
  // What a fetch from the KV store must ask for: the prompt's page hashes
  // (prefix_hashes), and how many leading ones the arena holds now.
  std::vector<uint64_t> prefix_hashes(const std::vector<int32_t>& prompt,
                                      int32_t& cached_pages) const;
  uint64_t kv_space() const { return kv_space_; }
  // What this arena's pages are (a blob's header must say the same).
  kv_geometry geometry() const { return arena_geometry(); }
  // The time a fetch from the store took (the router weighs tier hits by
  // the time per page loaded).
  void note_tier_load_ms(double ms) { counters_.tier_load_ms += ms; }
  // Cancel: the sequence's last batch (aborted) is emitted.  False when no
  // sequence of that id is here.
  bool abort(uint64_t id);
  void abort_key(uint64_t key);  // the same, by key (its stream went away)
  // Fail one sequence with `why` (emitted as an error batch).
  void fail(uint64_t key, const std::string& why);
  std::string preempt_request(uint64_t id);
  // Live limits: max_seqs, max_batch_tokens, chunk_size.
  std::string set_limit(const std::string& name, int32_t value, int32_t& old);
  std::string set_role(const std::string& role, std::string& old);

  // --- What the device answered. ---
  void on_step_done(uint64_t step, forward_result& r);
  void on_step_failed(uint64_t step, const std::string& why);
  void on_dummy_done();
  void on_swapped_out(uint64_t key, std::vector<uint8_t> data);
  void on_swap_out_failed(uint64_t key, const std::string& why);
  // Swap through the KV store: the swapped-out KV went to the process's
  // kv_pool instead of the engine's memory; it comes back (swap_fetch)
  // before the sequence is admitted again.  A failed fetch recomputes.
  void on_swapped_to_store(uint64_t key);
  void on_swap_fetched(uint64_t key, std::vector<uint8_t> data);
  void on_swap_fetch_failed(uint64_t key, const std::string& why);
  // A load command was written, or failed: then its pages (those still
  // indexed under what was loaded) leave the index, and sequences that
  // mapped them meanwhile fail.
  void on_loaded(const std::vector<int32_t>& pages);
  void on_load_failed(const std::vector<int32_t>& pages, const std::string& why);

  // --- Lockstep in a data-parallel group's rounds. ---
  // Reserves the page dummy steps write, then steps (asking for a round).
  std::string join_group();
  void leave_group();
  bool in_group() const { return lockstep_; }
  void on_round(uint64_t round);

  // Plans and sends the next step if it can (the requests above call it).
  void step();

  // --- What it holds. ---
  instance_stats stats() const;
  std::vector<engine_seq_view> sequences() const;
  std::vector<std::pair<uint64_t, uint64_t>> ids() const;  // every sequence: key, request id
  bool has_key(uint64_t key) const { return seqs_.count(key) != 0; }
  const device_info& info() const { return info_; }
  const instance_options& options() const { return opts_; }
  const page_pool& pool() const { return *pool_; }
  size_t in_flight() const { return inflight_.size(); }

 private:
  // A sequence the engine holds.  Its key (not the request id, which a
  // client may reuse after a cancel) names it to the scheduler, the page
  // pool, in-flight steps and the commands.
  struct live_seq {
    sequence_spec req;
    uint64_t key = 0;
    uint64_t order = 0;           // arrival, for the scheduler
    std::vector<int32_t> tokens;  // prompt, then generated
    // With image rows: `tokens` as the prefix cache keys them (keyed_tokens),
    // built at the first use and extended as tokens are generated.
    std::vector<int32_t> keyed;
    int32_t n_prompt = 0;
    int32_t computed = 0;         // tokens whose KV is stored (arena, or host tier when swapped)
    int32_t pages = 0;            // its page table's size
    int32_t committed_pages = 0;  // full pages offered to the prefix index
    int32_t copied_pages = 0;     // leading full pages copied to its copy store (kv_copy_pages)
    seq_state state = seq_state::waiting;
    bool first_admission = true;
    int32_t prompt_cached = 0;  // prompt tokens the first admission found cached
    int32_t tier_tokens = 0;    // prompt tokens its admission loaded from the KV store
    std::vector<kv_page> tier;  // the store's pages of its prompt, until its first admission
    bool reported = false;      // the first batch (which carries prompt_cached) went out
    std::vector<uint8_t> blob;  // its KV while swapped or importing
    // Swapped, its KV in the KV store rather than `blob`; being fetched.
    bool in_store = false;
    bool fetching = false;
    sampler smp;
    // Structured output: the compiled constraint and where the output is in
    // it (the engine shares one per pattern among its sequences).
    std::shared_ptr<token_constraint> constraint;
    int constraint_state = -1;
    double deadline = 0;    // ms since the engine started: its first token is due (0: none)
    double arrived_ms = 0;  // ms since the engine started, when it was enqueued
    // The output-length predictor's class and its prediction at arrival
    // (a length bucket; -1: none made, as for embeddings).
    std::string length_class;
    int predicted_bucket = -1;
    // Speculative decoding's draft cap, adapted to how well drafts do for
    // this sequence: doubled (up to what the request asks) when a whole
    // draft is accepted, halved when none of it is; at 0 the sequence rests
    // (no drafts) for draft_rest steps, then tries one token again.
    // Verifying rows costs compute, so text that does not repeat itself
    // soon stops paying for it.
    int32_t draft_cap = 1 << 20;
    // An embedding request: the sum of its rows' normed hidden states so
    // far (rows [0, computed) of its tokens; reset when it recomputes).
    std::vector<double> pooled;
    int32_t draft_rest = 0;
    // Bumped at each preemption: a chunk planned before it (in a step still
    // on the device) no longer describes the sequence, and its result is
    // dropped, even once the sequence runs again.
    uint32_t epoch = 0;

    live_seq(sequence_spec r, uint64_t k, uint64_t o);
    int32_t generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
    bool running() const { return state == seq_state::prefilling || state == seq_state::decoding; }
    bool has_blob() const { return state == seq_state::swapped || state == seq_state::importing; }
    bool schedulable() const {
      return state != seq_state::swapping_out && state != seq_state::exporting &&
             state != seq_state::parked && !in_store;
    }
    bool holds_pages() const { return running() || state == seq_state::parked; }
    // Running: prefilling until only the last token (whose logits give the
    // next one) is left.
    void run() {
      state = computed + 1 >= static_cast<int32_t>(tokens.size()) ? seq_state::decoding
                                                                  : seq_state::prefilling;
    }
  };

  // A step sent to the device: running, or queued behind the one running
  // (step overlap).
  struct inflight_step {
    uint64_t id = 0;
    std::vector<step_chunk> chunks;
    std::vector<uint32_t> epochs;  // each chunk's sequence's epoch when planned
    size_t n_decode = 0;           // chunks [0, n_decode) are decode rows
    // Step overlap: per chunk, the index of the token the device draws for
    // it after the step (-1: none).  When every chunk that samples is drawn,
    // the step is chainable: the next one may be planned and sent while it
    // runs.
    std::vector<int32_t> drawn;
    std::vector<bool> embeds;  // per chunk: an embedding's rows (hidden states, no logits)
    bool chainable = false;
    std::chrono::steady_clock::time_point sent;
  };

  live_seq take_out(uint64_t key);
  void finish(uint64_t key, token_batch last);
  template <class F>
  void guarded(uint64_t key, const char* what, F&& f);
  finish_reason stop_reason(const live_seq& s, int32_t token) const;
  void preempt(uint64_t key);
  void admit(uint64_t key);
  // The waiting sequences the admission policy lets the scheduler admit,
  // in its order (runtime/engine/admission); as given when it has none.
  void order_admissions(std::vector<sched_seq>& waiting);
  sched_seq describe(const live_seq& s) const;
  void make_room(const std::vector<step_chunk>& chunks, int32_t short_by,
                 std::unordered_set<uint64_t>& preempted_now);
  void add_drafts(const step_plan& plan, std::vector<step_chunk>& chunks);
  bool has_work() const;
  void report_round(double ms, bool dummy);
  void dummy_step(bool had_work);
  bool busy() const;
  bool may_plan_ahead() const;
  bool drawable(const live_seq& s, const step_chunk& c) const;
  bool ends_at_next_token(const live_seq& s) const;
  void guard_tpot(const std::vector<step_chunk>& chunks, size_t n_decode, double ms);
  void check_draw(const step_chunk& c, int32_t dev);
  int32_t sample_next(live_seq& s, std::span<const float> logits, token_batch& out);
  void pool_rows(const step_chunk& c, const forward_result& r, size_t first_hidden);
  void advance(const step_chunk& c, bool decode, const forward_result& r, size_t logits_row,
               int32_t drawn);
  std::string check_request(const sequence_spec& r) const;
  std::string constrain(const sequence_spec& r, std::shared_ptr<token_constraint>& c, int& state);
  // Whether s reuses and offers prefix-cache pages (image rows too: their
  // pages are keyed by the image, cache_tokens).
  bool caches_prefix(const live_seq&) const { return opts_.prefix_caching; }
  // The tokens s's pages are keyed by in the prefix index and the KV store:
  // its tokens, with image placeholders standing for their image.
  const std::vector<int32_t>& cache_tokens(live_seq& s) const;
  live_seq& add_sequence(sequence_spec r);
  kv_geometry arena_geometry() const;
  void spill_evicted();
  void copy_out(live_seq& s);
  void fetch_stored();
  void load_from_tier(live_seq& s);
  template <class C>
  void out(C c) {
    spill_evicted();  // evicted pages are read before anything writes them
    outbox_.emplace_back(std::move(c));
  }

  device_info info_;
  instance_options opts_;
  std::unique_ptr<page_pool> pool_;
  uint64_t kv_space_ = 0;  // kv_space_of(arena_geometry()): the KV store's key space
  // Arena pages a load command writes, not answered yet, and the hash each
  // was loaded under.
  std::unordered_map<int32_t, uint64_t> loading_;
  int32_t max_len_ = 0;                          // tokens one sequence may reach: context and arena
  std::unordered_map<uint64_t, live_seq> seqs_;  // by key
  std::unordered_map<uint64_t, uint64_t> keys_;  // request id -> key
  uint64_t next_key_ = 1;
  // Steps on the device, oldest first: one, or with step overlap two (the
  // second planned while the first runs, its placeholders filled there).
  std::deque<inflight_step> inflight_;
  uint64_t next_step_ = 1;
  std::chrono::steady_clock::time_point last_result_;  // of the last step that answered
  bool dummy_running_ = false;                         // a lockstep dummy step is on the device
  bool dummy_had_work_ = false;                        // it had work when its round began
  std::chrono::steady_clock::time_point dummy_start_;
  instance_stats counters_;
  // SLO ordering and static batches (runtime/engine/admission): the
  // output-length predictor, trained on this engine's finished sequences,
  // and the static batch running.
  output_length_predictor lengths_;
  admission_state admission_;
  std::deque<step_timing> recent_steps_;  // the last opts_.kept_steps
  std::unordered_map<std::string, std::shared_ptr<token_constraint>> constraints_;  // by pattern
  std::chrono::steady_clock::time_point born_ = std::chrono::steady_clock::now();
  // Lockstep in a group's rounds; off: it steps freely.
  bool lockstep_ = false;
  uint64_t granted_ = 0;             // the round it may step in now (0: none)
  uint64_t stepping_ = 0;            // the round whose step is on the device (0: none)
  bool asked_ = false;               // a round asked for, not granted yet
  std::vector<int32_t> dummy_page_;  // the KV page dummy steps write
  std::vector<engine_command> outbox_;
};

}  // namespace troupe
