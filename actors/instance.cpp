#include "actors/instance.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "messages/dp_group.hpp"
#include "runtime/elapsed.hpp"
#include "runtime/kv_blob.hpp"
#include "runtime/ngram_draft.hpp"
#include "runtime/page_pool.hpp"
#include "runtime/sampler.hpp"
#include "runtime/step_overlap.hpp"
#include "runtime/token_constraint.hpp"

namespace troupe {

namespace {

// Where a sequence is, one place at a time (DESIGN.md §3).  Running means
// prefilling or decoding; the scheduler sees running and queued sequences
// (waiting, swapped, importing) and never those whose KV is in flight.
enum class seq_state : uint8_t {
  waiting,       // queued with no KV of its own: new, or preempted to be recomputed
  prefilling,    // running, more than one token left to compute
  decoding,      // running, one token a step
  swapping_out,  // preempted, its KV being read into the host tier
  swapped,       // queued, its KV in the host tier (`blob`)
  exporting,     // its KV being read for another instance; leaves when read
  parked,        // prefill-only (disaggregation): first token out, KV held for export
  importing,     // queued, its KV from another instance (`blob`)
  finished,      // out of the instance, its last batch sent
};

// A sequence the instance holds.  Its key (not the request id, which a
// client may reuse after a cancel) names it to the scheduler, the page pool
// and in-flight steps.
struct live_seq {
  sequence_request req;
  uint64_t key = 0;
  uint64_t order = 0;           // arrival, for the scheduler
  std::vector<int32_t> tokens;  // prompt, then generated
  int32_t n_prompt = 0;
  int32_t computed = 0;         // tokens whose KV is stored (arena, or host tier when swapped)
  int32_t pages = 0;            // its page table's size
  int32_t committed_pages = 0;  // full pages offered to the prefix index
  seq_state state = seq_state::waiting;
  bool first_admission = true;
  int32_t prompt_cached = 0;  // prompt tokens the first admission found cached
  bool reported = false;      // the first batch (which carries prompt_cached) went out
  std::vector<uint8_t> blob;  // its KV while swapped or importing
  sampler smp;
  // Structured output: the compiled constraint and where the output is in
  // it (the instance shares one per pattern among its sequences).
  std::shared_ptr<token_constraint> constraint;
  int constraint_state = -1;

  live_seq(sequence_request r, uint64_t k, uint64_t o)
      : req(std::move(r)), key(k), order(o), smp(req.sampling) {
    tokens = req.prompt;
    n_prompt = static_cast<int32_t>(tokens.size());
    tokens.insert(tokens.end(), req.generated.begin(), req.generated.end());
  }
  int32_t generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  bool running() const { return state == seq_state::prefilling || state == seq_state::decoding; }
  bool has_blob() const { return state == seq_state::swapped || state == seq_state::importing; }
  bool schedulable() const {
    return state != seq_state::swapping_out && state != seq_state::exporting &&
           state != seq_state::parked;
  }
  bool holds_pages() const { return running() || state == seq_state::parked; }
  double deadline = 0;  // ms since the instance started: its first token is due (0: none)
  // Speculative decoding's draft cap, adapted to how well drafts do for
  // this sequence: doubled (up to what the request asks) when a whole draft
  // is accepted, halved when none of it is; at 0 the sequence rests (no
  // drafts) for draft_rest steps, then tries one token again.  Verifying
  // rows costs compute, so text that does not repeat itself soon stops
  // paying for it.
  int32_t draft_cap = 1 << 20;
  int32_t draft_rest = 0;
  // Bumped at each preemption: a chunk planned before it (in a step still
  // on the device) no longer describes the sequence, and its result is
  // dropped, even once the sequence runs again.
  uint32_t epoch = 0;
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
  // Step overlap: per chunk, the index of the token the device draws for it
  // after the step (-1: none).  When every chunk that samples is drawn, the
  // step is chainable: the next one may be planned and sent while it runs.
  std::vector<int32_t> drawn;
  bool chainable = false;
  std::chrono::steady_clock::time_point sent;
};

struct instance_state {
  // Not an aggregate: CAF would construct it from the actor's self pointer.
  instance_state() = default;

