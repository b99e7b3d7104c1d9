#include "runtime/engine/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>

#include "runtime/common/elapsed.hpp"
#include "runtime/engine/ngram_draft.hpp"
#include "runtime/engine/step_overlap.hpp"

namespace troupe {

namespace {

// The output-length predictor's class of a request: the client's name for
// it, else its first prompt tokens (a template's or an application's
// preamble tends to start the same way).
std::string length_class_of(const sequence_spec& r) {
  if (!r.prompt_class.empty()) return "c:" + r.prompt_class;
  std::string k = "t:";
  for (size_t i = 0; i < std::min<size_t>(4, r.prompt.size()); ++i)
    k += std::to_string(r.prompt[i]) + ",";
  return k;
}

}  // namespace

engine::live_seq::live_seq(sequence_spec r, uint64_t k, uint64_t o)
    : req(std::move(r)), key(k), order(o), smp(req.sampling) {
  tokens = req.prompt;
  n_prompt = static_cast<int32_t>(tokens.size());
  tokens.insert(tokens.end(), req.generated.begin(), req.generated.end());
}

engine::engine(device_info info, instance_options opts)
    : info_(std::move(info)), opts_(std::move(opts)) {
  opts_.limits.page_size = info_.page_size;
  pool_ = std::make_unique<page_pool>(info_.n_pages, info_.page_size,
                                      fingerprint_salt(info_.model_fingerprint));
  max_len_ = std::min(info_.n_ctx, info_.n_pages * info_.page_size);
  kv_space_ = kv_space_of(arena_geometry());
  pool_->record_evictions(opts_.kv_tiers);
}

std::vector<engine_command> engine::take_commands() {
  spill_evicted();
  return std::exchange(outbox_, {});
}

void engine::spill_evicted() {
  if (!pool_->has_evicted()) return;
  engine_cmd::spill sp;
  for (auto& e : pool_->take_evicted()) {
    // A page whose load has not answered yet came from the store (which
    // keeps it), and its write may have failed: not offered back.
    if (loading_.count(e.page)) {
      loading_.erase(e.page);
      continue;
    }
    sp.pages.push_back(e.page);
    sp.meta.push_back(std::move(e));
  }
  if (sp.pages.empty()) return;
  counters_.spilled_pages += sp.pages.size();
  outbox_.emplace_back(std::move(sp));
}

// Recovery from KV copies: once kv_copy_pages more full pages are
// committed, they are read (before any later command writes them: full
// pages of a running sequence are only appended to) and put to the store
// its request keeps copies in.  A page is the prefix index's page: its
// chained hash names it in any store.
void engine::copy_out(live_seq& s) {
  const int32_t every = s.req.kv_copy_pages;
  if (every <= 0 || !pool_->has_sequence(s.key)) return;
  const auto& chain = pool_->chain(s.key);
  const auto& table = pool_->table(s.key);
  const int32_t full = std::min({s.committed_pages, int32_t(chain.size()), int32_t(table.size())});
  // After a preemption by recompute the table grows back over pages
  // copied already (the same tokens, the same hashes): not sent again.
  if (full - s.copied_pages < every) return;
  const int32_t ps = info_.page_size;
  const auto& keyed = cache_tokens(s);
  engine_cmd::spill cp;
  cp.copy_of = s.key;
  for (int32_t i = s.copied_pages; i < full; ++i) {
    evicted_page m;
    m.page = table[size_t(i)];
    m.hash = chain[size_t(i)];
    m.parent = i == 0 ? 0 : chain[size_t(i) - 1];
    m.depth = i;
    m.tokens.assign(keyed.begin() + size_t(i) * ps, keyed.begin() + size_t(i + 1) * ps);
    cp.pages.push_back(m.page);
    cp.meta.push_back(std::move(m));
  }
  counters_.copied_pages += cp.pages.size();
  s.copied_pages = full;
  out(std::move(cp));
}

std::vector<uint64_t> engine::prefix_hashes(const std::vector<int32_t>& prompt,
                                            int32_t& cached_pages) const {
  cached_pages = pool_->cached_pages(prompt);
  return pool_->prompt_hashes(prompt);
}

// A first admission's prompt, its cached run mapped: the pages the store
// gave that continue the run (this arena's space, the prompt's tokens, the
// hash chain, one page's bytes) are written into fresh pages of its table
// and indexed, as if computed.  No more than the arena can give; the
// admission's re-plan sees the rest.
void engine::load_from_tier(live_seq& s) {
  auto tier = std::exchange(s.tier, {});
  if (tier.empty() || !opts_.prefix_caching) return;
  const int32_t ps = info_.page_size;
  const auto& keyed = cache_tokens(s);
  const auto hashes = pool_->prompt_hashes(keyed);
  const int32_t have = s.pages;  // the cached run match_prefix mapped
  std::vector<const kv_page*> take;
  for (const auto& p : tier) {
    const int32_t i = p.depth;
    if (i < have) continue;
    if (i != have + int32_t(take.size()) || i >= int32_t(hashes.size())) break;
    const bool fits =
        p.space == kv_space_ && p.hash == hashes[i] && p.parent == (i == 0 ? 0 : hashes[i - 1]) &&
        int32_t(p.tokens.size()) == ps &&
        std::equal(p.tokens.begin(), p.tokens.end(), keyed.begin() + size_t(i) * ps) &&
        p.bytes.size() == info_.kv_bytes_per_page;
    if (!fits) break;
    take.push_back(&p);
  }
  // Computing these tokens would take the same pages: loading them only
  // takes them sooner.  One page is left for the chunk after them; when the
  // re-plan is short, preemption frees what it must, and loaded pages stay
  // indexed for the next admission to map.
  const int32_t room = std::max(0, pool_->available() - 1);
  take.resize(std::min<size_t>(take.size(), size_t(room)));
  if (take.empty()) return;
  auto arena = pool_->reserve(static_cast<int32_t>(take.size()));
  // What reserve() evicted is read before these pages are written.
  spill_evicted();
  engine_cmd::load ld;
  ld.data.reserve(take.size() * info_.kv_bytes_per_page);
  for (size_t k = 0; k < take.size(); ++k) {
    const kv_page& p = *take[k];
    pool_->append_loaded(s.key, arena[k], p.hash, p.parent, p.depth, p.tokens);
    ld.pages.push_back(arena[k]);
    ld.data.insert(ld.data.end(), p.bytes.begin(), p.bytes.end());
    loading_[arena[k]] = p.hash;
  }
  const auto n = static_cast<int32_t>(take.size());
  s.pages += n;
  s.computed += n * ps;
  s.tier_tokens = n * ps;
  counters_.loaded_pages += n;
  // Before the step that reads them (the device serves commands in order).
  out(std::move(ld));
}

void engine::on_loaded(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) loading_.erase(p);
}

