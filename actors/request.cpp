#include "actors/request.hpp"

#include <chrono>
#include <functional>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>

#include "actors/admin.hpp"
#include "actors/encoder.hpp"
#include "actors/error_text.hpp"
#include "actors/generate_check.hpp"
#include "actors/relay.hpp"
#include "runtime/common/elapsed.hpp"
#include "runtime/engine/page_pool.hpp"
#include "runtime/engine/prompt_embeds.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/text/incremental_decoder.hpp"
#include "runtime/text/stop_matcher.hpp"
#include "runtime/text/unicode.hpp"

namespace troupe {

std::string encode_frame(wire::ServerMessage& msg) {
  msg.set_protocol_version(wire::PROTOCOL_VERSION_CURRENT);
  return msg.SerializeAsString();
}

std::string error_frame(wire::ErrorCode code, const std::string& message, uint64_t request_id,
                        bool has_request_id) {
  wire::ServerMessage m;
  auto* e = m.mutable_error();
  e->set_code(code);
  // Messages quote what clients sent (a damaged image's chunk name): the
  // frame must stay parseable for a strict protobuf client.
  e->set_message(unicode::scrub_utf8(message));
  e->set_request_id(request_id);
  e->set_has_request_id(has_request_id);
  return encode_frame(m);
}

namespace {

using clock_type = std::chrono::steady_clock;

// A request the client got wrong: the code and what to tell it.
struct rejection {
  wire::ErrorCode code;
  std::string message;
};

// Where a request is, one phase at a time:
//
//   placing -> enqueueing -> running <-> moving
//      ^            |           |          |
//      +------------+-----------+----------+   (its instance died: recovery)
//   any phase -> done (finished, cancelled, rejected)
//
// A move that ends with the sequence enqueued afresh (the target refused
// the blob, or the hand-off's export failed) goes on running -> enqueueing.
enum class request_phase : uint8_t {
  placing,     // asking the router where the sequence goes
  enqueueing,  // the enqueue (or import) is on its way to the instance
  running,     // the instance holds the sequence
  moving,      // its KV is being exported to another instance (migration, hand-off)
  done,        // ended; late messages are ignored
};

const char* to_string(request_phase p) {
  switch (p) {
    case request_phase::placing:
      return "placing";
    case request_phase::enqueueing:
      return "enqueueing";
    case request_phase::running:
      return "running";
    case request_phase::moving:
      return "moving";
    case request_phase::done:
      return "done";
  }
  return "?";
}

// Every phase change goes through here, so the allowed moves are in one
// place.  A move the diagram above does not have is logged: it means an
// answer came late (an enqueue answered after a retry placed the request
// again), which the code tolerates but should not be common.
void enter(request_phase& phase, request_phase next) {
  using P = request_phase;
  const bool ok = phase == next || next == P::done || next == P::placing ||
                  (phase == P::placing && next == P::enqueueing) ||
                  (phase == P::enqueueing && next == P::running) ||
                  (phase == P::running && (next == P::moving || next == P::enqueueing)) ||
                  (phase == P::moving && (next == P::running || next == P::enqueueing));
  if (phase == P::done) return;  // nothing leaves done
  if (!ok)
    spdlog::warn("request: phase {} -> {} is not a transition", to_string(phase), to_string(next));
  phase = next;
}

struct request_state {
  std::shared_ptr<const serve_context> ctx;
  gateway_actor gateway;
  std::string client;
  wire::Generate gen;
  sequence_request seq;
  bool stream = true;
  request_phase phase = request_phase::placing;
  // Facts that hold once, whatever phases follow: the client got Accepted;
  // the disaggregated hand-off to a decode instance started.
  bool announced = false;
  bool handed_off = false;
  // Hybrid EPD's fused stages: the instance that encoded its images
  // prefills it where it can (0: the router's choice).
  uint64_t prefill_at = 0;
  // Hybrid EPD: the instance whose encoder has its images, and how many of
  // them have not answered; the router counts them waiting there until
  // told (all answered, or the request ended first).
  uint64_t encode_at = 0;
  int32_t encode_unanswered = 0;
  int placements_failed = 0;  // in a row, while recovering
  // The number of the latest placement or enqueue: callbacks of one that a
  // later one superseded (a loss seen while it was on its way) are stale.
  uint64_t attempt = 0;
  uint64_t retry_for = 0;           // the attempt a pending retry continues
  bool attach_unconfirmed = false;  // the trace names an instance no enqueue succeeded on yet
  uint64_t move = 0;                // the number of the latest move (the moving phase's)
  instance_actor instance;          // where the sequence runs now
  uint64_t instance_id = 0;
  std::unique_ptr<incremental_decoder> detok;
  std::unique_ptr<stop_matcher> stops;
  std::vector<int32_t> generated;
  std::vector<float> embedding;  // an embedding request's answer (Finished.embedding)
  wire::TokenChunk pending;      // non-streaming: everything, sent before Finished
  request_trace trace;
  clock_type::time_point arrival, enqueued, first_token, last_token;
  static inline const char* name = "request";