  device_actor dev;
  device_info info;
  instance_options opts;
  std::unique_ptr<page_pool> pool;
  int32_t max_len = 0;                          // tokens one sequence may reach: context and arena
  std::unordered_map<uint64_t, live_seq> seqs;  // by key
  std::unordered_map<uint64_t, uint64_t> keys;  // request id -> key
  // Sinks the instance monitors, with their sequences' keys: a sink that
  // dies (its request ended whatever the interleaving, or its node went)
  // takes its sequences with it.
  std::unordered_map<caf::actor_addr, std::vector<uint64_t>> by_sink;
  uint64_t next_key = 1;
  // Steps on the device, oldest first: one, or with step overlap two (the
  // second planned while the first runs, its placeholders filled there).
  std::deque<inflight_step> inflight;
  uint64_t next_step = 1;
  std::chrono::steady_clock::time_point last_result;  // of the last step that answered
  bool dummy_running = false;                         // a lockstep dummy step is on the device
  std::chrono::steady_clock::time_point dummy_start;
  instance_stats counters;
  std::deque<step_timing> recent_steps;  // the last opts.kept_steps
  std::unordered_map<std::string, std::shared_ptr<token_constraint>> constraints;  // by pattern
  std::chrono::steady_clock::time_point born = std::chrono::steady_clock::now();
  // Lockstep in a dp_group's rounds (dpjoin); a null group: it steps freely.
  dp_group_actor group;
  uint64_t group_id = 0;
  uint64_t granted = 0;             // the round it may step in now (0: none)
  uint64_t stepping = 0;            // the round whose step is on the device (0: none)
  bool asked = false;               // dpready sent, its go not come yet
  std::vector<int32_t> dummy_page;  // the KV page dummy steps write
  static inline const char* name = "instance";
};

using self_ptr = instance_actor::stateful_pointer<instance_state>;

void step(self_ptr self);

void forget_sink(self_ptr self, const caf::actor_addr& sink, uint64_t key) {
  auto it = self->state.by_sink.find(sink);
  if (it == self->state.by_sink.end()) return;
  auto& keys = it->second;
  keys.erase(std::remove(keys.begin(), keys.end(), key), keys.end());
  if (keys.empty()) {
    self->demonitor(sink);
    self->state.by_sink.erase(it);
  }
}

// Ends a sequence in the order DESIGN.md gives for finish and cancel alike:
// out of the scheduler, then the stream's last batch, then its pages.
//
// take_out is the first part: the sequence leaves the maps (the scheduler
// no longer sees it); its pages stay until the caller frees them.
live_seq take_out(self_ptr self, uint64_t key) {
  auto& st = self->state;
  auto it = st.seqs.find(key);
  live_seq s = std::move(it->second);
  st.seqs.erase(it);
  st.keys.erase(s.req.id);
  forget_sink(self, s.req.sink.address(), key);
  st.counters.swap_bytes -= s.blob.size();
  s.state = seq_state::finished;
  return s;
}

void finish(self_ptr self, uint64_t key, token_batch last) {
  auto& st = self->state;
  if (!st.seqs.count(key)) return;
  live_seq s = take_out(self, key);
  if (last.finish == finish_reason::aborted)
    ++st.counters.aborted;
  else
    ++st.counters.finished;
  self->send(s.req.sink, tokens_atom::value, std::move(last));
  st.pool->free_sequence(key);
}

void fail(self_ptr self, uint64_t key, const std::string& why) {
  auto it = self->state.seqs.find(key);
  if (it == self->state.seqs.end()) return;
  spdlog::warn("instance: request {} failed: {}", it->second.req.id, why);
  token_batch last;
  last.id = it->second.req.id;
  last.finish = finish_reason::error;
  last.error = why;
  finish(self, key, std::move(last));
}

// Runs one sequence's bookkeeping; an exception in it ends that sequence
// with an error naming what failed, and the instance goes on with the rest.
template <class F>
void guarded(self_ptr self, uint64_t key, const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fail(self, key, std::string(what) + ": " + e.what());
  }
}

finish_reason stop_reason(const instance_state& st, const live_seq& s, int32_t token) {
  const auto& eog = st.opts.eog_tokens;
  // A constraint lets the end through only where the output may end, so
  // there it ends the output even with ignore_eos.
  if ((!s.req.ignore_eos || s.constraint) && std::find(eog.begin(), eog.end(), token) != eog.end())
    return finish_reason::eos;
  const auto& stop = s.req.stop_tokens;
  if (std::find(stop.begin(), stop.end(), token) != stop.end()) return finish_reason::stop_token;
  if (s.generated() >= s.req.max_tokens) return finish_reason::max_tokens;
  if (static_cast<int32_t>(s.tokens.size()) >= st.max_len) return finish_reason::context;
  return finish_reason::none;
}

// Preemption (DESIGN.md §3): the pages go back to the pool now; the
// sequence waits with its tokens, and either its KV in the host tier
// (swap) or nothing (recompute: its tokens are prefilled again, mostly
// from the prefix cache when its pages were not evicted meanwhile).
void preempt(self_ptr self, uint64_t key) {
  auto& st = self->state;
  live_seq& s = st.seqs.at(key);
  ++s.epoch;
  const bool swap = st.opts.preemption == preempt_mode::swap && s.computed > 0;
  if (swap) {
    auto table = st.pool->export_pages(key);
    table.pages.resize(st.pool->pages_for(s.computed));
    s.state = seq_state::swapping_out;
    // The device serves messages in order: this read sees the pages before
    // any later step reuses them.
    self->request(st.dev, caf::infinite, read_pages_atom::value, table.pages)
        .then(
            [self, key](std::vector<uint8_t>& data) {
              auto it = self->state.seqs.find(key);
              if (it == self->state.seqs.end()) return;  // aborted meanwhile
              self->state.counters.swap_bytes += data.size();
              it->second.blob = std::move(data);
              it->second.state = seq_state::swapped;
              step(self);
            },
            [self, key](caf::error& e) {
              // Fall back to recomputing it.
              auto it = self->state.seqs.find(key);
              if (it == self->state.seqs.end()) return;
              spdlog::warn("instance: swap-out of request {} failed ({}), recomputing",
                           it->second.req.id, self->system().render(e));
              it->second.state = seq_state::waiting;
              it->second.computed = 0;
              step(self);
            });
    ++st.counters.preempted_swap;
  } else {
    s.computed = 0;
    s.state = seq_state::waiting;
    ++st.counters.preempted_recompute;
  }
  st.pool->free_sequence(key);
  s.pages = 0;
  s.committed_pages = 0;
  self->send(s.req.sink, preempted_atom::value, s.req.id, swap);
}

// Starts a waiting sequence: its swapped-out KV comes back into fresh
// pages, or its cached prefix is mapped from the prefix index.
void admit(self_ptr self, uint64_t key) {
  auto& st = self->state;
  live_seq& s = st.seqs.at(key);
  if (s.has_blob()) {
    // Short only when an earlier admission of this round mapped more
    // reusable pages than its first chunk needed: it waits for the next plan.
    auto pages = st.pool->reserve(st.pool->pages_for(s.computed));
    if (pages.empty()) return;
    s.run();
    ++st.counters.admitted;
    st.pool->attach({key, s.computed, pages});
    s.pages = static_cast<int32_t>(pages.size());
    s.committed_pages = 0;  // attached tables are re-offered to the index
    st.counters.swap_bytes -= s.blob.size();
    self->request(st.dev, caf::infinite, write_pages_atom::value, std::move(pages),
                  std::move(s.blob))
        .then([](int32_t) {},
              [self, key](caf::error& e) {
                fail(self, key, "swap-in: " + self->system().render(e));
              });
    s.blob.clear();
    return;
  }
  ++st.counters.admitted;
  s.computed = 0;
  s.pages = 0;
  if (st.opts.prefix_caching) {
    auto m = st.pool->match_prefix(key, s.tokens);
    s.computed = m.cached_tokens;
    s.pages = static_cast<int32_t>(m.pages.size());
    st.counters.cached_tokens += m.cached_tokens;
  }
  if (s.first_admission) s.prompt_cached = s.computed;
  s.first_admission = false;
  s.committed_pages = s.pages;
  s.run();
}

sched_seq describe(const instance_state& st, const live_seq& s) {
  sched_seq d{s.key,   s.req.cls,    s.order, s.computed, static_cast<int32_t>(s.tokens.size()),
              s.pages, s.has_blob(), {},      s.deadline};
  // The real table, so the plan knows which pages are shared (a cached
  // prefix) and are not freed by preempting this sequence alone.
  if (s.running() && st.pool->has_sequence(s.key)) d.table = st.pool->table(s.key);
  return d;
}

// Pages that preempting `key` gives back now: those no other table holds.
int32_t own_pages(const page_pool& pool, uint64_t key) {
  if (!pool.has_sequence(key)) return 0;
  int32_t n = 0;
  for (int32_t p : pool.table(key)) n += pool.refcount(p) == 1 ? 1 : 0;
  return n;
}

// A step the pool refused (page copies the plan could not foresee): make
// room without ever retrying unchanged.  Preempt the lowest-priority
// running sequence that frees at least one page, never the highest-priority
// one (it alone always fits); when none frees anything, fail the
// lowest-priority sequence of the step with a clear error.  Either way one
// sequence leaves the running set, so the step loop ends.
void make_room(self_ptr self, const std::vector<step_chunk>& chunks, int32_t short_by,
               std::unordered_set<uint64_t>& preempted_now) {
  auto& st = self->state;
  const live_seq* best = nullptr;
  for (const auto& [key, s] : st.seqs)
    if (s.running() && (!best || runs_before(describe(st, s), describe(st, *best)))) best = &s;
  const live_seq* victim = nullptr;
  for (const auto& [key, s] : st.seqs)
    if (s.running() && &s != best && own_pages(*st.pool, key) > 0 &&
        (!victim || runs_before(describe(st, *victim), describe(st, s))))
      victim = &s;
  if (victim) {
    spdlog::warn("instance: step short of {} pages, preempting request {}", short_by,
                 victim->req.id);
    preempted_now.insert(victim->key);
    preempt(self, victim->key);
    return;
  }
  const live_seq* last = nullptr;
  for (const auto& c : chunks) {
    const live_seq& s = st.seqs.at(c.id);
    if (!last || runs_before(describe(st, *last), describe(st, s))) last = &s;
  }
  fail(self, last->key,
       "KV arena exhausted: the step needs " + std::to_string(short_by) +
           " more pages and no other sequence can give one back (the rest are shared prefix "
           "pages); raise --kv-mb");
}

void on_result(self_ptr self, uint64_t id, forward_result& r);
void advance(self_ptr self, const step_chunk& c, bool decode, const forward_result& r,
             size_t logits_row, int32_t drawn);

// Speculative decoding: each decode chunk of a sequence that asks for it
// takes n-gram draft tokens (runtime/ngram_draft) as extra rows, within the
// step's rows, the free pages (beyond what the plan takes), its context and
// its max_tokens.
void add_drafts(instance_state& st, const step_plan& plan, std::vector<step_chunk>& chunks) {
  int32_t rows_left = st.opts.limits.max_batch_tokens - plan.tokens;
  int32_t pages_left = st.pool->available() - plan.new_pages;
  const int32_t ps = st.info.page_size;
  auto pages_for = [ps](int32_t n) { return (n + ps - 1) / ps; };
  for (size_t i = 0; i < plan.decode.size() && rows_left > 0; ++i) {
    step_chunk& c = chunks[i];
    live_seq& s = st.seqs.at(c.id);
    const int32_t want = s.req.draft_tokens >= 0 ? s.req.draft_tokens : st.opts.draft_tokens;
    if (want <= 0 || c.n_tokens != 1 || s.req.prefill_only) continue;
    if (s.draft_rest > 0) {
      --s.draft_rest;
      continue;
    }
    // k accepted drafts and the token after them: start + k + 2 tokens.
    int32_t room = std::min({want, std::max(s.draft_cap, 1), rows_left, st.max_len - c.start - 2,
                             s.req.max_tokens - s.generated() - 1});
    if (room <= 0) continue;
    auto draft = propose_ngram_draft(s.tokens, ngram_options{room, 3, 1});
    const int32_t held = std::max(s.pages, pages_for(c.start + 1));
    while (!draft.empty() &&
           pages_for(c.start + 1 + static_cast<int32_t>(draft.size())) - held > pages_left)
      draft.pop_back();
    if (draft.empty()) continue;
    const int32_t d = static_cast<int32_t>(draft.size());
    pages_left -= std::max(0, pages_for(c.start + 1 + d) - held);
    rows_left -= d;
    c.n_tokens += d;
    c.draft = std::move(draft);
  }
}

// Whether a step would find something to compute (lockstep asks for a
// round only then).
bool has_work(const instance_state& st) {
  for (const auto& [key, s] : st.seqs)
    if (s.running() || s.state == seq_state::waiting || s.state == seq_state::swapped ||
        s.state == seq_state::importing)
      return true;
  return false;
}

// Lockstep: the step of a round has ended after `ms` (call before planning
// the next).
void report_round(self_ptr self, double ms, bool dummy) {
  auto& st = self->state;
  const uint64_t round = std::exchange(st.stepping, 0);
  if (round != 0 && st.group)
    self->send(st.group, dp_done_atom::value, st.group_id, round, ms, dummy);
}

// Lockstep: a round came and the instance has nothing to compute; it runs a
// one-row step on its own page anyway, as the group's other replicas wait
// for every member (vLLM's DP coordinator does the same, so an MoE model's
// collectives never miss a member).  After it, it asks for the next round
// only if work came meanwhile and it was idle when the round began (a
// replica whose work could not be planned waits for news instead of
// spinning).
void dummy_step(self_ptr self, bool had_work) {
  auto& st = self->state;
  forward_batch b;
  b.tokens = {0};
  b.positions = {0};
  b.seqs.push_back(forward_seq{0, 1, st.dummy_page});
  b.logit_rows = {0};
  st.dummy_running = true;
  st.stepping = std::exchange(st.granted, 0);
  st.dummy_start = std::chrono::steady_clock::now();
  auto done = [self, had_work] {
    self->state.dummy_running = false;
    report_round(self, ms_since(self->state.dummy_start), true);
    if (!had_work) step(self);
  };
  self->request(st.dev, caf::infinite, forward_atom::value, std::move(b))
      .then([done](forward_result&) { done(); }, [done](caf::error&) { done(); });
}

bool busy(const instance_state& st) {
  return st.dummy_running || !st.inflight.empty();
}

// Step overlap: the step on the device is chainable, so the next may be
// planned and sent now (never in a dp_group's lockstep rounds, where each
// step waits for its round).
bool may_plan_ahead(const instance_state& st) {
  return st.opts.step_overlap && !st.group && st.inflight.size() == 1 &&
         st.inflight.front().chainable;
}

// Step overlap: whether the device can draw the token `c` samples for `s`
// exactly as advance() will.  Structured output masks with the instance's
// constraint state, and a sequence that wants drafts needs its last token
// to propose them; both wait for the result instead.
bool drawable(const instance_state& st, const live_seq& s, const step_chunk& c) {
  const int32_t drafts = s.req.draft_tokens >= 0 ? s.req.draft_tokens : st.opts.draft_tokens;
  return st.opts.step_overlap && !st.group && c.sample && c.draft.empty() && !s.constraint &&
         !s.req.prefill_only && drafts <= 0 && presamplable(s.req.sampling);
}

// Whether the token a sequence samples next ends it (max_tokens, context),
// whatever it is: a step planned ahead leaves it out.
bool ends_at_next_token(const instance_state& st, const live_seq& s) {
  return s.generated() + 1 >= s.req.max_tokens ||
         static_cast<int32_t>(s.tokens.size()) + 1 >= st.max_len;
}

// Plans the next step and sends it to the device, unless one is running
// (or, with step overlap, two: the one running and the next, planned while
// it runs, as if its chunks were done, their sampled tokens placeholders the
// device fills).
// Admitted sequences are matched against the prefix cache (or swapped in)
// and the step is planned again with what they really need, until a plan
// admits nobody: each round moves a waiting sequence to running, and a
// preempting plan admits nobody, so this ends.
//
// It cannot spin: a sequence preempted during this call is not admitted
// again in it (it would map the same cached pages and be preempted again,
// a loop that never returns to the mailbox), so every round moves a
// sequence from waiting to running or out of the running set for good,
// and the rounds are bounded by twice the sequences.
void step(self_ptr self) {
  auto& st = self->state;
  if (st.dummy_running) return;
  if (!st.inflight.empty() && !may_plan_ahead(st)) return;
  if (st.group && st.granted == 0) {
    // Lockstep: it steps only in the group's rounds; ask for one.
    if (!st.asked && has_work(st)) {
      st.asked = true;
      self->send(st.group, dp_ready_atom::value, st.group_id);
    }
    return;
  }
  // Planning ahead: the chunks of the step on the device, by sequence.
  const inflight_step* ahead = st.inflight.empty() ? nullptr : &st.inflight.back();
  std::unordered_map<uint64_t, size_t> in_ahead;
  for (size_t i = 0; ahead && i < ahead->chunks.size(); ++i)
    in_ahead.emplace(ahead->chunks[i].id, i);
  std::unordered_set<uint64_t> preempted_now;
  bool restarted = false;
  for (;;) {
    std::vector<sched_seq> running, waiting;
    for (const auto& [key, s] : st.seqs) {
      if (s.running()) {
        sched_seq d = describe(st, s);
        auto a = in_ahead.find(key);
        if (a != in_ahead.end() && ahead->epochs[a->second] == s.epoch) {
          // As it will be once the step on the device is done.
          const step_chunk& c = ahead->chunks[a->second];
          if (c.sample && ends_at_next_token(st, s)) continue;
          d.computed = c.start + c.n_tokens;
          d.total = static_cast<int32_t>(s.tokens.size()) + (c.sample ? 1 : 0);
        }
        running.push_back(std::move(d));
      } else if (s.schedulable() && !preempted_now.count(key)) {
        waiting.push_back(describe(st, s));
      }
    }
    auto plan = plan_step(running, waiting, st.opts.limits, st.pool->available());
    for (uint64_t v : plan.preempted) {
      preempted_now.insert(v);
      guarded(self, v, "preempt", [&] { preempt(self, v); });
    }
    if (!plan.admitted.empty()) {
      for (uint64_t a : plan.admitted) guarded(self, a, "admit", [&] { admit(self, a); });
      continue;
    }
    if (plan.empty()) {
      if (!plan.preempted.empty()) continue;
      if (running.empty() && !preempted_now.empty() && !restarted) {
        // Everything was preempted (it cannot happen with exact page
        // counts, but a stalled queue would be worse): start afresh once.
        preempted_now.clear();
        restarted = true;
        continue;
      }
      return;  // idle
    }

    std::vector<step_chunk> chunks = plan.decode;
    chunks.insert(chunks.end(), plan.prefill.begin(), plan.prefill.end());
    if (!ahead) add_drafts(st, plan, chunks);  // drafts follow a sequence's last token
    std::vector<alloc_request> reqs;
    for (const auto& c : chunks) reqs.push_back({c.id, c.start + c.n_tokens});
    step_allocation alloc;
    try {
      alloc = st.pool->allocate_step(reqs);
    } catch (const std::exception& e) {
      // The pool refused the step as a whole (a bookkeeping bug): its
      // sequences end with the reason; the others go on.
      for (const auto& c : chunks) fail(self, c.id, std::string("page allocation: ") + e.what());
      continue;
    }
    if (!alloc.ok) {
      make_room(self, chunks, alloc.pages_short, preempted_now);
      continue;
    }
    if (!alloc.copies.empty()) {
      std::vector<int32_t> src, dst;
      std::vector<uint64_t> owners;
      for (const auto& c : alloc.copies) {
        src.push_back(c.src);
        dst.push_back(c.dst);
        owners.push_back(c.seq);
      }
      // A failed copy leaves the new pages' heads unwritten: the sequences
      // that own them fail now, before the step's result (the device
      // answers in order), instead of decoding from garbage.
      self->request(st.dev, caf::infinite, copy_pages_atom::value, src, dst)
          .then([](int32_t) {},
                [self, owners](caf::error& e) {
                  const std::string why = "page copy failed: " + self->system().render(e);
                  for (uint64_t key : owners) fail(self, key, why);
                });
    }

    forward_batch b;
    inflight_step fl;
    const uint64_t id = st.next_step++;
    fl.id = b.step = id;
    fl.n_decode = plan.decode.size();
    fl.chainable = true;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      live_seq& s = st.seqs.at(c.id);
      s.pages = static_cast<int32_t>(alloc.tables[i].pages.size());
      forward_seq fs{static_cast<int32_t>(b.tokens.size()), c.n_tokens,
                     std::move(alloc.tables[i].pages)};
      for (int32_t j = 0; j < c.n_tokens; ++j) {
        const int32_t pos = c.start + j;
        if (j > 0 && !c.draft.empty()) {
          b.tokens.push_back(c.draft[j - 1]);
        } else if (pos < static_cast<int32_t>(s.tokens.size())) {
          b.tokens.push_back(s.tokens[pos]);
        } else {
          // The token the step on the device samples: the device fills it in.
          b.after = ahead->id;
          b.placeholders.push_back(
              {static_cast<int32_t>(b.tokens.size()), ahead->drawn.at(in_ahead.at(c.id))});
          b.tokens.push_back(0);
        }
        b.positions.push_back(pos);
      }
      int32_t drawn = -1;
      if (drawable(st, s, c)) {
        drawn = static_cast<int32_t>(b.presample.size());
        b.presample.push_back(
            {static_cast<int32_t>(b.logit_rows.size()), s.req.sampling, c.start + c.n_tokens});
      } else if (c.sample) {
        fl.chainable = false;
      }
      // A drafted chunk is verified row by row: every row's logits.
      for (int32_t j = c.draft.empty() ? c.n_tokens - 1 : 0; c.sample && j < c.n_tokens; ++j)
        b.logit_rows.push_back(fs.first_row + j);
      b.seqs.push_back(std::move(fs));
      fl.epochs.push_back(s.epoch);
      fl.drawn.push_back(drawn);
    }
    fl.chunks = std::move(chunks);
    fl.sent = std::chrono::steady_clock::now();
    if (ahead) ++st.counters.overlapped_steps;
    st.inflight.push_back(std::move(fl));
    st.stepping = std::exchange(st.granted, 0);
    ++st.counters.steps;
    self->request(st.dev, caf::infinite, forward_atom::value, std::move(b))
        .then([self, id](forward_result& r) { on_result(self, id, r); },
              [self, id](caf::error& e) {
                auto& st = self->state;
                if (st.inflight.empty() || st.inflight.front().id != id) return;
                inflight_step failed = std::move(st.inflight.front());
                st.inflight.pop_front();
                st.last_result = std::chrono::steady_clock::now();
                report_round(self, ms_since(failed.sent), false);
                const std::string why = "forward: " + self->system().render(e);
                for (const auto& c : failed.chunks) fail(self, c.id, why);
                step(self);
              });
    // Step overlap: plan the next one while this one runs.
    if (may_plan_ahead(st)) step(self);
    return;
  }
}