void engine::on_load_failed(const std::vector<int32_t>& pages, const std::string& why) {
  spdlog::warn("instance: loading {} KV pages from the KV store failed: {}", pages.size(), why);
  // Only the pages still indexed under what was loaded into them hold the
  // failed write's garbage for anyone to map; one reused since was written
  // afresh.
  std::unordered_set<int32_t> bad;
  for (int32_t p : pages) {
    auto it = loading_.find(p);
    if (it != loading_.end() && pool_->indexes(p, it->second)) bad.insert(p);
    loading_.erase(p);
  }
  std::vector<uint64_t> hit;
  for (const auto& [key, s] : seqs_) {
    if (!pool_->has_sequence(key)) continue;
    for (int32_t p : pool_->table(key))
      if (bad.count(p)) {
        hit.push_back(key);
        break;
      }
  }
  for (int32_t p : bad) pool_->forget(p);
  for (uint64_t key : hit) fail(key, "loading its cached prefix failed: " + why);
  step();
}

// Ends a sequence in the order finish and cancel share: out of the
// scheduler, then the stream's last batch, then its pages.
//
// take_out is the first part: the sequence leaves the maps (the scheduler
// no longer sees it); its pages stay until the caller frees them.
engine::live_seq engine::take_out(uint64_t key) {
  auto it = seqs_.find(key);
  live_seq s = std::move(it->second);
  seqs_.erase(it);
  keys_.erase(s.req.id);
  counters_.swap_bytes -= s.blob.size();
  if (s.in_store) out(engine_cmd::swap_drop{key});
  s.state = seq_state::finished;
  return s;
}

void engine::finish(uint64_t key, token_batch last) {
  if (!seqs_.count(key)) return;
  live_seq s = take_out(key);
  if (last.finish == finish_reason::aborted)
    ++counters_.aborted;
  else
    ++counters_.finished;
  // A whole output teaches the length predictor (not one cut short by a
  // cancel, an error, the context or a move elsewhere).
  const bool whole = last.finish == finish_reason::eos ||
                     last.finish == finish_reason::stop_token ||
                     last.finish == finish_reason::max_tokens;
  if (whole && s.predicted_bucket >= 0)
    lengths_.observe(s.length_class, s.predicted_bucket, s.generated());
  out(engine_cmd::emit{key, std::move(last)});
  pool_->free_sequence(key);
}

void engine::fail(uint64_t key, const std::string& why) {
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return;
  spdlog::warn("instance: request {} failed: {}", it->second.req.id, why);
  token_batch last;
  last.id = it->second.req.id;
  last.finish = finish_reason::error;
  last.error = why;
  finish(key, std::move(last));
}

// Runs one sequence's bookkeeping; an exception in it ends that sequence
// with an error naming what failed, and the engine goes on with the rest.
template <class F>
void engine::guarded(uint64_t key, const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fail(key, std::string(what) + ": " + e.what());
  }
}

finish_reason engine::stop_reason(const live_seq& s, int32_t token) const {
  const auto& eog = opts_.eog_tokens;
  // A constraint lets the end through only where the output may end, so
  // there it ends the output even with ignore_eos.
  if ((!s.req.ignore_eos || s.constraint) && std::find(eog.begin(), eog.end(), token) != eog.end())
    return finish_reason::eos;
  const auto& stop = s.req.stop_tokens;
  if (std::find(stop.begin(), stop.end(), token) != stop.end()) return finish_reason::stop_token;
  if (s.generated() >= s.req.max_tokens) return finish_reason::max_tokens;
  if (static_cast<int32_t>(s.tokens.size()) >= max_len_) return finish_reason::context;
  return finish_reason::none;
}

// Preemption: the pages go back to the pool now; the sequence waits with
// its tokens, and either its KV in the host tier (swap) or nothing
// (recompute: its tokens are prefilled again, mostly from the prefix cache
// when its pages were not evicted meanwhile).
void engine::preempt(uint64_t key) {
  live_seq& s = seqs_.at(key);
  ++s.epoch;
  const bool swap = opts_.preemption == preempt_mode::swap && s.computed > 0;
  if (swap) {
    auto table = pool_->export_pages(key);
    table.pages.resize(pool_->pages_for(s.computed));
    s.state = seq_state::swapping_out;
    // The device serves commands in order: this read sees the pages before
    // any later step reuses them.
    out(engine_cmd::swap_out{key, std::move(table.pages)});
    ++counters_.preempted_swap;
  } else {
    s.computed = 0;
    s.state = seq_state::waiting;
    ++counters_.preempted_recompute;
  }
  pool_->free_sequence(key);
  s.pages = 0;
  s.committed_pages = 0;
  out(engine_cmd::preempted{key, s.req.id, swap});
}

void engine::on_swapped_out(uint64_t key, std::vector<uint8_t> data) {
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return;  // aborted meanwhile
  counters_.swap_bytes += data.size();
  it->second.blob = std::move(data);
  it->second.state = seq_state::swapped;
  step();
}

void engine::on_swapped_to_store(uint64_t key) {
  auto it = seqs_.find(key);
  if (it == seqs_.end()) {
    out(engine_cmd::swap_drop{key});  // aborted meanwhile
    return;
  }
  it->second.in_store = true;
  it->second.state = seq_state::swapped;
  step();
}

void engine::on_swap_fetched(uint64_t key, std::vector<uint8_t> data) {
  auto it = seqs_.find(key);
  if (it == seqs_.end() || !it->second.in_store) return;  // aborted meanwhile
  auto& s = it->second;
  s.in_store = false;
  s.fetching = false;
  counters_.swap_bytes += data.size();
  s.blob = std::move(data);
  step();
}

void engine::on_swap_fetch_failed(uint64_t key, const std::string& why) {
  auto it = seqs_.find(key);
  if (it == seqs_.end() || !it->second.in_store) return;
  auto& s = it->second;
  spdlog::warn("instance: the KV store lost the swapped KV of request {} ({}), recomputing",
               s.req.id, why);
  s.in_store = false;
  s.fetching = false;
  s.state = seq_state::waiting;
  s.computed = 0;
  step();
}

// Swapped sequences whose KV is in the store come back, oldest first, as
// far as the arena has room for them now (their admission needs those
// pages; the fetched bytes wait in `blob` for it).
void engine::fetch_stored() {
  std::vector<live_seq*> stored;
  int32_t claimed = 0;
  for (auto& [key, s] : seqs_) {
    if (!s.in_store) continue;
    if (s.fetching)
      claimed += pool_->pages_for(s.computed);
    else
      stored.push_back(&s);
  }
  std::sort(stored.begin(), stored.end(),
            [](const live_seq* a, const live_seq* b) { return a->order < b->order; });
  for (live_seq* s : stored) {
    const int32_t need = pool_->pages_for(s->computed);
    if (claimed + need > pool_->available()) break;
    claimed += need;
    s->fetching = true;
    out(engine_cmd::swap_fetch{s->key});
  }
}

