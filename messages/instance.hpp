#pragma once
// The instance protocol (docs/architecture.md §2 "The actors", §4.1): an engine replica takes
// sequences, runs them with continuous batching, and streams their tokens to the actor each
// sequence names (the request side), fire-and-forget.
#include <caf/all.hpp>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/device.hpp"
#include "messages/kv_pool.hpp"
#include "runtime/engine/engine_types.hpp"
#include "runtime/engine/ngram_draft.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/scheduler.hpp"

namespace troupe {

// The request side of a sequence: token batches, and a notice when the
// sequence was preempted (swapped: its KV went to host memory; else it is
// recomputed).  Either way it resumes by itself; the client sees delay.
// relocate: the instance is draining; the request side should move the
// sequence elsewhere (migrate) if it can, else it finishes where it is.
// With a target: move it there (D->P preemption by migration: the
// router's plan says where).
using token_sink_actor =
    caf::typed_actor<caf::reacts_to<tokens_atom, token_batch>,
                     caf::reacts_to<preempted_atom, uint64_t /*id*/, bool /*swapped*/>,
                     caf::reacts_to<relocate_atom, uint64_t /*id*/>,
                     caf::reacts_to<relocate_atom, uint64_t /*id*/, uint64_t /*target*/>>;

// A sequence as the instance protocol carries it: the engine's part and the
// actor its tokens stream to.
struct sequence_request : sequence_spec {
  token_sink_actor sink;
  // The KV store (docs/architecture.md §4.10): other processes' kv_pools
  // to pull the prompt's pages from, in order, after the instance's own;
  // and the kv_pool that keeps copies of its pages (kv_copy_pages).
  std::vector<kv_pool_actor> kv_sources;
  kv_pool_actor kv_copy_to;
};

// k_max_draft_tokens (the most draft tokens per step): runtime/engine/ngram_draft.hpp.

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_timing& x) {
  return f(caf::meta::type_name("step_timing"), x.step, x.rows, x.ms, x.decode_rows, x.context,
           x.host_ms, x.idle_ms, x.device_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprob& x) {
  return f(caf::meta::type_name("token_logprob"), x.token, x.logprob);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_batch& x) {
  return f(caf::meta::type_name("token_batch"), x.id, x.tokens, x.logprobs, x.top, x.finish,
           x.cached_tokens, x.tier_tokens, x.error, x.drafted, x.accepted, x.embedding);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prompt_embeds& x) {
  return f(caf::meta::type_name("prompt_embeds"), x.first, x.rows, x.data);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sequence_request& x) {
  return f(caf::meta::type_name("sequence_request"), x.id, x.prompt, x.generated, x.sampling,
           x.max_tokens, x.stop_tokens, x.ignore_eos, x.cls, x.sink, x.constraint, x.prefill_only,
           x.ttft_target_ms, x.tpot_target_ms, x.prompt_class, x.draft_tokens, x.embed,
           x.kv_copy_pages, x.kv_sources, x.kv_copy_to, x.embeds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, instance_stats& x) {
  return f(caf::meta::type_name("instance_stats"), x.waiting, x.running, x.swapped,
           x.queued_prefill_tokens, x.steps, x.decode_tokens, x.prefill_tokens, x.cached_tokens,
           x.admitted, x.finished, x.aborted, x.preempted_recompute, x.preempted_swap, x.exported,
           x.imported, x.swap_bytes, x.step_ms, x.kv, x.kv_check, x.prefix_hashes, x.recent_steps,
           x.role, x.decoding, x.running_tokens, x.queued_prefills, x.draft_tokens,
           x.accepted_tokens, x.overlapped_steps, x.device_idle_ms, x.spilled_pages, x.loaded_pages,
           x.tier_load_ms, x.copied_pages, x.pulled_pages, x.pull_links, x.store,
           x.length_predicted, x.length_right, x.static_batches);
}

// One sequence as its instance holds it (the dp_group's view for moves).
struct sequence_load {
  uint64_t id = 0;        // the request side's id
  int64_t tokens = 0;     // prompt + generated: the KV it holds, or will
  bool decoding = false;  // running one token a step (a move takes its KV along)
  int32_t left = 0;       // tokens it may still generate (max_tokens)
  token_sink_actor sink;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sequence_load& x) {
  return f(caf::meta::type_name("sequence_load"), x.id, x.tokens, x.decoding, x.left, x.sink);
}

// The sequences an instance holds, and how many enqueues it has ever been
// sent: a dp_group counts its admissions as pending until the count says
// they arrived (the admitted request travels by another actor, so a report
// asked for after an admission may still be answered before it).
struct sequences_report {
  std::vector<sequence_load> seqs;
  uint64_t enqueues = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sequences_report& x) {
  return f(caf::meta::type_name("sequences_report"), x.seqs, x.enqueues);
}

// enqueue: admit a sequence to the waiting queue; replies with the number
//          of sequences waiting before it was added, or an error
//          (sec::invalid_argument) for a bad request: empty or too long
//          prompt, bad sampling params, duplicate id, no sink.
// abort:   end sequence `id` in whatever state it is: it leaves the
//          scheduler, its sink gets a last batch (finish = aborted), then
//          its pages are freed.  Unknown ids are ignored (finish and
//          cancel may cross).
// export:  (id) takes sequence `id` out, whatever its state, and replies
//          with its KV blob (runtime/engine/kv_blob: the KV of its computed tokens,
//          its sampler state).  The sink gets no last batch: whoever asked
//          moves the sequence on.  A batch the sink may still receive was
//          sent before the reply.
// import:  (request, blob) admits a sequence that resumes from a blob: the
//          request's prompt + generated tokens must start with the blob's
//          tokens, and the blob's geometry must be this arena's (an error
//          names the mismatch).  It waits like a swapped-out sequence and
//          streams from the next token.  Replies with the tokens whose KV
//          came with it.
// exportto: (id, receiver) as export, but the blob goes straight to the
//          receiver (another instance, in any process) in chunks, never
//          through the caller; replies with the transfer's id at the
//          receiver, to import from, and the blob's size.  An error: the
//          sequence was not exported.  Id 0: it was exported, but the
//          transfer failed (stalled, refused, peer gone): recompute it.
// kvstage: (transfer, offset, total, bytes) one chunk of a blob another
//          instance sends (transfer 0: the first, which opens it; the
//          reply is its id).  Chunks come in order; the total is capped by
//          this arena's size; a transfer not imported in 30 s is dropped.
// import:  (request, transfer) as import, from a staged, complete blob.
// tick:    its own timer while blobs are staged (stale ones are dropped).
// stats:   queue lengths, counters and the KV pages.
// relocate: (drain; client) asks the sink of each sequence that service
//          process `client` streams to (none: every sequence) to move it
//          elsewhere; replies with how many it asked.
//          (client, n): the same for at most n of that client's queued
//          sequences (no KV yet), the latest first: rebalancing; n 0:
//          only how many sequences that client has there.
// preempt: (id) preempts running sequence `id` as the scheduler does when
//          KV runs short (swap or recompute, per the instance's mode);
//          replies 1, or an error when it is not running.
// set:     (key, value) changes a scheduler limit live: max_seqs,
//          max_batch_tokens or chunk_size; replies with the old value, or
//          an error naming what is wrong (the limits must stay valid).
// setrole: (prefill|decode|mixed) the role it reports; the router decides
//          what work it gets.  Replies with the old role.
// sequences: each sequence it holds, with its tokens and its sink.
// dpjoin:  (group, id) steps only in the rounds of this dp_group
//          (messages/dp_group.hpp), as replica `id`: it tells the group
//          when it has work and steps when the group says go, a dummy step
//          when it has none.  A null group leaves lockstep.  Replies 1.
// dpgo:    (round) lockstep: run one step now, real or dummy, and report it.
// What receives a blob in chunks (an instance: kvstage).
using kv_receiver_actor =
    caf::typed_actor<caf::replies_to<kv_stage_atom, uint64_t, uint64_t, uint64_t,
                                     std::vector<uint8_t>>::with<uint64_t>>;

using instance_actor = caf::typed_actor<
    caf::replies_to<relocate_atom, caf::node_id>::with<int32_t>,
    caf::replies_to<relocate_atom, caf::node_id, int32_t>::with<int32_t>,
    caf::replies_to<evacuate_atom, caf::node_id, std::vector<uint64_t>>::with<int32_t>,
    caf::replies_to<enqueue_atom, sequence_request>::with<int32_t>,
    caf::reacts_to<abort_atom, uint64_t>,
    caf::replies_to<export_atom, uint64_t>::with<std::vector<uint8_t>>,
    caf::replies_to<import_atom, sequence_request, std::vector<uint8_t>>::with<int32_t>,
    caf::replies_to<export_to_atom, uint64_t, kv_receiver_actor>::with<uint64_t, uint64_t>,
    caf::replies_to<kv_stage_atom, uint64_t, uint64_t, uint64_t,
                    std::vector<uint8_t>>::with<uint64_t>,
    caf::replies_to<import_atom, sequence_request, uint64_t>::with<int32_t>,
    caf::reacts_to<tick_atom>, caf::replies_to<stats_atom>::with<instance_stats>,
    caf::replies_to<preempt_atom, uint64_t>::with<int32_t>,
    caf::replies_to<set_atom, std::string, int32_t>::with<int32_t>,
    caf::replies_to<set_role_atom, std::string>::with<std::string>,
    caf::replies_to<sequences_atom>::with<sequences_report>,
    caf::replies_to<dp_join_atom, caf::actor, uint64_t>::with<int32_t>,
    caf::reacts_to<dp_go_atom, uint64_t>>;

}  // namespace troupe