// Co-location's TPOT guard (instance_options::tpot_target_ms): additive
// increase, multiplicative decrease of the offline rows a step takes while
// online sequences decode.
void guard_tpot(instance_state& st, const std::vector<step_chunk>& chunks, size_t n_decode,
                double ms) {
  auto& lim = st.opts.limits;
  if (!lim.offline_yields || st.opts.tpot_target_ms <= 0) return;
  bool online_decode = false;
  for (size_t i = 0; i < n_decode && i < chunks.size() && !online_decode; ++i) {
    auto it = st.seqs.find(chunks[i].id);
    online_decode = it != st.seqs.end() && it->second.req.cls == seq_class::online;
  }
  if (!online_decode) return;
  const int32_t full = lim.max_batch_tokens;
  if (ms > st.opts.tpot_target_ms)
    lim.offline_rows = std::min(lim.offline_rows, full) / 2;
  else if (ms < 0.8 * st.opts.tpot_target_ms && lim.offline_rows < full)
    lim.offline_rows = std::min(full, lim.offline_rows + 4);
}

// Step overlap: the token the instance has for chunk `c` must be the one
// the device drew (`dev`) for the step it may already run; a sequence where
// they differ (a bug, never expected) ends with an error rather than go on
// from a token it did not sample.
void check_draw(self_ptr self, const step_chunk& c, int32_t dev) {
  auto it = self->state.seqs.find(c.id);
  if (it == self->state.seqs.end()) return;
  const auto& tokens = it->second.tokens;
  const size_t at = static_cast<size_t>(c.start + c.n_tokens);
  if (tokens.size() <= at) return;
  if (tokens[at] != dev)
    fail(self, c.id,
         "step overlap: the device drew token " + std::to_string(dev) +
             " for the next step, the sampler " + std::to_string(tokens[at]));
}