void engine::on_swap_out_failed(uint64_t key, const std::string& why) {
  // Fall back to recomputing it.
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return;
  spdlog::warn("instance: swap-out of request {} failed ({}), recomputing", it->second.req.id, why);
  it->second.state = seq_state::waiting;
  it->second.computed = 0;
  step();
}

// Starts a waiting sequence: its swapped-out KV comes back into fresh
// pages, or its cached prefix is mapped from the prefix index.
void engine::admit(uint64_t key) {
  live_seq& s = seqs_.at(key);
  if (s.has_blob()) {
    // Short only when an earlier admission of this round mapped more
    // reusable pages than its first chunk needed: it waits for the next plan.
    auto pages = pool_->reserve(pool_->pages_for(s.computed));
    if (pages.empty()) return;
    s.run();
    ++counters_.admitted;
    pool_->attach({key, s.computed, pages});
    s.pages = static_cast<int32_t>(pages.size());
    s.committed_pages = 0;  // attached tables are re-offered to the index
    counters_.swap_bytes -= s.blob.size();
    out(engine_cmd::swap_in{key, std::move(pages), std::move(s.blob)});
    s.blob.clear();
    return;
  }
  ++counters_.admitted;
  s.computed = 0;
  s.pages = 0;
  s.pooled.clear();
  // An embedding pools every row's hidden state: cached rows have none.
  if (caches_prefix(s) && !s.req.embed) {
    auto m = pool_->match_prefix(key, cache_tokens(s));
    s.computed = m.cached_tokens;
    s.pages = static_cast<int32_t>(m.pages.size());
    load_from_tier(s);
    counters_.cached_tokens += s.computed;
  }
  s.tier.clear();
  if (s.first_admission) s.prompt_cached = s.computed;
  s.first_admission = false;
  s.committed_pages = s.pages;
  s.run();
}

void engine::order_admissions(std::vector<sched_seq>& waiting) {
  const admission_policy& policy = opts_.admission;
  if (waiting.empty() || (policy.mode == batching_mode::continuous && !policy.order)) return;
  std::sort(waiting.begin(), waiting.end(),
            [](const sched_seq& a, const sched_seq& b) { return a.order < b.order; });
  const double now_ms = ms_since(born_);
  std::vector<admission_candidate> cands;
  for (const auto& w : waiting) {
    const live_seq& s = seqs_.at(w.id);
    admission_candidate c;
    c.key = w.id;
    c.started = !s.first_admission || s.has_blob();
    // Its output still to come: the predicted bucket's tokens, within what
    // max_tokens leaves.
    const int32_t left = std::max(0, s.req.max_tokens - s.generated());
    c.predicted_tokens =
        s.predicted_bucket < 0 ? left : std::min(left, bucket_tokens(s.predicted_bucket));
    // Its completion deadline: the first token's target, then one TPOT
    // target per token; with no targets, an hour (after every deadline).
    const double due_ms =
        s.req.ttft_target_ms > 0 || s.req.tpot_target_ms > 0
            ? s.arrived_ms + s.req.ttft_target_ms + s.req.tpot_target_ms * c.predicted_tokens
            : now_ms + 3.6e6;
    c.slo_s = (due_ms - now_ms) / 1000.0;
    cands.push_back(c);
  }
  auto order = admission_order(cands, policy, admission_,
                               [this](uint64_t key) { return seqs_.count(key) > 0; });
  std::unordered_map<uint64_t, const sched_seq*> by_key;
  for (const auto& w : waiting) by_key.emplace(w.id, &w);
  std::vector<sched_seq> ordered;
  for (size_t i = 0; i < order.size(); ++i) {
    sched_seq d = *by_key.at(order[i]);
    // The policy's order replaces the deadline and arrival ranks (the
    // scheduler still takes online before offline).
    d.deadline = 0;
    d.order = i;
    ordered.push_back(std::move(d));
  }
  waiting = std::move(ordered);
}

sched_seq engine::describe(const live_seq& s) const {
  sched_seq d{s.key,   s.req.cls,    s.order, s.computed, static_cast<int32_t>(s.tokens.size()),
              s.pages, s.has_blob(), {},      s.deadline};
  // The real table, so the plan knows which pages are shared (a cached
  // prefix) and are not freed by preempting this sequence alone.
  if (s.running() && pool_->has_sequence(s.key)) d.table = pool_->table(s.key);
  return d;
}

namespace {

// Pages that preempting `key` gives back now: those no other table holds.
int32_t own_pages(const page_pool& pool, uint64_t key) {
  if (!pool.has_sequence(key)) return 0;
  int32_t n = 0;
  for (int32_t p : pool.table(key)) n += pool.refcount(p) == 1 ? 1 : 0;
  return n;
}

}  // namespace

// A step the pool refused (page copies the plan could not foresee): make
// room without ever retrying unchanged.  Preempt the lowest-priority
// running sequence that frees at least one page, never the highest-priority
// one (it alone always fits); when none frees anything, fail the
// lowest-priority sequence of the step with a clear error.  Either way one
// sequence leaves the running set, so the step loop ends.
void engine::make_room(const std::vector<step_chunk>& chunks, int32_t short_by,
                       std::unordered_set<uint64_t>& preempted_now) {
  const live_seq* best = nullptr;
  for (const auto& [key, s] : seqs_)
    if (s.running() && (!best || runs_before(describe(s), describe(*best)))) best = &s;
  const live_seq* victim = nullptr;
  for (const auto& [key, s] : seqs_)
    if (s.running() && &s != best && own_pages(*pool_, key) > 0 &&
        (!victim || runs_before(describe(*victim), describe(s))))
      victim = &s;
  if (victim) {
    spdlog::warn("instance: step short of {} pages, preempting request {}", short_by,
                 victim->req.id);
    preempted_now.insert(victim->key);
    preempt(victim->key);
    return;
  }
  const live_seq* last = nullptr;
  for (const auto& c : chunks) {
    const live_seq& s = seqs_.at(c.id);
    if (!last || runs_before(describe(*last), describe(s))) last = &s;
  }
  fail(last->key,
       "KV arena exhausted: the step needs " + std::to_string(short_by) +
           " more pages and no other sequence can give one back (the rest are shared prefix "
           "pages); raise --kv-mb");
}