  bool done() const { return phase == request_phase::done; }
  // The instance holds the sequence (it may be moving it elsewhere).
  bool accepted() const {
    return phase == request_phase::running || phase == request_phase::moving;
  }
  // An instance has, or will have, the sequence: an abort must reach it.
  bool enqueued_sent() const { return accepted() || phase == request_phase::enqueueing; }
};

// A move of the sequence (migration, hand-off) starts; its number tells
// its callbacks from those of a move abandoned by a recovery.
uint64_t begin_move(request_state& st) {
  enter(st.phase, request_phase::moving);
  return ++st.move;
}

// Move `move` ended: back to `next`, unless something else (recovery, the
// end of the request, a newer move) changed the phase meanwhile.
void end_move(request_state& st, uint64_t move, request_phase next) {
  if (st.phase == request_phase::moving && st.move == move) enter(st.phase, next);
}

using self_ptr = request_actor::stateful_pointer<request_state>;

// The request ends: it stops monitoring its instance first.  CAF keeps a
// monitor on the monitored actor until that actor ends, and the monitor
// holds the monitoring actor's memory: without this, each finished request
// left about 2 KB on its long-lived instance (RSS grew with every request).
void quit(self_ptr self) {
  auto& st = self->state;
  if (st.instance) self->demonitor(st.instance.address());
  // Answers still due from an instance's encoder will not be heard: the
  // router stops counting them now.
  if (st.encode_unanswered > 0)
    self->send(st.ctx->router, encoded_atom::value, st.encode_at, st.encode_unanswered);
  st.encode_unanswered = 0;
  // Images still waiting for the encoder are skipped.
  if (!st.seq.embeds.empty() && st.ctx->encode_books) st.ctx->encode_books->withdraw(st.seq.id);
  self->quit();
}

// The sequence the client asked for, or why not (actors/generate_check).
std::optional<rejection> build_sequence(request_state& st) {
  const auto& ctx = *st.ctx;
  generate_limits limits;
  limits.tok = ctx.tok.get();
  limits.chat_template = ctx.chat_template;
  limits.add_bos = ctx.add_bos;
  limits.max_len = ctx.max_len;
  limits.default_max_tokens = ctx.default_max_tokens;
  limits.online_ttft_ms = ctx.online_ttft_ms;
  limits.online_tpot_ms = ctx.online_tpot_ms;
  limits.offline_ttft_ms = ctx.offline_ttft_ms;
  limits.offline_tpot_ms = ctx.offline_tpot_ms;
  limits.image_rows = ctx.encoder || !ctx.encoders.empty() ? ctx.image_rows : 0;
  generate_plan plan;
  auto bad = check_generate(st.gen, limits, plan);
  // What the checks reached is kept even when they refuse (the trace shows it).
  st.seq.prompt = std::move(plan.prompt);
  st.seq.sampling = plan.sampling;
  st.seq.max_tokens = plan.max_tokens;
  st.seq.stop_tokens = std::move(plan.stop_tokens);
  st.seq.ignore_eos = plan.ignore_eos;
  st.seq.cls = plan.cls;
  st.seq.constraint = std::move(plan.constraint);
  st.seq.ttft_target_ms = plan.ttft_target_ms;
  st.seq.tpot_target_ms = plan.slo_tpot_ms;
  st.seq.prompt_class = std::move(plan.prompt_class);
  st.seq.draft_tokens = plan.draft_tokens;
  st.seq.embed = plan.embed;
  st.seq.embeds = std::move(plan.images);
  st.trace.slo_ttft_ms = plan.slo_ttft_ms;
  st.trace.slo_tpot_ms = plan.slo_tpot_ms;
  if (bad) return rejection{bad->code, std::move(bad->message)};
  st.stream = plan.stream;
  st.stops = std::make_unique<stop_matcher>(std::move(plan.stops));
  st.detok = std::make_unique<incremental_decoder>(*ctx.tok);
  return std::nullopt;
}

void send_frame(self_ptr self, wire::ServerMessage& m, bool last) {
  auto& st = self->state;
  self->send(st.gateway, reply_atom::value, st.client, st.gen.request_id(), encode_frame(m), last);
}

// Ends the request with an Error instead of a Finished (nothing was generated).
void reject(self_ptr self, wire::ErrorCode code, const std::string& message) {
  auto& st = self->state;
  enter(st.phase, request_phase::done);
  self->send(st.gateway, reply_atom::value, st.client, st.gen.request_id(),
             error_frame(code, message, st.gen.request_id(), true), true);
  st.trace.finish = "rejected";
  st.trace.error = message;
  st.trace.total_ms = ms_between(st.arrival, clock_type::now());
  self->send(st.gateway, trace_atom::value, st.trace);
  quit(self);
}

void send_chunk(self_ptr self, wire::TokenChunk& chunk) {
  if (chunk.token_ids().empty() && chunk.text().empty()) return;
  wire::ServerMessage m;
  chunk.set_request_id(self->state.gen.request_id());
  *m.mutable_chunk() = std::move(chunk);
  send_frame(self, m, false);
  chunk.Clear();
}

// Text still held back by the detokenizer and the stop matcher, into chunk.
// Returns true when that text completed a stop string after all.
bool flush_text(request_state& st, wire::TokenChunk& chunk) {
  auto r = st.stops->push(st.detok->flush());
  *chunk.mutable_text() += r.emit;
  if (r.stopped) {
    st.trace.stop_matched = r.matched;
    return true;
  }
  *chunk.mutable_text() += st.stops->flush();
  return false;
}

// Sends the last chunk and Finished, records the trace, and quits.  With
// `abort`, the instance still runs the sequence: it is aborted first.
void finish(self_ptr self, wire::TokenChunk& chunk, wire::FinishReason reason, bool abort,
            const std::string& error = {}) {
  auto& st = self->state;
  const bool was_enqueued = st.enqueued_sent();
  enter(st.phase, request_phase::done);
  // The enqueue may still be unanswered: this actor quits now and would
  // never see the reply, so the abort goes out regardless.  It reaches the
  // instance after the enqueue (messages between two actors keep their
  // order), and an abort of an id the instance does not hold is ignored.
  if (abort && was_enqueued) self->send(st.instance, abort_atom::value, st.seq.id);
  if (!st.stops->stopped() && flush_text(st, chunk) && reason != wire::ERROR) reason = wire::STOP;
  if (st.stream) {
    send_chunk(self, chunk);
  } else {
    st.pending.mutable_token_ids()->MergeFrom(chunk.token_ids());
    *st.pending.mutable_text() += chunk.text();
    st.pending.mutable_logprobs()->MergeFrom(chunk.logprobs());
    send_chunk(self, st.pending);
  }
  const auto now = clock_type::now();
  auto& tr = st.trace;
  tr.completion_tokens = static_cast<int32_t>(st.generated.size());
  tr.state = "finished";
  tr.total_ms = ms_between(st.arrival, now);
  // From arrival to the first acceptance (Accepted went out then).
  tr.queue_ms = st.announced ? ms_between(st.arrival, st.enqueued) : tr.total_ms;
  tr.ttft_ms = st.generated.empty() ? 0.0 : ms_between(st.arrival, st.first_token);
  tr.tpot_ms = st.generated.size() > 1
                   ? ms_between(st.first_token, st.last_token) / (st.generated.size() - 1)
                   : 0.0;
  tr.error = error;
  tr.slo_met = (tr.slo_ttft_ms <= 0 || tr.ttft_ms <= tr.slo_ttft_ms) &&
               (tr.slo_tpot_ms <= 0 || tr.tpot_ms <= tr.slo_tpot_ms);
  if (st.ctx->monitor && st.generated.size() > 1)
    self->send(st.ctx->monitor, tpot_atom::value, st.instance_id, tr.tpot_ms);
  wire::ServerMessage m;
  auto* f = m.mutable_finished();
  f->set_request_id(st.gen.request_id());
  f->set_reason(reason);
  f->set_prompt_tokens(tr.prompt_tokens);
  f->set_completion_tokens(tr.completion_tokens);
  f->set_cached_tokens(tr.cached_tokens);
  f->set_queue_ms(tr.queue_ms);
  f->set_ttft_ms(tr.ttft_ms);
  f->set_tpot_ms(tr.tpot_ms);
  f->set_preemptions(tr.preemptions);
  f->set_stop_matched(tr.stop_matched);
  f->set_error(error);
  for (uint64_t i : tr.instances) f->add_instances(i);
  f->mutable_embedding()->Add(st.embedding.begin(), st.embedding.end());
  tr.finish = wire::FinishReason_Name(reason);
  for (auto& c : tr.finish) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  send_frame(self, m, true);
  self->send(st.gateway, trace_atom::value, tr);
  quit(self);
}

void hand_off(self_ptr self);

void on_tokens(self_ptr self, const token_batch& b) {
  auto& st = self->state;
  if (st.done()) return;
  const auto now = clock_type::now();
  if (b.cached_tokens > 0) st.trace.cached_tokens = b.cached_tokens;
  if (b.tier_tokens > 0) st.trace.tier_tokens = b.tier_tokens;
  st.trace.draft_tokens += b.drafted;
  st.trace.accepted_tokens += b.accepted;
  wire::TokenChunk chunk;
  // The token that ended the sequence (eos, a stop token) is not output.
  size_t n = b.tokens.size();
  if (n > 0 && (b.finish == finish_reason::eos || b.finish == finish_reason::stop_token)) --n;
  const bool want_logprobs = st.seq.sampling.logprobs;
  for (size_t i = 0; i < n; ++i) {
    const int32_t t = b.tokens[i];
    if (st.generated.empty()) {
      st.first_token = now;
      if (st.ctx->monitor)
        self->send(st.ctx->monitor, ttft_atom::value, st.instance_id, st.trace.predicted_ttft_ms,
                   ms_between(st.arrival, now));
    }
    st.last_token = now;
    st.generated.push_back(t);
    chunk.add_token_ids(t);
    if (want_logprobs && i < b.logprobs.size()) {
      auto* lp = chunk.add_logprobs();
      lp->set_token(t);
      lp->set_logprob(b.logprobs[i]);
      if (i < b.top.size())
        for (const auto& alt : b.top[i]) {
          auto* a = lp->add_top();
          a->set_token(alt.token);
          a->set_logprob(alt.logprob);
        }
    }
    auto r = st.stops->push(st.detok->push(t));
    *chunk.mutable_text() += r.emit;
    if (r.stopped) {
      st.trace.stop_matched = r.matched;
      // The instance may still be running the sequence: abort it.
      finish(self, chunk, wire::STOP, b.finish == finish_reason::none);
      return;
    }
  }
  switch (b.finish) {
    case finish_reason::none:
      break;
    case finish_reason::eos:
      return finish(self, chunk, wire::EOS, false);
    case finish_reason::stop_token:
      return finish(self, chunk, wire::STOP, false);
    case finish_reason::max_tokens:
    case finish_reason::context:
      return finish(self, chunk, wire::LENGTH, false);
    case finish_reason::aborted:
      return finish(self, chunk, wire::CANCELLED, false);
    case finish_reason::error:
      return finish(self, chunk, wire::ERROR, false, "engine: " + b.error);
    case finish_reason::embedded:
      st.embedding = b.embedding;
      return finish(self, chunk, wire::STOP, false);
  }
  if (st.stream) {
    send_chunk(self, chunk);
  } else {
    st.pending.mutable_token_ids()->MergeFrom(chunk.token_ids());
    *st.pending.mutable_text() += chunk.text();
    st.pending.mutable_logprobs()->MergeFrom(chunk.logprobs());
  }
  // Disaggregated: the prefill is done (the instance parked the sequence).
  if (st.seq.prefill_only && !st.handed_off) hand_off(self);
}

// The sequence as an instance should take it now: after a move or a loss
// it resumes after the tokens streamed so far.
sequence_request current_sequence(const request_state& st) {
  sequence_request seq = st.seq;
  seq.generated = st.generated;
  return seq;
}

// From now on the sequence runs on `p` (monitored; the trace says where).
void attach(self_ptr self, const placement_reply& p) {
  auto& st = self->state;
  // An embedding ends where its prompt is computed: nothing to hand off.
  st.seq.prefill_only = p.prefill_only && !st.seq.embed;
  if (st.trace.instances.empty()) st.trace.predicted_ttft_ms = p.predicted_ttft_ms;
  if (p.prefill_only) {
    st.trace.prefill_instance = p.instance;
    st.handed_off = false;  // a new prefill placement (first, or after a recovery)
  }
  // The KV store: the prompt's pages may come from the store that holds
  // this request's copies so far (asked first: a recovery resumes from
  // it), then the stores placement found; copies go where it says, if the
  // service keeps copies for this class of request.
  std::vector<kv_pool_actor> sources;
  if (st.seq.kv_copy_to) sources.push_back(st.seq.kv_copy_to);
  for (const auto& s : p.kv_sources)
    if (s != st.seq.kv_copy_to) sources.push_back(s);
  st.seq.kv_sources = std::move(sources);
  // A placement naming no store (a dp_group's, the hand-off's way back)
  // keeps the one it had.
  const auto copy_to = p.kv_copy_to ? p.kv_copy_to : st.seq.kv_copy_to;
  const bool copies = copy_to && st.ctx->kv_copy_pages > 0 && !st.seq.embed &&
                      (st.ctx->kv_copy == "always" ||
                       (st.ctx->kv_copy == "online" && st.seq.cls == seq_class::online));
  st.seq.kv_copy_to = copies ? copy_to : kv_pool_actor{};
  st.seq.kv_copy_pages = copies ? st.ctx->kv_copy_pages : 0;
  if (st.instance) self->demonitor(st.instance.address());
  st.instance = p.actor;
  st.instance_id = p.instance;
  self->monitor(st.instance);
  st.trace.instances.push_back(p.instance);
  st.attach_unconfirmed = true;
  if (st.trace.placement.empty()) st.trace.placement = p.why;
}

void place_and_enqueue(self_ptr self);

// An enqueue that never ran: the trace does not name its instance.
void forget_attach(request_state& st, uint64_t on_id) {
  if (st.attach_unconfirmed && !st.trace.instances.empty() && st.trace.instances.back() == on_id)
    st.trace.instances.pop_back();
  st.attach_unconfirmed = false;
}

// A failed placement or enqueue while recovering: place again after a
// pause (the router may still name a lost instance; retrying at once
// would spend every attempt before it hears of the loss).
void retry_later(self_ptr self) {
  auto& st = self->state;
  ++st.placements_failed;
  st.retry_for = st.attempt;
  self->delayed_send(self, std::chrono::milliseconds(50), retry_atom::value);
}

// Enqueues the sequence on the instance it is attached to.
void enqueue(self_ptr self) {
  auto& st = self->state;
  enter(st.phase, request_phase::enqueueing);
  auto on = st.instance;
  const uint64_t on_id = st.instance_id;
  const uint64_t attempt = ++st.attempt;
  self->request(on, caf::infinite, enqueue_atom::value, current_sequence(st))
      .then(
          [self, on, attempt](int32_t ahead) {
            auto& st = self->state;
            // Cancelled while the enqueue was on its way, or superseded
            // by a placement after a loss: it must not run there.
            if (st.done() || st.attempt != attempt) {
              self->send(on, abort_atom::value, st.seq.id);
              return;
            }
            enter(st.phase, request_phase::running);
            st.placements_failed = 0;
            st.attach_unconfirmed = false;
            if (st.announced) return;  // a resumed sequence: the client knows it
            st.enqueued = clock_type::now();
            if (ahead >= st.ctx->max_queue) {
              self->send(on, abort_atom::value, st.seq.id);
              return reject(self, wire::OVERLOADED,
                            "overloaded: " + std::to_string(ahead) +
                                " requests are waiting (limit " +
                                std::to_string(st.ctx->max_queue) + "); try again later");
            }
            st.announced = true;
            wire::ServerMessage m;
            m.mutable_accepted()->set_request_id(st.gen.request_id());
            m.mutable_accepted()->set_prompt_tokens(static_cast<uint32_t>(st.seq.prompt.size()));
            send_frame(self, m, false);
          },
          [self, on_id, attempt](caf::error& e) {
            auto& st = self->state;
            if (st.done() || st.attempt != attempt) return;
            if (!st.announced)
              return reject(self, wire::INVALID_ARGUMENT,
                            "the engine refused the request: " + self->system().render(e));
            // Resuming on an instance that died meanwhile: place again,
            // after a pause as a failed placement does.
            forget_attach(st, on_id);
            retry_later(self);
          });
}

// Asks the router where the sequence goes, then enqueues it there.  While
// recovering, a failed placement is retried for a while (the router may
// not have heard of the loss yet); with no instance left, the request ends
// with UNAVAILABLE.
void place_and_enqueue(self_ptr self) {
  auto& st = self->state;
  if (st.placements_failed > 40)
    return reject(self, wire::UNAVAILABLE, "no instance is serving: the request cannot go on");
  enter(st.phase, request_phase::placing);
  const uint64_t attempt = ++st.attempt;
  // The chained hashes of the full pages, as the instances index them
  // (image rows keyed by their image), so the prefix policy can find who
  // caches the longest part of it.
  std::vector<int32_t> tokens = st.seq.prompt;
  tokens.insert(tokens.end(), st.generated.begin(), st.generated.end());
  tokens = keyed_tokens(std::move(tokens), st.seq.embeds);
  std::vector<uint64_t> hashes;
  const size_t ps = static_cast<size_t>(st.ctx->page_size);
  for (uint64_t prev = 0; ps > 0 && (hashes.size() + 1) * ps < tokens.size();) {
    prev = page_hash(prev, tokens.data() + hashes.size() * ps, static_cast<int>(ps),
                     st.ctx->prefix_salt);
    hashes.push_back(prev);
  }
  self->request(st.ctx->router, std::chrono::seconds(10), place_atom::value,
                static_cast<int32_t>(tokens.size()), std::move(hashes), st.prefill_at)
      .then(
          [self, attempt](placement_reply& p) {
            if (self->state.done() || self->state.attempt != attempt) return;
            attach(self, p);
            enqueue(self);
          },
          [self, attempt](caf::error& e) {
            auto& st = self->state;
            if (st.done() || st.attempt != attempt) return;
            if (!st.announced)
              return reject(self, wire::UNAVAILABLE,
                            "no instance can take the request: " + self->system().render(e));
            retry_later(self);
          });
}

// How a move of the sequence's KV ended (move_sequence).
struct move_outcome {
  enum kind_t {
    moved,        // the target imported the KV and runs the sequence
    recomputing,  // the target refused the blob: it recomputes the sequence
    not_moved,    // the export failed: the sequence is where it was
    stale,        // the request ended, or recovery placed it elsewhere, meanwhile
  } kind = not_moved;
  size_t bytes = 0;  // the blob's size, once exported
  caf::error error;  // why, unless moved
};

// The move live migration and disaggregation share (docs/architecture.md §3.2 "Migration"): the
// instance the sequence runs on exports its KV straight to `to` in chunks
// (direct transfer, §4.10: the bytes never pass through this process), the
// request attaches to `to`, and `to` imports the blob.  Token batches the source sent before
// the export's reply are handled before it (message order), so the import
// resumes exactly after the last token streamed: none lost, none
// repeated.  A blob `to` refuses is recomputed there.  The phase leaves
// moving before `done` runs.
void move_sequence(self_ptr self, placement_reply to, std::function<void(move_outcome)> done) {
  auto& st = self->state;
  const uint64_t from = st.instance_id;
  const uint64_t move = st.move;
  to.prefill_only = false;  // it decodes where it goes
  self->request(st.instance, caf::infinite, export_to_atom::value, st.seq.id,
                caf::actor_cast<kv_receiver_actor>(to.actor))
      .then(
          [self, to, from, move, done](uint64_t transfer, uint64_t bytes) {
            auto& st = self->state;
            move_outcome out;
            out.bytes = bytes;
            if (st.done() || st.instance_id != from) {
              end_move(st, move, request_phase::running);
              out.kind = move_outcome::stale;
              out.error = caf::make_error(
                  caf::sec::invalid_argument,
                  st.done() ? "the request finished meanwhile" : "the request moved meanwhile");
              return done(std::move(out));
            }
            attach(self, to);
            if (transfer == 0) {
              // Exported, but the KV did not arrive: `to` recomputes it.
              end_move(st, move, request_phase::running);
              enqueue(self);
              out.kind = move_outcome::recomputing;
              out.error = caf::make_error(caf::sec::runtime_error, "the KV transfer failed");
              return done(std::move(out));
            }
            self->request(to.actor, caf::infinite, import_atom::value, current_sequence(st),
                          transfer)
                .then(
                    [self, move, done, out](int32_t) mutable {
                      end_move(self->state, move, request_phase::running);
                      out.kind = move_outcome::moved;
                      done(std::move(out));
                    },
                    [self, move, done, out](caf::error& e) mutable {
                      end_move(self->state, move, request_phase::running);
                      enqueue(self);  // recompute there
                      out.kind = move_outcome::recomputing;
                      out.error = std::move(e);
                      done(std::move(out));
                    });
          },
          [self, move, done](caf::error& e) {
            end_move(self->state, move, request_phase::running);
            done(move_outcome{move_outcome::not_moved, 0, std::move(e)});
          });
}

// Disaggregation (docs/architecture.md §3.3 "PD hand-off", issue 11): the prefill instance parked
// the sequence after its first token; the router picks where it decodes; the prefill instance
// exports the KV (its device reads the pages between forward passes, first come first served with
// the other transfers, never inside a batch) and the decode instance imports it.  The client sees
// one stream.  When no instance can decode, the KV goes back into the prefill instance itself; when
// a transfer fails, the decode instance recomputes.
void hand_off(self_ptr self) {
  auto& st = self->state;
  st.handed_off = true;
  begin_move(st);
  const auto started = clock_type::now();
  auto move_to = [self, started](placement_reply to) {
    move_sequence(self, to, [self, to, started](move_outcome m) {
      auto& st = self->state;
      switch (m.kind) {
        case move_outcome::stale:
          return;
        case move_outcome::not_moved: {
          // The parked copy is released when this request ends.
          placement_reply there = to;
          there.prefill_only = false;
          attach(self, there);
          st.trace.decode_instance = there.instance;
          return enqueue(self);
        }
        case move_outcome::moved:
          st.trace.transfer_ms += ms_between(started, clock_type::now());
          [[fallthrough]];
        case move_outcome::recomputing:
          st.trace.decode_instance = to.instance;
          st.trace.transfer_bytes += m.bytes;
          return;
      }
    });
  };
  self->request(st.ctx->router, std::chrono::seconds(10), place_decode_atom::value, st.instance_id,
                static_cast<int32_t>(st.seq.prompt.size() + st.generated.size()))
      .then(
          [self, move_to](placement_reply& to) {
            self->state.trace.decode_placement = to.why;
            move_to(std::move(to));
          },
          [self, move_to](caf::error& e) {
            auto& st = self->state;
            st.trace.decode_placement =
                "back into the prefill instance: " + self->system().render(e);
            move_to(
                placement_reply{st.instance_id, st.instance, "prefill instance", false, 0, {}, {}});
          });
}

// Live migration (issue 10): the sequence moves to `target`, KV and all.
// `done` gets the instance it runs on now, or why it could not move.
using migration_done = std::function<void(caf::expected<uint64_t>)>;

void start_migration(self_ptr self, uint64_t target, migration_done done) {
  auto& st = self->state;
  auto fail = [](const std::string& why) {
    return caf::make_error(caf::sec::invalid_argument, why);
  };
  if (st.done()) return done(fail("the request has finished"));
  if (st.phase == request_phase::moving) return done(fail("the request is moving already"));
  if (!st.accepted()) return done(fail("the request is not running yet; try again"));
  if (target == st.instance_id)
    return done(fail("the request runs on instance " + std::to_string(target) + " already"));
  const uint64_t move = begin_move(st);
  const auto started = clock_type::now();
  self->request(st.ctx->router, std::chrono::seconds(10), lookup_atom::value, target)
      .then(
          [self, done, target, started](placement_reply& to) {
            move_sequence(self, to, [self, done, target, started](move_outcome m) {
              auto& st = self->state;
              if (m.kind == move_outcome::stale || m.kind == move_outcome::not_moved)
                return done(std::move(m.error));
              ++st.trace.migrations;
              st.trace.migrated_bytes += m.bytes;
              if (m.kind == move_outcome::recomputing) return done(std::move(m.error));
              st.trace.migration_ms += ms_between(started, clock_type::now());
              done(target);
            });
          },
          [self, move, done](caf::error& e) {
            end_move(self->state, move, request_phase::running);
            done(std::move(e));
          });
}

caf::result<uint64_t> migrate(self_ptr self, uint64_t target) {
  auto rp = self->make_response_promise<uint64_t>();
  start_migration(self, target, [rp](caf::expected<uint64_t> r) mutable {
    if (r)
      rp.deliver(*r);
    else
      rp.deliver(std::move(r.error()));
  });
  return rp;
}

// The instance drains: move the sequence wherever the router would place
// it now (a draining instance is not a candidate).  If nothing else
// serves, or it is not running yet, it stays; the instance asks again.
// With disaggregation a decoding sequence goes where the router places
// decode work (D->P preemption by migration, or a drain): prefill
// placement would send it to a prefill instance.
void relocate(self_ptr self) {
  auto& st = self->state;
  if (st.phase != request_phase::running) return;
  const uint64_t from = st.instance_id;
  const auto context = static_cast<int32_t>(st.seq.prompt.size() + st.generated.size());
  auto go = [self, from](placement_reply& p) {
    auto& st = self->state;
    if (st.done() || st.instance_id != from || p.instance == from) return;
    start_migration(self, p.instance, [](caf::expected<uint64_t>) {});
  };
  if (st.ctx->pd && !st.generated.empty())
    self->request(st.ctx->router, std::chrono::seconds(10), place_decode_atom::value, from, context)
        .then(go, [](caf::error&) {});
  else
    self->request(st.ctx->router, std::chrono::seconds(10), place_atom::value, context,
                  std::vector<uint64_t>{}, uint64_t{0})
        .then(go, [](caf::error&) {});
}

void encode_on(self_ptr self, encoder_actor encoder, uint64_t at);

// Images first (EPD's E stage): each goes to the encoder (the service's,
// or under hybrid EPD the one the router picks), and its rows take their
// span of the prompt; once all have answered, the sequence is placed (its
// P and D stages).  An image the encoder refuses ends the request with
// the encoder's reason.
void encode_then_place(self_ptr self) {
  auto& st = self->state;
  if (st.seq.embeds.empty()) {
    place_and_enqueue(self);
    return;
  }
  std::vector<size_t> keys;
  for (size_t i = 0; i < st.seq.embeds.size(); ++i)
    keys.push_back(encode_ledger::key(st.gen.images(static_cast<int>(i))));
  const auto distinct = static_cast<int32_t>(std::set<size_t>(keys.begin(), keys.end()).size());
  if (st.ctx->encode_books && distinct > st.ctx->encode_books->max_waiting()) {
    reject(self, wire::INVALID_ARGUMENT,
           "the request has " + std::to_string(distinct) +
               " different images and the vision encoder takes " +
               std::to_string(st.ctx->encode_books->max_waiting()) +
               " at most at once (engine.encoder_queue)");
    return;
  }
  const bool admitted = !st.ctx->encode_books || st.ctx->encode_books->admit(st.seq.id, keys);
  if (st.ctx->encode_books && st.ctx->metrics)
    record_encoder(*st.ctx->metrics, st.ctx->encode_books->snapshot());
  if (!admitted) {
    reject(self, wire::OVERLOADED,
           "the vision encoder's queue is full (" +
               std::to_string(st.ctx->encode_books->max_waiting()) +
               " different images, engine.encoder_queue): try later");
    return;
  }
  if (!st.ctx->epd) return encode_on(self, st.ctx->encoder, 0);
  // Hybrid EPD: the router says whose encoder.
  const auto images = static_cast<int32_t>(st.seq.embeds.size());
  self->request(st.ctx->router, std::chrono::seconds(10), place_encode_atom::value, images)
      .then(
          [self](uint64_t at, std::string& why) {
            auto& st = self->state;
            auto enc = st.ctx->encoders.find(at);
            const bool no_encoder = enc == st.ctx->encoders.end();
            if (no_encoder || st.done()) {
              // The router counted the images on `at`; none will be
              // encoded there.
              self->send(st.ctx->router, encoded_atom::value, at,
                         static_cast<int32_t>(st.seq.embeds.size()));
              // (The router only names instances with an encoder.)
              if (no_encoder && !st.done())
                reject(self, wire::INTERNAL,
                       "instance " + std::to_string(at) + " has no vision encoder");
              return;
            }
            st.trace.encode_instance = at;
            st.trace.encode_placement = std::move(why);
            if (prefill_where_encoded(*st.ctx->epd)) st.prefill_at = at;
            encode_on(self, enc->second, at);
          },
          [self](caf::error& e) {
            if (self->state.done()) return;
            reject(self, wire::UNAVAILABLE,
                   "no vision encoder can take the images: " + self->system().render(e));
          });
}

// Each image through `encoder` (instance `at`'s under hybrid EPD, whose
// router counts each image until it answers or the request ends (quit);
// 0: the service's).
void encode_on(self_ptr self, encoder_actor encoder, uint64_t at) {
  auto& st = self->state;
  const size_t n = st.seq.embeds.size();
  auto left = std::make_shared<size_t>(n);
  st.encode_at = at;
  st.encode_unanswered = at != 0 ? static_cast<int32_t>(n) : 0;
  // Each answer, before the request may end on it.
  auto answered = [self] {
    auto& st = self->state;
    if (st.encode_unanswered <= 0) return;
    --st.encode_unanswered;
    self->send(st.ctx->router, encoded_atom::value, st.encode_at, int32_t{1});
  };
  const auto started = clock_type::now();
  for (size_t i = 0; i < n; ++i) {
    self->request(encoder, std::chrono::seconds(120), encode_atom::value, st.seq.id,
                  st.gen.images(i))
        .then(
            [self, i, left, started, answered](prompt_embeds& e) {
              answered();
              auto& st = self->state;
              if (st.done()) return;
              auto& span = st.seq.embeds[i];
              if (e.rows != span.rows) {
                reject(self, wire::INTERNAL,
                       "image " + std::to_string(i) + ": the encoder made " +
                           std::to_string(e.rows) + " rows where " + std::to_string(span.rows) +
                           " were expected");
                return;
              }
              span.data = std::move(e.data);
              if (--*left > 0) return;
              st.trace.encode_ms = ms_between(started, clock_type::now());
              place_and_enqueue(self);
            },
            [self, i, answered](caf::error& err) {
              answered();
              if (self->state.done()) return;
              const bool theirs = err == caf::sec::invalid_argument;
              reject(self, theirs ? wire::INVALID_ARGUMENT : wire::INTERNAL,
                     "image " + std::to_string(i) + ": " + error_text(self->system(), err));
            });
  }
}

request_actor::behavior_type request_behavior(self_ptr self,
                                              std::shared_ptr<const serve_context> ctx,
                                              gateway_actor gateway, std::string client,
                                              wire::Generate gen) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.gateway = std::move(gateway);
  st.client = std::move(client);
  st.gen = std::move(gen);
  st.arrival = clock_type::now();
  st.trace.request_id = st.gen.request_id();
  st.trace.client = hex_bytes(st.client);
  st.trace.priority = st.gen.priority();
  // The instance's sequence id: unique across clients (the client's own
  // ids are only unique per client).
  st.seq.id = st.ctx->seq_id_tag | (self->id() & ((uint64_t{1} << 40) - 1));
  std::optional<rejection> bad;
  try {
    bad = build_sequence(st);
  } catch (const std::exception& e) {
    bad = rejection{wire::INVALID_ARGUMENT, std::string("prompt: ") + e.what()};
  }
  st.trace.cls = st.seq.cls;
  st.trace.prompt_tokens = static_cast<int32_t>(st.seq.prompt.size());
  if (bad) {
    reject(self, bad->code, bad->message);
    // Refused (the client has its Error): trace answers, migrate and preempt refuse, the rest drop.
    return {[](tokens_atom, const token_batch&) {},
            [](preempted_atom, uint64_t, bool) {},
            [](relocate_atom, uint64_t) {},
            [](relocate_atom, uint64_t, uint64_t) {},
            [](cancel_atom) {},
            [](cancel_atom, const std::string&) {},
            [](deadline_atom) {},
            [](migrate_atom, uint64_t) -> caf::result<uint64_t> {
              return caf::make_error(caf::sec::invalid_argument, "the request was refused");
            },
            [](retry_atom) {},
            [self](trace_atom) { return self->state.trace; },
            [](preempt_atom) -> caf::result<int32_t> {
              return caf::make_error(caf::sec::invalid_argument, "the request was refused");
            }};
  }
  st.seq.sink = caf::actor_cast<token_sink_actor>(self);
  // Its instance is lost: place the sequence again.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (st.done() || dm.source != st.instance.address()) return;
    // A placement on its way attaches elsewhere (or fails and retries) by
    // itself: a second one beside it would find the sequence already
    // enqueued and fail until the request gave up.
    if (st.phase == request_phase::placing) return;
    // Recovery (docs/architecture.md §3.4 "Recovery"): the request holds its prompt and
    // every token streamed; it is placed again and recomputes from there.
    // The client sees a delay, not an error, while any instance lives.
    // (Attached to an instance already dead, as a router that has not
    // heard of the loss yet may name, the enqueue is superseded.)
    if (st.accepted())
      ++st.trace.recoveries;
    else
      forget_attach(st, st.instance_id);
    place_and_enqueue(self);
  });
  if (st.gen.deadline_ms() > 0)
    self->delayed_send(self, std::chrono::milliseconds(st.gen.deadline_ms()), deadline_atom::value);
  encode_then_place(self);
  return {
      // Tokens from the instance: frames for the client, or its finish.
      [self](tokens_atom, const token_batch& b) { on_tokens(self, b); },
      // The instance preempted the sequence: counted; it resumes by itself.
      [self](preempted_atom, uint64_t, bool) { ++self->state.trace.preemptions; },
      // The instance drains: move the sequence where the router places it now.
      [self](relocate_atom, uint64_t) { relocate(self); },
      // The router's evacuation plan: straight to that instance.
      [self](relocate_atom, uint64_t, uint64_t target) {
        if (self->state.phase == request_phase::running && target != self->state.instance_id)
          start_migration(self, target, [](caf::expected<uint64_t>) {});
      },
      // The client's cancel: abort the sequence, then Finished (cancelled).
      [self](cancel_atom) {
        if (self->state.done()) return;
        wire::TokenChunk chunk;
        finish(self, chunk, wire::CANCELLED, true);
      },
      // The server ends it (a slow reader): Finished says why.
      [self](cancel_atom, const std::string& why) {
        if (self->state.done()) return;
        wire::TokenChunk chunk;
        finish(self, chunk, wire::CANCELLED, true, why);
      },
      // Its deadline passed: abort the sequence, then Finished (timeout).
      [self](deadline_atom) {
        if (self->state.done()) return;
        wire::TokenChunk chunk;
        finish(self, chunk, wire::TIMEOUT, true);
      },
      // Move the sequence to that instance, KV and all (admin, dp_group).
      [self](migrate_atom, uint64_t target) -> caf::result<uint64_t> {
        return migrate(self, target);
      },
      // Its own timer after a failed placement: place the sequence again.
      [self](retry_atom) {
        const auto& st = self->state;
        if (!st.done() && st.retry_for == st.attempt) place_and_enqueue(self);
      },
      // Preempt the sequence on its instance now (the shell, tests).
      [self](preempt_atom) -> caf::result<int32_t> {
        auto& st = self->state;
        if (!st.accepted() || !st.instance)
          return caf::make_error(caf::sec::invalid_argument,
                                 "the request is not on an instance now");
        return relay<int32_t>(self, st.instance, std::chrono::seconds(5), preempt_atom::value,
                              st.seq.id);
      },
      // Its trace so far: finish in_flight, its state and where it runs.
      [self](trace_atom) {
        const auto& st = self->state;
        request_trace t = st.trace;
        t.finish = "in_flight";
        t.completion_tokens = static_cast<int32_t>(st.generated.size());
        if (!st.generated.empty()) t.ttft_ms = ms_between(st.arrival, st.first_token);
        t.state = st.phase == request_phase::moving ? "migrating"
                  : st.accepted()                   ? "running"
                  : t.recoveries > 0                ? "recovering"
                                                    : "queued";
        t.total_ms = ms_between(self->state.arrival, clock_type::now());
        return t;
      },
  };
}

}  // namespace

request_actor spawn_request(caf::actor_system& sys, std::shared_ptr<const serve_context> ctx,
                            gateway_actor gateway, std::string client, wire::Generate gen) {
  return sys.spawn(request_behavior, std::move(ctx), std::move(gateway), std::move(client),
                   std::move(gen));
}

}  // namespace troupe