// The step is done: advance each sequence, sample those whose chunk ended
// at their last token, stream, and plan the next step.  Sequences aborted
// or preempted while the step ran are gone from `seqs`, not running, or
// of a later epoch, and are skipped.
void on_result(self_ptr self, uint64_t id, forward_result& r) {
  auto& st = self->state;
  if (st.inflight.empty() || st.inflight.front().id != id) {
    spdlog::error("instance: the result of step {} came out of order", id);
    return;
  }
  inflight_step done = std::move(st.inflight.front());
  st.inflight.pop_front();
  // Queued behind the step before it, a step starts when that one ends.
  const double ms = ms_since(std::max(done.sent, st.last_result));
  st.last_result = std::chrono::steady_clock::now();
  const auto& chunks = done.chunks;
  st.counters.step_ms += ms;
  if (r.idle_ms > 0) st.counters.device_idle_ms += r.idle_ms;
  report_round(self, ms, false);
  step_timing t{done.id, 0, ms, 0, 0, 0, r.idle_ms, r.device_ms};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    t.rows += c.n_tokens;
    if (i < done.n_decode) t.decode_rows += c.n_tokens;
    // Row j of the chunk attends to positions [0, start + j].
    t.context += int64_t(c.n_tokens) * c.start + int64_t(c.n_tokens) * (c.n_tokens + 1) / 2;
  }
  st.recent_steps.push_back(t);
  if (st.recent_steps.size() > st.opts.kept_steps) st.recent_steps.pop_front();
  guard_tpot(st, chunks, done.n_decode, ms);
  const auto host_start = std::chrono::steady_clock::now();
  size_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    const size_t logits_row = row;
    if (c.sample) row += c.draft.empty() ? 1 : c.draft.size() + 1;
    // Aborted, being exported or preempted while the step ran: its part is
    // dropped (an export carries the KV it had when it began).
    auto it = self->state.seqs.find(c.id);
    if (it == self->state.seqs.end() || !it->second.running() || it->second.epoch != done.epochs[i])
      continue;
    // Step overlap: the device's draw for this chunk (-1: none, or refused).
    const int32_t k = done.drawn[i];
    const int32_t drawn = k >= 0 && static_cast<size_t>(k) < r.drawn.size() ? r.drawn[k] : -1;
    guarded(self, c.id, "step result",
            [&] { advance(self, c, i < done.n_decode, r, logits_row, drawn); });
    if (k >= 0) check_draw(self, c, drawn);
  }
  step(self);
  if (!st.recent_steps.empty()) st.recent_steps.back().host_ms = ms_since(host_start);
}