// Speculative decoding: each decode chunk of a sequence that asks for it
// takes n-gram draft tokens (runtime/engine/ngram_draft) as extra rows, within the
// step's rows, the free pages (beyond what the plan takes), its context and
// its max_tokens.
void engine::add_drafts(const step_plan& plan, std::vector<step_chunk>& chunks) {
  int32_t rows_left = opts_.limits.max_batch_tokens - plan.tokens;
  int32_t pages_left = pool_->available() - plan.new_pages;
  const int32_t ps = info_.page_size;
  auto pages_for = [ps](int32_t n) { return (n + ps - 1) / ps; };
  for (size_t i = 0; i < plan.decode.size() && rows_left > 0; ++i) {
    step_chunk& c = chunks[i];
    live_seq& s = seqs_.at(c.id);
    const int32_t want = s.req.draft_tokens >= 0 ? s.req.draft_tokens : opts_.draft_tokens;
    if (want <= 0 || c.n_tokens != 1 || s.req.prefill_only) continue;
    if (s.draft_rest > 0) {
      --s.draft_rest;
      continue;
    }
    // k accepted drafts and the token after them: start + k + 2 tokens.
    int32_t room = std::min({want, std::max(s.draft_cap, 1), rows_left, max_len_ - c.start - 2,
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
bool engine::has_work() const {
  for (const auto& [key, s] : seqs_)
    if (s.running() || s.state == seq_state::waiting || s.state == seq_state::swapped ||
        s.state == seq_state::importing)
      return true;
  return false;
}

// Lockstep: the step of a round has ended after `ms` (call before planning
// the next).
void engine::report_round(double ms, bool dummy) {
  const uint64_t round = std::exchange(stepping_, 0);
  if (round != 0 && lockstep_) out(engine_cmd::round_done{round, ms, dummy});
}

// Lockstep: a round came and the engine has nothing to compute; it runs a
// one-row step on its own page anyway, as the group's other replicas wait
// for every member (vLLM's DP coordinator does the same, so an MoE model's
// collectives never miss a member).  After it, it asks for the next round
// only if work came meanwhile and it was idle when the round began (a
// replica whose work could not be planned waits for news instead of
// spinning).
void engine::dummy_step(bool had_work) {
  forward_batch b;
  b.tokens = {0};
  b.positions = {0};
  b.seqs.push_back(forward_seq{0, 1, dummy_page_});
  b.logit_rows = {0};
  dummy_running_ = true;
  dummy_had_work_ = had_work;
  stepping_ = std::exchange(granted_, 0);
  dummy_start_ = std::chrono::steady_clock::now();
  out(engine_cmd::forward{0, std::move(b), true});
}

void engine::on_dummy_done() {
  dummy_running_ = false;
  report_round(ms_since(dummy_start_), true);
  if (!dummy_had_work_) step();
}

bool engine::busy() const {
  return dummy_running_ || !inflight_.empty();
}

// Step overlap: the step on the device is chainable, so the next may be
// planned and sent now (never in a group's lockstep rounds, where each
// step waits for its round).
bool engine::may_plan_ahead() const {
  return opts_.step_overlap && !lockstep_ && inflight_.size() == 1 && inflight_.front().chainable;
}

// Step overlap: whether the device can draw the token `c` samples for `s`
// exactly as advance() will.  Structured output masks with the engine's
// constraint state, and a sequence that wants drafts needs its last token
// to propose them; both wait for the result instead.
bool engine::drawable(const live_seq& s, const step_chunk& c) const {
  const int32_t drafts = s.req.draft_tokens >= 0 ? s.req.draft_tokens : opts_.draft_tokens;
  return opts_.step_overlap && !lockstep_ && c.sample && c.draft.empty() && !s.constraint &&
         !s.req.prefill_only && !s.req.embed && drafts <= 0;
}

// Whether the token a sequence samples next ends it (max_tokens, context),
// whatever it is: a step planned ahead leaves it out.
bool engine::ends_at_next_token(const live_seq& s) const {
  return s.req.embed || s.generated() + 1 >= s.req.max_tokens ||
         static_cast<int32_t>(s.tokens.size()) + 1 >= max_len_;
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
// a loop that never returns to the caller), so every round moves a
// sequence from waiting to running or out of the running set for good,
// and the rounds are bounded by twice the sequences.
void engine::step() {
  if (dummy_running_) return;
  if (!inflight_.empty() && !may_plan_ahead()) return;
  if (lockstep_ && granted_ == 0) {
    // Lockstep: it steps only in the group's rounds; ask for one.
    if (!asked_ && has_work()) {
      asked_ = true;
      out(engine_cmd::ask_round{});
    }
    return;
  }
  // Planning ahead: the chunks of the step on the device, by sequence.
  const inflight_step* ahead = inflight_.empty() ? nullptr : &inflight_.back();
  std::unordered_map<uint64_t, size_t> in_ahead;
  for (size_t i = 0; ahead && i < ahead->chunks.size(); ++i)
    in_ahead.emplace(ahead->chunks[i].id, i);
  std::unordered_set<uint64_t> preempted_now;
  bool restarted = false;
  fetch_stored();
  for (;;) {
    std::vector<sched_seq> running, waiting;
    for (const auto& [key, s] : seqs_) {
      if (s.running()) {
        sched_seq d = describe(s);
        auto a = in_ahead.find(key);
        if (a != in_ahead.end() && ahead->epochs[a->second] == s.epoch) {
          // As it will be once the step on the device is done.
          const step_chunk& c = ahead->chunks[a->second];
          if (c.sample && ends_at_next_token(s)) continue;
          d.computed = c.start + c.n_tokens;
          d.total = static_cast<int32_t>(s.tokens.size()) + (c.sample ? 1 : 0);
        }
        running.push_back(std::move(d));
      } else if (s.schedulable() && !preempted_now.count(key)) {
        waiting.push_back(describe(s));
      }
    }
    order_admissions(waiting);
    auto plan = plan_step(running, waiting, opts_.limits, pool_->available());
    for (uint64_t v : plan.preempted) {
      preempted_now.insert(v);
      guarded(v, "preempt", [&] { preempt(v); });
    }
    if (!plan.admitted.empty()) {
      for (uint64_t a : plan.admitted) guarded(a, "admit", [&] { admit(a); });
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
    if (!ahead) add_drafts(plan, chunks);  // drafts follow a sequence's last token
    std::vector<alloc_request> reqs;
    for (const auto& c : chunks) reqs.push_back({c.id, c.start + c.n_tokens});
    step_allocation alloc;
    try {
      alloc = pool_->allocate_step(reqs);
    } catch (const std::exception& e) {
      // The pool refused the step as a whole (a bookkeeping bug): its
      // sequences end with the reason; the others go on.
      for (const auto& c : chunks) fail(c.id, std::string("page allocation: ") + e.what());
      continue;
    }
    if (!alloc.ok) {
      make_room(chunks, alloc.pages_short, preempted_now);
      continue;
    }
    if (!alloc.copies.empty()) {
      // A failed copy leaves the new pages' heads unwritten: the sequences
      // that own them fail then, before the step's result (the device
      // answers in order), instead of decoding from garbage.
      engine_cmd::copy_pages cp;
      for (const auto& c : alloc.copies) {
        cp.src.push_back(c.src);
        cp.dst.push_back(c.dst);
        cp.owners.push_back(c.seq);
      }
      out(std::move(cp));
    }

    forward_batch b;
    inflight_step fl;
    const uint64_t id = next_step_++;
    fl.id = b.step = id;
    fl.n_decode = plan.decode.size();
    fl.chainable = true;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      live_seq& s = seqs_.at(c.id);
      s.pages = static_cast<int32_t>(alloc.tables[i].pages.size());
      forward_seq fs{static_cast<int32_t>(b.tokens.size()), c.n_tokens,
                     std::move(alloc.tables[i].pages)};
      for (int32_t j = 0; j < c.n_tokens; ++j) {
        const int32_t pos = c.start + j;
        if (j > 0 && !c.draft.empty()) {
          b.tokens.push_back(c.draft[j - 1]);
        } else if (pos < static_cast<int32_t>(s.tokens.size())) {
          if (const float* e = embedding_at(s.req.embeds, pos, info_.n_embd)) {
            b.embed_rows.push_back(static_cast<int32_t>(b.tokens.size()));
            b.embed_input.insert(b.embed_input.end(), e, e + info_.n_embd);
          }
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
      // A penalized row's window must be known but for its last token
      // (never otherwise with one step ahead; were it not, the sequence
      // waits for its result instead).
      const int32_t at = c.start + c.n_tokens;
      if (drawable(s, c) && static_cast<int64_t>(s.tokens.size()) >= int64_t(at) - 1) {
        drawn = static_cast<int32_t>(b.presample.size());
        b.presample.push_back(make_presample_row(static_cast<int32_t>(b.logit_rows.size()),
                                                 s.req.sampling, at, s.tokens));
      } else if (c.sample) {
        fl.chainable = false;
      }
      // A drafted chunk is verified row by row: every row's logits.  An
      // embedding's rows come back as hidden states instead.
      if (s.req.embed) {
        for (int32_t j = 0; j < c.n_tokens; ++j) b.hidden_rows.push_back(fs.first_row + j);
      } else {
        for (int32_t j = c.draft.empty() ? c.n_tokens - 1 : 0; c.sample && j < c.n_tokens; ++j)
          b.logit_rows.push_back(fs.first_row + j);
      }
      b.seqs.push_back(std::move(fs));
      fl.epochs.push_back(s.epoch);
      fl.drawn.push_back(drawn);
      fl.embeds.push_back(s.req.embed);
    }
    fl.chunks = std::move(chunks);
    fl.sent = std::chrono::steady_clock::now();
    if (ahead) ++counters_.overlapped_steps;
    inflight_.push_back(std::move(fl));
    stepping_ = std::exchange(granted_, 0);
    ++counters_.steps;
    out(engine_cmd::forward{id, std::move(b), false});
    // Step overlap: plan the next one while this one runs.
    if (may_plan_ahead()) step();
    return;
  }
}

void engine::on_step_failed(uint64_t id, const std::string& why) {
  if (inflight_.empty() || inflight_.front().id != id) return;
  inflight_step failed = std::move(inflight_.front());
  inflight_.pop_front();
  last_result_ = std::chrono::steady_clock::now();
  report_round(ms_since(failed.sent), false);
  for (const auto& c : failed.chunks) fail(c.id, "forward: " + why);
  step();
}

// Co-location's TPOT guard (instance_options::tpot_target_ms): additive
// increase, multiplicative decrease of the offline rows a step takes while
// online sequences decode.
void engine::guard_tpot(const std::vector<step_chunk>& chunks, size_t n_decode, double ms) {
  auto& lim = opts_.limits;
  if (!lim.offline_yields || opts_.tpot_target_ms <= 0) return;
  bool online_decode = false;
  for (size_t i = 0; i < n_decode && i < chunks.size() && !online_decode; ++i) {
    auto it = seqs_.find(chunks[i].id);
    online_decode = it != seqs_.end() && it->second.req.cls == seq_class::online;
  }
  if (!online_decode) return;
  const int32_t full = lim.max_batch_tokens;
  if (ms > opts_.tpot_target_ms)
    lim.offline_rows = std::min(lim.offline_rows, full) / 2;
  else if (ms < 0.8 * opts_.tpot_target_ms && lim.offline_rows < full)
    lim.offline_rows = std::min(full, lim.offline_rows + 4);
}

// Step overlap: the token the engine has for chunk `c` must be the one the
// device drew (`dev`) for the step it may already run; a sequence where
// they differ (a bug, never expected) ends with an error rather than go on
// from a token it did not sample.
void engine::check_draw(const step_chunk& c, int32_t dev) {
  auto it = seqs_.find(c.id);
  if (it == seqs_.end()) return;
  const auto& tokens = it->second.tokens;
  const size_t at = static_cast<size_t>(c.start + c.n_tokens);
  if (tokens.size() <= at) return;
  if (tokens[at] != dev)
    fail(c.id, "step overlap: the device drew token " + std::to_string(dev) +
                   " for the next step, the sampler " + std::to_string(tokens[at]));
}

// The step is done: advance each sequence, sample those whose chunk ended
// at their last token, stream, and plan the next step.  Sequences aborted
// or preempted while the step ran are gone, not running, or of a later
// epoch, and are skipped.
void engine::on_step_done(uint64_t id, forward_result& r) {
  if (inflight_.empty() || inflight_.front().id != id) {
    spdlog::error("instance: the result of step {} came out of order", id);
    return;
  }
  inflight_step done = std::move(inflight_.front());
  inflight_.pop_front();
  // Queued behind the step before it, a step starts when that one ends.
  const double ms = ms_since(std::max(done.sent, last_result_));
  last_result_ = std::chrono::steady_clock::now();
  const auto& chunks = done.chunks;
  counters_.step_ms += ms;
  if (r.idle_ms > 0) counters_.device_idle_ms += r.idle_ms;
  report_round(ms, false);
  step_timing t{done.id, 0, ms, 0, 0, 0, r.idle_ms, r.device_ms};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    t.rows += c.n_tokens;
    if (i < done.n_decode) t.decode_rows += c.n_tokens;
    // Row j of the chunk attends to positions [0, start + j].
    t.context += int64_t(c.n_tokens) * c.start + int64_t(c.n_tokens) * (c.n_tokens + 1) / 2;
  }
  recent_steps_.push_back(t);
  if (recent_steps_.size() > opts_.kept_steps) recent_steps_.pop_front();
  guard_tpot(chunks, done.n_decode, ms);
  const auto host_start = std::chrono::steady_clock::now();
  size_t row = 0, hidden_row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    const size_t logits_row = row;
    const size_t first_hidden = hidden_row;
    if (done.embeds[i])
      hidden_row += static_cast<size_t>(c.n_tokens);
    else if (c.sample)
      row += c.draft.empty() ? 1 : c.draft.size() + 1;
    // Aborted, being exported or preempted while the step ran: its part is
    // dropped (an export carries the KV it had when it began).
    auto it = seqs_.find(c.id);
    if (it == seqs_.end() || !it->second.running() || it->second.epoch != done.epochs[i]) continue;
    // Step overlap: the device's draw for this chunk (-1: none, or refused).
    const int32_t k = done.drawn[i];
    const int32_t drawn = k >= 0 && static_cast<size_t>(k) < r.drawn.size() ? r.drawn[k] : -1;
    guarded(c.id, "step result", [&] {
      if (done.embeds[i])
        pool_rows(c, r, first_hidden);
      else
        advance(c, i < done.n_decode, r, logits_row, drawn);
    });
    if (k >= 0) check_draw(c, drawn);
  }
  step();
  if (!recent_steps_.empty()) recent_steps_.back().host_ms = ms_since(host_start);
}

// Samples the token after the sequence's tokens from `logits` (masked by
// its output constraint, which then advances), appends it to the sequence
// and to `out` (with its logprobs when asked).
int32_t engine::sample_next(live_seq& s, std::span<const float> logits, token_batch& out) {
  std::vector<float> masked;  // structured output: only tokens that keep the output valid
  if (s.constraint) {
    // The output must close before the sequence's budget ends.
    const int32_t left = std::min(s.req.max_tokens - s.generated(),
                                  max_len_ - static_cast<int32_t>(s.tokens.size()));
    const auto& allow = s.constraint->allowed(s.constraint_state, left);
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

// One sequence's part of a step's result.  A drafted decode chunk is
// verified as sequential decoding would run: row j's logits give the token
// after the draft's first j tokens, sampled exactly as without drafts (same
// sampler, same random draws), and the next row counts only while that token
// equals the draft's.  So the output is the same with or without drafts.
void engine::advance(const step_chunk& c, bool decode, const forward_result& r, size_t logits_row,
                     int32_t drawn) {
  live_seq& s = seqs_.at(c.id);
  // Rows whose KV now holds the sequence's own tokens: all of a prefill
  // chunk; of a drafted chunk the decode row, then each accepted draft.
  s.computed += c.draft.empty() ? c.n_tokens : 1;
  (decode ? counters_.decode_tokens : counters_.prefill_tokens) += c.n_tokens;
  // The pool indexes only the positions its table covers (computed, once
  // rejected drafts are given back), not the token sampled after them.
  auto commit_pages = [&] {
    if (caches_prefix(s) && s.computed / info_.page_size > s.committed_pages) {
      pool_->commit_full_pages(s.key, cache_tokens(s));
      s.committed_pages = s.computed / info_.page_size;
      copy_out(s);
    }
  };
  if (c.draft.empty()) commit_pages();
  s.run();
  if (!c.sample) return;
  const size_t rows = c.draft.size() + 1;
  if (r.n_vocab != info_.n_vocab || r.logits.size() < (logits_row + rows) * size_t(r.n_vocab))
    throw std::runtime_error("the forward pass returned " + std::to_string(r.logits.size()) +
                             " logits of vocabulary " + std::to_string(r.n_vocab));
  token_batch batch;
  batch.id = s.req.id;
  for (size_t j = 0; j < rows; ++j) {
    std::span<const float> logits(r.logits.data() + (logits_row + j) * r.n_vocab, r.n_vocab);
    // Step overlap: the device drew this token already, with this sampler
    // on these logits; without logprobs to report, it is taken as is.  (A
    // drawn chunk has no draft and no constraint, drawable() says: one row.)
    int32_t token = drawn;
    if (drawn >= 0 && !sampler::wants_logprobs(s.req.sampling)) {
      s.tokens.push_back(token);
      batch.tokens.push_back(token);
    } else {
      token = sample_next(s, logits, batch);
    }
    batch.finish = stop_reason(s, token);
    if (batch.finish != finish_reason::none || j == c.draft.size() || token != c.draft[j]) break;
    ++s.computed;  // the draft's token at this position was the right one: its KV stands
    ++batch.accepted;
  }
  if (!c.draft.empty()) {
    const auto d = static_cast<int32_t>(c.draft.size());
    batch.drafted = d;
    counters_.draft_tokens += d;
    counters_.accepted_tokens += batch.accepted;
    if (batch.accepted == d) {
      s.draft_cap = std::min(std::max(s.draft_cap, 1) * 2, k_max_draft_tokens);
    } else if (batch.accepted == 0) {
      s.draft_cap = std::min(s.draft_cap, d) / 2;
      if (s.draft_cap == 0) s.draft_rest = 8;
    }
    // Rejected drafts' KV slots lie past the sequence's tokens: the table
    // gives back the positions (and pages) beyond what it computed.
    s.pages -= pool_->truncate(s.key, s.computed);
    commit_pages();
  }
  s.run();
  if (!s.reported) {
    s.reported = true;
    batch.cached_tokens = s.prompt_cached;
    batch.tier_tokens = std::min(s.tier_tokens, s.prompt_cached);
  }
  if (batch.finish != finish_reason::none) {
    finish(s.key, std::move(batch));
    return;
  }
  // Disaggregation: the prefill is done; the KV waits here for its export.
  if (s.req.prefill_only) s.state = seq_state::parked;
  out(engine_cmd::emit{s.key, std::move(batch)});
}

// An embedding's part of a step's result: its rows' hidden states are
// summed; after the prompt's last row the mean, L2-normalised (llama.cpp's
// mean pooling and llama-server's default normalisation), is its answer.
void engine::pool_rows(const step_chunk& c, const forward_result& r, size_t first_hidden) {
  live_seq& s = seqs_.at(c.id);
  const auto d = static_cast<size_t>(r.n_embd);
  if (d == 0 || r.hidden.size() < (first_hidden + size_t(c.n_tokens)) * d)
    throw std::runtime_error("the forward pass returned " + std::to_string(r.hidden.size()) +
                             " hidden values for an embedding");
  if (s.pooled.empty()) s.pooled.assign(d, 0.0);
  for (int32_t j = 0; j < c.n_tokens; ++j) {
    const float* h = r.hidden.data() + (first_hidden + size_t(j)) * d;
    for (size_t e = 0; e < d; ++e) s.pooled[e] += h[e];
  }
  s.computed += c.n_tokens;
  counters_.prefill_tokens += c.n_tokens;
  s.run();
  if (caches_prefix(s) && s.computed / info_.page_size > s.committed_pages) {
    pool_->commit_full_pages(s.key, cache_tokens(s));  // other prompts may reuse its KV
    s.committed_pages = s.computed / info_.page_size;
  }
  if (!c.sample) return;  // more of the prompt to come
  double norm = 0;
  for (double& v : s.pooled) {
    v /= s.computed;
    norm += v * v;
  }
  norm = std::sqrt(norm);
  if (!std::isfinite(norm))  // as NaN logits fail a generation
    throw std::runtime_error("the embedding's hidden states are not finite");
  token_batch last;
  last.id = s.req.id;
  last.finish = finish_reason::embedded;
  last.embedding.reserve(d);
  for (double v : s.pooled) last.embedding.push_back(static_cast<float>(norm > 0 ? v / norm : 0.0));
  finish(s.key, std::move(last));
}

std::string engine::check_request(const sequence_spec& r) const {
  if (keys_.count(r.id)) return "id is already in use";
  if (r.prompt.empty()) return "empty prompt";
  const size_t total = r.prompt.size() + r.generated.size();
  // (An embedding may fill the context: nothing comes after its prompt.)
  if (static_cast<int32_t>(total) >= max_len_ + (r.embed ? 1 : 0))
    return "prompt of " + std::to_string(total) + " tokens leaves no room: at most " +
           std::to_string(max_len_ - 1) + " fit";
  for (const auto* part : {&r.prompt, &r.generated})
    for (int32_t t : *part)
      if (t < 0 || t >= info_.n_vocab)
        return "prompt token " + std::to_string(t) + " is outside the vocabulary";
  if (auto why = check_embeds(r.embeds, static_cast<int32_t>(r.prompt.size()), info_.n_embd);
      !why.empty())
    return why;
  if (r.max_tokens <= 0) return "max_tokens must be positive";
  if (static_cast<int32_t>(r.generated.size()) >= r.max_tokens)
    return "the " + std::to_string(r.generated.size()) +
           " tokens generated already reach max_tokens";
  return validate(r.sampling);
}

// The compiled constraint of a request (cached by pattern) and its state
// after the tokens generated so far; "" or why it cannot be applied.
std::string engine::constrain(const sequence_spec& r, std::shared_ptr<token_constraint>& c,
                              int& state) {
  if (r.constraint.empty()) return {};
  if (!opts_.token_bytes) return "this instance cannot apply output constraints";
  try {
    auto it = constraints_.find(r.constraint);
    // One past a budget let go of what it built: made anew for this request.
    if (it != constraints_.end() && it->second->exhausted()) {
      constraints_.erase(it);
      it = constraints_.end();
    }
    if (it == constraints_.end()) {
      // A bounded cache: 64 patterns, 512 MB of automata and masks.
      size_t held = 0;
      for (const auto& [pattern, made] : constraints_) held += made->footprint_bytes();
      if (constraints_.size() >= 64 || held > (size_t{512} << 20)) constraints_.clear();
      it = constraints_
               .emplace(r.constraint, std::make_shared<token_constraint>(
                                          r.constraint, opts_.token_bytes, opts_.eog_tokens))
               .first;
    }
    c = it->second;
    c->renew_work_budget();
    // Replaying an imported or recovered sequence's tokens builds states
    // too, within the same budgets.
    state = c->replay(r.generated);
  } catch (const std::exception& e) {
    if (auto f = constraints_.find(r.constraint); f != constraints_.end() && f->second->exhausted())
      constraints_.erase(f);
    c.reset();
    return std::string("output constraint: ") + e.what();
  }
  if (state < 0) return "the tokens generated so far do not match the output constraint";
  return {};
}

const std::vector<int32_t>& engine::cache_tokens(live_seq& s) const {
  if (s.req.embeds.empty()) return s.tokens;
  if (s.keyed.empty()) s.keyed = keyed_tokens(s.tokens, s.req.embeds);
  // Generated tokens (past every span) are keyed as themselves.
  if (s.keyed.size() > s.tokens.size()) s.keyed.resize(s.tokens.size());
  s.keyed.insert(s.keyed.end(), s.tokens.begin() + std::ptrdiff_t(s.keyed.size()), s.tokens.end());
  return s.keyed;
}

engine::live_seq& engine::add_sequence(sequence_spec r) {
  const uint64_t key = next_key_++;
  keys_.emplace(r.id, key);
  return seqs_.emplace(key, live_seq(std::move(r), key, key)).first->second;
}

kv_geometry engine::arena_geometry() const {
  return {info_.model_fingerprint, info_.n_layers,  info_.n_kv_heads,
          info_.head_dim,          info_.page_size, info_.kv_dtype};
}

std::string engine::enqueue(sequence_spec r, uint64_t& key, int32_t& ahead,
                            std::vector<kv_page> tier) {
  if (auto why = check_request(r); !why.empty()) return why;
  std::shared_ptr<token_constraint> c;
  int state = -1;
  if (auto why = constrain(r, c, state); !why.empty()) return why;
  ahead = 0;
  for (const auto& [k, s] : seqs_) ahead += s.holds_pages() ? 0 : 1;
  auto& added = add_sequence(std::move(r));
  added.arrived_ms = ms_since(born_);
  if (added.req.ttft_target_ms > 0 && added.req.cls == seq_class::online)
    added.deadline = added.arrived_ms + added.req.ttft_target_ms;
  if (!added.req.embed) {
    added.length_class = length_class_of(added.req);
    added.predicted_bucket = lengths_.predict(added.length_class);
  }
  added.constraint = std::move(c);
  added.constraint_state = state;
  added.tier = std::move(tier);
  key = added.key;
  step();
  return {};
}

std::string engine::import(sequence_spec r, const std::vector<uint8_t>& bytes, uint64_t& key,
                           int32_t& n_kv_out) {
  if (auto why = check_request(r); !why.empty()) return why;
  kv_blob b;
  try {
    b = decode_kv_blob(bytes);
  } catch (const kv_blob_error& e) {
    return e.what();
  }
  if (auto m = geometry_mismatch(b.geometry, arena_geometry()); !m.empty())
    return "the blob does not fit this instance: " + m;
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), r.generated.begin(), r.generated.end());
  if (b.tokens.size() > all.size() || !std::equal(b.tokens.begin(), b.tokens.end(), all.begin()))
    return "the blob's tokens are not the start of this request's tokens";
  std::shared_ptr<token_constraint> c;
  int c_state = -1;
  if (auto why = constrain(r, c, c_state); !why.empty()) return why;
  // At least the last token is computed here, for the logits of the next.
  // An embedding pools every row, and its sum does not travel: none of a
  // blob's KV is taken for it.
  const int32_t n_kv = r.embed ? 0
                               : std::min<int32_t>(static_cast<int32_t>(b.tokens.size()),
                                                   static_cast<int32_t>(all.size()) - 1);
  live_seq& s = add_sequence(std::move(r));
  s.first_admission = false;
  s.constraint = std::move(c);
  s.constraint_state = c_state;
  if (n_kv > 0) {
    // It waits as a swapped-out sequence does: admission reserves pages and
    // writes the data in (the swap-in path).
    b.pages.resize(size_t(pool_->pages_for(n_kv)) * info_.kv_bytes_per_page);
    s.computed = n_kv;
    s.state = seq_state::importing;
    s.blob = std::move(b.pages);
    counters_.swap_bytes += s.blob.size();
  }
  ++counters_.imported;
  key = s.key;
  n_kv_out = n_kv;
  step();
  return {};
}

// An export frees the sequence's pages at once, as a swap-out does (the
// device serves the read before any later step that reuses them); the
// sequence stays, exporting, until the read answers, then leaves with its
// blob.
std::string engine::begin_export(uint64_t id, export_start& x) {
  auto k = keys_.find(id);
  if (k == keys_.end()) return "no sequence of request " + std::to_string(id) + " here";
  const uint64_t key = k->second;
  live_seq& s = seqs_.at(key);
  if (!s.schedulable() && s.state != seq_state::parked)
    return "the KV of request " + std::to_string(id) + " is being read right now; ask again";
  ++counters_.exported;
  x.key = key;
  x.blob.geometry = arena_geometry();
  if (s.req.embed) {
    // Its pooled sum does not travel with the KV: the importer computes
    // the prompt afresh (an empty blob).
    pool_->free_sequence(key);
    take_out(key);
    step();
    return {};
  }
  x.blob.tokens.assign(s.tokens.begin(), s.tokens.begin() + s.computed);
  x.blob.n_prompt = std::min(s.n_prompt, s.computed);
  x.pages.clear();
  if (s.holds_pages() && s.computed > 0 && pool_->has_sequence(key)) {
    x.pages = pool_->export_pages(key).pages;
    x.pages.resize(pool_->pages_for(s.computed));
  } else if (!s.has_blob()) {
    x.blob.tokens.clear();  // nothing computed: the importer starts afresh
    x.blob.n_prompt = 0;
  }
  pool_->free_sequence(key);
  if (x.pages.empty()) {
    x.blob.pages = take_out(key).blob;
  } else {
    s.state = seq_state::exporting;
    s.pages = 0;
    out(engine_cmd::export_read{key, x.pages});
  }
  step();
  return {};
}

bool engine::end_export(uint64_t key) {
  auto it = seqs_.find(key);
  if (it == seqs_.end() || it->second.state != seq_state::exporting) return false;
  take_out(key);
  step();  // the last member of a static batch may have left: the next may start
  return true;
}

bool engine::abort(uint64_t id) {
  auto it = keys_.find(id);
  if (it == keys_.end()) return false;
  abort_key(it->second);
  // Its pages are free, and it may have been the last member of a static
  // batch: sequences waiting for either may start now (with a step in
  // flight, step() returns at once and that step's end plans the next).
  step();
  return true;
}

// Safe while steps run: the pages freed here go only to steps sent after
// them, and the device runs steps in order.  Unlike abort(), it does not
// step: its caller (a lost sink's requests, several at once) steps once
// after them all.
void engine::abort_key(uint64_t key) {
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return;
  token_batch last;
  last.id = it->second.req.id;
  last.finish = finish_reason::aborted;
  finish(key, std::move(last));
}

std::string engine::preempt_request(uint64_t id) {
  auto k = keys_.find(id);
  if (k == keys_.end()) return "no sequence of request " + std::to_string(id) + " here";
  if (!seqs_.at(k->second).running())
    return "request " + std::to_string(id) + " is not running (it waits for its turn already)";
  // (During a step, its part of the step is dropped: on_step_done skips
  // sequences that are not running.)
  preempt(k->second);
  step();
  return {};
}

std::string engine::set_limit(const std::string& name, int32_t value, int32_t& old) {
  auto& lim = opts_.limits;
  auto field = [&name](scheduler_limits& l) -> int32_t* {
    return name == "max_seqs"           ? &l.max_seqs
           : name == "max_batch_tokens" ? &l.max_batch_tokens
           : name == "chunk_size"       ? &l.chunk_size
                                        : nullptr;
  };
  scheduler_limits next = lim;
  if (!field(next))
    return "set: '" + name + "' cannot change live (max_seqs, max_batch_tokens, chunk_size can)";
  *field(next) = value;
  if (auto why = validate(next); !why.empty()) return "set " + name + ": " + why;
  old = *field(lim);
  lim = next;
  step();
  return {};
}

std::string engine::set_role(const std::string& role, std::string& old) {
  if (role != "prefill" && role != "decode" && role != "mixed" && role != "encode")
    return "'" + role + "' is not a role (prefill, decode, mixed, encode)";
  old = opts_.role;
  opts_.role = role;
  spdlog::info("instance: role {} -> {}", old, role);
  return {};
}

std::string engine::join_group() {
  leave_group();
  dummy_page_ = pool_->reserve(1);
  if (dummy_page_.empty()) return "no free KV page for dummy steps";
  lockstep_ = true;
  step();
  return {};
}

void engine::leave_group() {
  if (!dummy_page_.empty()) pool_->unreserve(dummy_page_);
  dummy_page_.clear();
  lockstep_ = false;
  granted_ = stepping_ = 0;
  asked_ = false;
}

void engine::on_round(uint64_t round) {
  asked_ = false;
  if (!lockstep_) return;
  granted_ = round;
  // A step from before the join may still run: its result steps in this
  // round.
  if (busy()) return;
  const bool had_work = has_work();
  step();
  if (granted_ != 0) dummy_step(had_work);
}

instance_stats engine::stats() const {
  instance_stats s = counters_;
  s.role = opts_.role;
  s.length_predicted = lengths_.observed();
  s.length_right = lengths_.right();
  s.static_batches = admission_.formed;
  for (const auto& [key, q] : seqs_) {
    ++(q.holds_pages() ? s.running : s.waiting);
    const int64_t left = int64_t(q.tokens.size()) - q.computed;
    if (q.state == seq_state::decoding || q.state == seq_state::parked) {
      ++s.decoding;
      s.running_tokens += int64_t(q.tokens.size());
    } else if (q.state != seq_state::finished && q.state != seq_state::exporting) {
      s.queued_prefills.push_back(int32_t(left));
    }
    const bool host_tier = q.state == seq_state::swapping_out || q.state == seq_state::swapped;
    s.swapped += host_tier ? 1 : 0;
    if (left > 1) s.queued_prefill_tokens += left;
  }
  s.kv = pool_->stats();
  s.kv_check = pool_->check_invariants();
  if (opts_.prefix_caching) s.prefix_hashes = pool_->indexed_hashes();
  s.recent_steps.assign(recent_steps_.begin(), recent_steps_.end());
  return s;
}

std::vector<engine_seq_view> engine::sequences() const {
  std::vector<engine_seq_view> out;
  for (const auto& [key, s] : seqs_)
    if (s.state != seq_state::finished && s.state != seq_state::exporting)
      out.push_back({key, s.req.id, int64_t(s.tokens.size()), s.state == seq_state::decoding,
                     std::max(0, s.req.max_tokens - s.generated()),
                     s.state == seq_state::waiting && !s.holds_pages() && !s.has_blob()});
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> engine::ids() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [key, s] : seqs_) out.emplace_back(key, s.req.id);
  return out;
}

}  // namespace troupe