// Samples the token after `s.tokens` from `logits` (masked by the output
// constraint, which then advances), appends it to the sequence and to `out`
// (with its logprobs when asked).
int32_t sample_next(live_seq& s, std::span<const float> logits, token_batch& out) {
  std::vector<float> masked;  // structured output: only tokens that keep the output valid
  if (s.constraint) {
    const auto& allow = s.constraint->allowed(s.constraint_state);
    masked.assign(logits.begin(), logits.end());
    bool any = false;
    for (size_t t = 0; t < masked.size(); ++t) {
      const bool ok = t < allow.size() && allow[t];
      if (!ok) masked[t] = -INFINITY;
      any = any || ok;
    }
    if (!any) throw std::runtime_error("the output constraint allows no token here");
    logits = masked;
  }
  auto res = s.smp.sample(logits, s.tokens);
  if (s.constraint) {
    s.constraint_state = s.constraint->advance(s.constraint_state, res.token);
    if (s.constraint_state < 0)
      throw std::runtime_error("token " + std::to_string(res.token) +
                               " left the output constraint");
  }
  s.tokens.push_back(res.token);
  out.tokens.push_back(res.token);
  if (sampler::wants_logprobs(s.req.sampling)) {
    out.logprobs.push_back(res.logprob);
    if (s.req.sampling.n_logprobs > 0) out.top.push_back(std::move(res.top));
  }
  return res.token;
}

// Appends a token drawn on the device (step overlap) as sample_next would.
int32_t take_token(live_seq& s, int32_t token, token_batch& out) {
  s.tokens.push_back(token);
  out.tokens.push_back(token);
  return token;
}

// One sequence's part of a step's result.  A drafted decode chunk is
// verified as sequential decoding would run: row j's logits give the token
// after the draft's first j tokens, sampled exactly as without drafts (same
// sampler, same random draws), and the next row counts only while that token
// equals the draft's.  So the output is the same with or without drafts.
void advance(self_ptr self, const step_chunk& c, bool decode, const forward_result& r,
             size_t logits_row, int32_t drawn) {
  auto& st = self->state;
  live_seq& s = st.seqs.at(c.id);
  // Rows whose KV now holds the sequence's own tokens: all of a prefill
  // chunk; of a drafted chunk the decode row, then each accepted draft.
  s.computed += c.draft.empty() ? c.n_tokens : 1;
  (decode ? st.counters.decode_tokens : st.counters.prefill_tokens) += c.n_tokens;
  // The pool indexes only the positions its table covers (computed, once
  // rejected drafts are given back), not the token sampled after them.
  auto commit_pages = [&] {
    if (st.opts.prefix_caching && s.computed / st.info.page_size > s.committed_pages) {
      st.pool->commit_full_pages(s.key, s.tokens);
      s.committed_pages = s.computed / st.info.page_size;
    }
  };
  if (c.draft.empty()) commit_pages();
  s.run();
  if (!c.sample) return;
  const size_t rows = c.draft.size() + 1;
  if (r.n_vocab != st.info.n_vocab || r.logits.size() < (logits_row + rows) * size_t(r.n_vocab))
    throw std::runtime_error("the forward pass returned " + std::to_string(r.logits.size()) +
                             " logits of vocabulary " + std::to_string(r.n_vocab));
  token_batch out;
  out.id = s.req.id;
  for (size_t j = 0; j < rows; ++j) {
    std::span<const float> logits(r.logits.data() + (logits_row + j) * r.n_vocab, r.n_vocab);
    // Step overlap: the device drew this token already, with this sampler
    // on these logits; without logprobs to report, it is taken as is.  (A
    // drawn chunk has no draft and no constraint, drawable() says: one row.)
    const bool take_draw = drawn >= 0 && !sampler::wants_logprobs(s.req.sampling);
    const int32_t token = take_draw ? take_token(s, drawn, out) : sample_next(s, logits, out);
    out.finish = stop_reason(st, s, token);
    if (out.finish != finish_reason::none || j == c.draft.size() || token != c.draft[j]) break;
    ++s.computed;  // the draft's token at this position was the right one: its KV stands
    ++out.accepted;
  }
  if (!c.draft.empty()) {
    const auto d = static_cast<int32_t>(c.draft.size());
    out.drafted = d;
    st.counters.draft_tokens += d;
    st.counters.accepted_tokens += out.accepted;
    if (out.accepted == d) {
      s.draft_cap = std::min(std::max(s.draft_cap, 1) * 2, k_max_draft_tokens);
    } else if (out.accepted == 0) {
      s.draft_cap = std::min(s.draft_cap, d) / 2;
      if (s.draft_cap == 0) s.draft_rest = 8;
    }
    // Rejected drafts' KV slots lie past the sequence's tokens: the table
    // gives back the positions (and pages) beyond what it computed.
    s.pages -= st.pool->truncate(s.key, s.computed);
    commit_pages();
  }
  s.run();
  if (!s.reported) {
    s.reported = true;
    out.cached_tokens = s.prompt_cached;
  }
  if (out.finish != finish_reason::none) {
    finish(self, s.key, std::move(out));
    return;
  }
  // Disaggregation: the prefill is done; the KV waits here for its export.
  if (s.req.prefill_only) s.state = seq_state::parked;
  self->send(s.req.sink, tokens_atom::value, std::move(out));
}

std::string check_request(const instance_state& st, const sequence_request& r) {
  if (!r.sink) return "no sink to stream to";
  if (st.keys.count(r.id)) return "id is already in use";
  if (r.prompt.empty()) return "empty prompt";
  const size_t total = r.prompt.size() + r.generated.size();
  if (static_cast<int32_t>(total) >= st.max_len)
    return "prompt of " + std::to_string(total) + " tokens leaves no room: at most " +
           std::to_string(st.max_len - 1) + " fit";
  for (const auto* part : {&r.prompt, &r.generated})
    for (int32_t t : *part)
      if (t < 0 || t >= st.info.n_vocab)
        return "prompt token " + std::to_string(t) + " is outside the vocabulary";
  if (r.max_tokens <= 0) return "max_tokens must be positive";
  if (static_cast<int32_t>(r.generated.size()) >= r.max_tokens)
    return "the " + std::to_string(r.generated.size()) +
           " tokens generated already reach max_tokens";
  return validate(r.sampling);
}

// The compiled constraint of a request (cached by pattern) and its state
// after the tokens generated so far; "" or why it cannot be applied.
std::string constrain(instance_state& st, const sequence_request& r,
                      std::shared_ptr<token_constraint>& c, int& state) {
  if (r.constraint.empty()) return {};
  if (!st.opts.token_bytes) return "this instance cannot apply output constraints";
  auto it = st.constraints.find(r.constraint);
  if (it == st.constraints.end()) {
    try {
      if (st.constraints.size() >= 64) st.constraints.clear();  // a bounded cache
      it = st.constraints
               .emplace(r.constraint, std::make_shared<token_constraint>(
                                          r.constraint, st.opts.token_bytes, st.opts.eog_tokens))
               .first;
    } catch (const std::exception& e) {
      return std::string("output constraint: ") + e.what();
    }
  }
  c = it->second;
  state = c->replay(r.generated);
  if (state < 0) return "the tokens generated so far do not match the output constraint";
  return {};
}

// A new sequence in the waiting queue, its sink monitored.
live_seq& add_sequence(self_ptr self, sequence_request r) {
  auto& st = self->state;
  const uint64_t key = st.next_key++;
  st.keys.emplace(r.id, key);
  auto& sink_keys = st.by_sink[r.sink.address()];
  if (sink_keys.empty()) self->monitor(r.sink);
  sink_keys.push_back(key);
  return st.seqs.emplace(key, live_seq(std::move(r), key, key)).first->second;
}

kv_geometry arena_geometry(const instance_state& st) {
  return {st.info.model_fingerprint, st.info.n_layers,  st.info.n_kv_heads,
          st.info.head_dim,          st.info.page_size, st.info.kv_dtype};
}

caf::error refuse(const std::string& what) {
  return caf::make_error(caf::sec::invalid_argument, what);
}

// An export frees the sequence's pages at once, as a swap-out does (the
// device serves the read before any later step that reuses them); the
// sequence stays, exporting, until the read answers, then leaves with its
// blob.
caf::result<std::vector<uint8_t>> export_sequence(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto k = st.keys.find(id);
  if (k == st.keys.end())
    return refuse("export: no sequence of request " + std::to_string(id) + " here");
  const uint64_t key = k->second;
  live_seq& s = st.seqs.at(key);
  if (!s.schedulable() && s.state != seq_state::parked)
    return refuse("export: the KV of request " + std::to_string(id) +
                  " is being read right now; ask again");
  ++st.counters.exported;
  kv_blob b;
  b.geometry = arena_geometry(st);
  b.tokens.assign(s.tokens.begin(), s.tokens.begin() + s.computed);
  b.n_prompt = std::min(s.n_prompt, s.computed);
  std::vector<int32_t> pages;
  if (s.holds_pages() && s.computed > 0 && st.pool->has_sequence(key)) {
    pages = st.pool->export_pages(key).pages;
    pages.resize(st.pool->pages_for(s.computed));
  } else if (!s.has_blob()) {
    b.tokens.clear();  // nothing computed: the importer starts afresh
    b.n_prompt = 0;
  }
  st.pool->free_sequence(key);
  if (pages.empty()) {
    b.pages = take_out(self, key).blob;
    step(self);
    return encode_kv_blob(b);
  }
  s.state = seq_state::exporting;
  s.pages = 0;
  auto rp = self->make_response_promise<std::vector<uint8_t>>();
  auto exported = [self, key] {
    auto it = self->state.seqs.find(key);
    if (it == self->state.seqs.end() || it->second.state != seq_state::exporting) return false;
    take_out(self, key);
    return true;
  };
  self->request(st.dev, caf::infinite, read_pages_atom::value, std::move(pages))
      .then(
          [rp, b, exported, id](std::vector<uint8_t>& data) mutable {
            if (!exported()) {
              rp.deliver(refuse("export request " + std::to_string(id) +
                                ": it ended while its pages were read"));
              return;
            }
            b.pages = std::move(data);
            rp.deliver(encode_kv_blob(b));
          },
          [rp, exported, id, self](caf::error& e) mutable {
            exported();
            rp.deliver(refuse("export request " + std::to_string(id) +
                              ": reading its pages failed: " + self->system().render(e)));
          });
  step(self);
  return rp;
}

caf::result<int32_t> import_sequence(self_ptr self, sequence_request r,
                                     const std::vector<uint8_t>& bytes) {
  auto& st = self->state;
  const std::string who = "import request " + std::to_string(r.id) + ": ";
  if (auto why = check_request(st, r); !why.empty()) return refuse(who + why);
  kv_blob b;
  try {
    b = decode_kv_blob(bytes);
  } catch (const kv_blob_error& e) {
    return refuse(who + e.what());
  }
  if (auto m = geometry_mismatch(b.geometry, arena_geometry(st)); !m.empty())
    return refuse(who + "the blob does not fit this instance: " + m);
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), r.generated.begin(), r.generated.end());
  if (b.tokens.size() > all.size() || !std::equal(b.tokens.begin(), b.tokens.end(), all.begin()))
    return refuse(who + "the blob's tokens are not the start of this request's tokens");
  std::shared_ptr<token_constraint> c;
  int c_state = -1;
  if (auto why = constrain(st, r, c, c_state); !why.empty()) return refuse(who + why);
  // At least the last token is computed here, for the logits of the next.
  const int32_t n_kv = std::min<int32_t>(static_cast<int32_t>(b.tokens.size()),
                                         static_cast<int32_t>(all.size()) - 1);
  live_seq& s = add_sequence(self, std::move(r));
  s.first_admission = false;
  s.constraint = std::move(c);
  s.constraint_state = c_state;
  if (n_kv > 0) {
    // It waits as a swapped-out sequence does: admission reserves pages and
    // writes the data in (the swap-in path).
    b.pages.resize(size_t(st.pool->pages_for(n_kv)) * st.info.kv_bytes_per_page);
    s.computed = n_kv;
    s.state = seq_state::importing;
    s.blob = std::move(b.pages);
    st.counters.swap_bytes += s.blob.size();
  }
  ++st.counters.imported;
  step(self);
  return n_kv;
}

void leave_group(self_ptr self) {
  auto& st = self->state;
  if (!st.dummy_page.empty()) st.pool->unreserve(st.dummy_page);
  st.dummy_page.clear();
  st.group = nullptr;
  st.granted = st.stepping = 0;
  st.asked = false;
}

caf::result<int32_t> join_group(self_ptr self, const caf::actor& group, uint64_t id) {
  auto& st = self->state;
  if (st.group) {
    self->demonitor(st.group.address());
    leave_group(self);
  }
  if (group) {
    st.dummy_page = st.pool->reserve(1);
    if (st.dummy_page.empty()) return refuse("dpjoin: no free KV page for dummy steps");
    st.group = caf::actor_cast<dp_group_actor>(group);
    st.group_id = id;
    self->monitor(st.group);
  }
  step(self);
  return 1;
}

instance_actor::behavior_type instance_behavior(self_ptr self, device_actor dev, device_info info,
                                                instance_options opts) {
  auto& st = self->state;
  st.dev = std::move(dev);
  st.info = std::move(info);
  st.opts = std::move(opts);
  st.opts.limits.page_size = st.info.page_size;
  st.pool = std::make_unique<page_pool>(st.info.n_pages, st.info.page_size,
                                        fingerprint_salt(st.info.model_fingerprint));
  st.max_len = std::min(st.info.n_ctx, st.info.n_pages * st.info.page_size);
  self->set_down_handler([self](const caf::down_msg& dm) {
    if (self->state.group && dm.source == self->state.group.address()) {
      // The group is gone: step freely again.
      leave_group(self);
      return step(self);
    }
    auto it = self->state.by_sink.find(dm.source);
    if (it == self->state.by_sink.end()) return;
    const auto keys = it->second;  // finish() edits the map
    for (uint64_t key : keys) {
      auto s = self->state.seqs.find(key);
      if (s == self->state.seqs.end()) continue;
      spdlog::debug("instance: request {} lost its sink, releasing it", s->second.req.id);
      token_batch last;
      last.id = s->second.req.id;
      last.finish = finish_reason::aborted;
      finish(self, key, std::move(last));
    }
    step(self);
  });
  return {
      [self](enqueue_atom, sequence_request& r) -> caf::result<int32_t> {
        auto& st = self->state;
        if (auto why = check_request(st, r); !why.empty())
          return caf::make_error(caf::sec::invalid_argument,
                                 "enqueue request " + std::to_string(r.id) + ": " + why);
        std::shared_ptr<token_constraint> c;
        int state = -1;
        if (auto why = constrain(st, r, c, state); !why.empty())
          return caf::make_error(caf::sec::invalid_argument,
                                 "enqueue request " + std::to_string(r.id) + ": " + why);
        int32_t ahead = 0;
        for (const auto& [key, s] : st.seqs) ahead += s.holds_pages() ? 0 : 1;
        auto& added = add_sequence(self, std::move(r));
        if (added.req.ttft_target_ms > 0 && added.req.cls == seq_class::online)
          added.deadline = ms_since(st.born) + added.req.ttft_target_ms;
        added.constraint = std::move(c);
        added.constraint_state = state;
        step(self);
        return ahead;
      },
      [self](export_atom, uint64_t id) -> caf::result<std::vector<uint8_t>> {
        return export_sequence(self, id);
      },
      [self](import_atom, sequence_request& r, std::vector<uint8_t>& bytes)
          -> caf::result<int32_t> { return import_sequence(self, std::move(r), bytes); },
      [self](abort_atom, uint64_t id) {
        auto it = self->state.keys.find(id);
        if (it == self->state.keys.end()) return;
        token_batch last;
        last.id = id;
        last.finish = finish_reason::aborted;
        // Safe while steps run: the pages freed here go only to steps sent
        // after them, and the device runs steps in order.
        finish(self, it->second, std::move(last));
      },
      [self](relocate_atom) {
        for (const auto& [key, s] : self->state.seqs)
          self->send(s.req.sink, relocate_atom::value, s.req.id);
      },
      [self](preempt_atom, uint64_t id) -> caf::result<int32_t> {
        auto& st = self->state;
        auto k = st.keys.find(id);
        if (k == st.keys.end())
          return refuse("preempt: no sequence of request " + std::to_string(id) + " here");
        if (!st.seqs.at(k->second).running())
          return refuse("preempt: request " + std::to_string(id) +
                        " is not running (it waits for its turn already)");
        // (During a step, its part of the step is dropped: on_result skips
        // sequences that are not running.)
        preempt(self, k->second);
        step(self);
        return 1;
      },
      [self](set_atom, const std::string& key, int32_t value) -> caf::result<int32_t> {
        auto& lim = self->state.opts.limits;
        auto field = [&key](scheduler_limits& l) -> int32_t* {
          return key == "max_seqs"           ? &l.max_seqs
                 : key == "max_batch_tokens" ? &l.max_batch_tokens
                 : key == "chunk_size"       ? &l.chunk_size
                                             : nullptr;
        };
        scheduler_limits next = lim;
        if (!field(next))
          return refuse("set: '" + key +
                        "' cannot change live (max_seqs, max_batch_tokens, chunk_size can)");
        *field(next) = value;
        if (auto why = validate(next); !why.empty()) return refuse("set " + key + ": " + why);
        const int32_t old = *field(lim);
        lim = next;
        step(self);
        return old;
      },
      [self](set_role_atom, const std::string& role) -> caf::result<std::string> {
        auto& st = self->state;
        if (role != "prefill" && role != "decode" && role != "mixed")
          return refuse("set role: '" + role + "' is not a role (prefill, decode, mixed)");
        std::string old = st.opts.role;
        st.opts.role = role;
        spdlog::info("instance: role {} -> {}", old, role);
        return old;
      },
      [self](sequences_atom) {
        std::vector<sequence_load> out;
        for (const auto& [key, s] : self->state.seqs)
          if (s.state != seq_state::finished && s.state != seq_state::exporting)
            out.push_back({s.req.id, int64_t(s.tokens.size()), s.state == seq_state::decoding,
                           std::max(0, s.req.max_tokens - s.generated()), s.req.sink});
        return out;
      },
      [self](dp_join_atom, const caf::actor& group, uint64_t id) {
        return join_group(self, group, id);
      },
      [self](dp_go_atom, uint64_t round) {
        auto& st = self->state;
        st.asked = false;
        if (!st.group) return;
        st.granted = round;
        // A step from before the join may still run: its result steps in
        // this round.
        if (busy(st)) return;
        const bool had_work = has_work(st);
        step(self);
        if (st.granted != 0) dummy_step(self, had_work);
      },
      [self](stats_atom) {
        auto& st = self->state;
        instance_stats out = st.counters;
        out.role = st.opts.role;
        for (const auto& [key, s] : st.seqs) {
          ++(s.holds_pages() ? out.running : out.waiting);
          const int64_t left = int64_t(s.tokens.size()) - s.computed;
          if (s.state == seq_state::decoding || s.state == seq_state::parked) {
            ++out.decoding;
            out.running_tokens += int64_t(s.tokens.size());
          } else if (s.state != seq_state::finished && s.state != seq_state::exporting) {
            out.queued_prefills.push_back(int32_t(left));
          }
          const bool host_tier =
              s.state == seq_state::swapping_out || s.state == seq_state::swapped;
          out.swapped += host_tier ? 1 : 0;
          if (left > 1) out.queued_prefill_tokens += left;
        }
        out.kv = st.pool->stats();
        out.kv_check = st.pool->check_invariants();
        if (st.opts.prefix_caching) out.prefix_hashes = st.pool->indexed_hashes();
        out.recent_steps.assign(st.recent_steps.begin(), st.recent_steps.end());
        return out;
      },
  };
}

}  // namespace

instance_actor spawn_instance(caf::actor_system& sys, device_actor dev, instance_options opts) {
  device_info info;
  std::string failure;
  {
    caf::scoped_actor self{sys};
    self->request(dev, caf::infinite, info_atom::value)
        .receive([&](device_info& i) { info = std::move(i); },
                 [&](caf::error& e) { failure = sys.render(e); });
  }
  if (!failure.empty()) throw std::runtime_error("instance: device info: " + failure);
  opts.limits.page_size = info.page_size;
  if (auto why = validate(opts.limits); !why.empty())
    throw std::invalid_argument("instance: " + why);
  return sys.spawn(instance_behavior, std::move(dev), std::move(info), std::move(opts));
}

}  // namespace troupe
