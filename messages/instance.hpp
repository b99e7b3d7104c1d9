#pragma once
// The instance protocol (DESIGN.md §2-3): an engine replica takes sequences,
// runs them with continuous batching, and streams their tokens to the actor
// each sequence names (the request side), fire-and-forget.
#include <caf/all.hpp>
#include <string>
#include <vector>

#include "messages/device.hpp"
#include "messages/kv_pool.hpp"
#include "runtime/ngram_draft.hpp"
#include "runtime/sampler.hpp"
#include "runtime/scheduler.hpp"

namespace troupe {

enum class finish_reason : uint8_t {
  none,        // still generating
  eos,         // an end-of-generation token (not with ignore_eos)
  stop_token,  // one of the sequence's stop token ids
  max_tokens,  // generated max_tokens
  context,     // reached the model's context length (or the KV arena's size)
  aborted,     // abort(id): cancel, timeout, disconnect
  error,       // the device failed the step; the batch's `error` says why
};
inline const char* to_string(finish_reason r) {
  switch (r) {
    case finish_reason::none:
      return "none";
    case finish_reason::eos:
      return "eos";
    case finish_reason::stop_token:
      return "stop_token";
    case finish_reason::max_tokens:
      return "max_tokens";
    case finish_reason::context:
      return "context";
    case finish_reason::aborted:
      return "aborted";
    case finish_reason::error:
      return "error";
  }
  return "?";
}

// One batch of new tokens of one sequence (usually one token per step).
// The batch with finish != none is the sequence's last: after it the
// instance holds nothing of the sequence.  The token that ended it (eos,
// stop token) is included.
struct token_batch {
  uint64_t id = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                  // one per token, when asked
  std::vector<std::vector<token_logprob>> top;  // one per token, when n_logprobs > 0
  finish_reason finish = finish_reason::none;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  std::string error;
  // Speculative decoding in the step that produced these tokens: drafts
  // verified and accepted (the trace sums them).
  int32_t drafted = 0;
  int32_t accepted = 0;
};

using tokens_atom = caf::atom_constant<caf::atom("tokens")>;
using preempted_atom = caf::atom_constant<caf::atom("preempted")>;
using relocate_atom = caf::atom_constant<caf::atom("relocate")>;

// The request side of a sequence: token batches, and a notice when the
// sequence was preempted (swapped: its KV went to host memory; else it is
// recomputed).  Either way it resumes by itself; the client sees delay.
// relocate: the instance is draining; the request side should move the
// sequence elsewhere (migrate) if it can, else it finishes where it is.
using token_sink_actor =
    caf::typed_actor<caf::reacts_to<tokens_atom, token_batch>,
                     caf::reacts_to<preempted_atom, uint64_t /*id*/, bool /*swapped*/>,
                     caf::reacts_to<relocate_atom, uint64_t /*id*/>>;

struct sequence_request {
  uint64_t id = 0;  // the request side's id, echoed in every token_batch
  std::vector<int32_t> prompt;
  // Tokens already generated for this request elsewhere: a sequence that
  // resumes (migration, recovery) continues after them.  They count toward
  // max_tokens and were streamed already.
  std::vector<int32_t> generated;
  sampling_params sampling;
  int32_t max_tokens = 256;
  std::vector<int32_t> stop_tokens;
  bool ignore_eos = false;
  seq_class cls = seq_class::online;
  token_sink_actor sink;
  // Structured output: the whole generated text must match this regular
  // expression (runtime/regex_dfa); empty: free.
  std::string constraint;
  // Disaggregation (issue 11): compute the prompt and the first token, then
  // hold the KV (parked) until the request side exports it to a decode
  // instance.
  bool prefill_only = false;
  // Earliest deadline first among online sequences: the first token is due
  // this long after the instance takes the sequence (0: no target).
  double ttft_target_ms = 0;
  // Speculative decoding (n-gram drafts verified in one step): the most
  // draft tokens per step; -1: the instance's default, 0: off.
  int32_t draft_tokens = -1;
};

// k_max_draft_tokens (the most draft tokens per step): runtime/ngram_draft.hpp.

enum class preempt_mode : uint8_t { recompute, swap };

// One forward pass: its rows and its wall time on the device.  The router
// fits its prefill-time model (runtime/placement) from these.
struct step_timing {
  uint64_t step = 0;  // the instance's step counter, to take each sample once
  int32_t rows = 0;
  double ms = 0;
  int32_t decode_rows = 0;  // rows of decoding sequences (the rest are prefill)
  int64_t context = 0;      // attention work: the sum over rows of the positions they attend
  double host_ms = 0;       // after the device answered: sampling, streaming, the next plan
  double idle_ms = -1;      // the device idle before it (-1: its first step): the gap overlap hides
  double device_ms = 0;     // the device's own time on it (placeholders, pass, draws)
};

struct instance_stats {
  int32_t waiting = 0;
  int32_t running = 0;
  int32_t swapped = 0;                // waiting with their KV in the host tier
  int64_t queued_prefill_tokens = 0;  // tokens of waiting and prefilling sequences not computed yet
  uint64_t steps = 0;
  uint64_t decode_tokens = 0;   // rows computed as decode
  uint64_t prefill_tokens = 0;  // rows computed as prefill (prompt, recompute)
  uint64_t cached_tokens = 0;   // prompt tokens skipped through the prefix cache
  uint64_t admitted = 0;
  uint64_t finished = 0;
  uint64_t aborted = 0;
  uint64_t preempted_recompute = 0;
  uint64_t preempted_swap = 0;
  uint64_t exported = 0;    // sequences sent away as KV blobs
  uint64_t imported = 0;    // sequences taken in from KV blobs
  uint64_t swap_bytes = 0;  // host-tier bytes held now
  double step_ms = 0;       // wall time of all steps on the device
  // Step overlap: steps sent while another ran, and the device's idle time
  // between steps, summed.
  uint64_t overlapped_steps = 0;
  double device_idle_ms = 0;
  pool_stats kv;
  std::string kv_check;                   // page invariants: empty when they hold
  std::vector<uint64_t> prefix_hashes;    // of its cached full pages (for prefix placement)
  std::vector<step_timing> recent_steps;  // the last steps, oldest first (the router's model)
  // Disaggregation and role switching (issue 11).
  std::string role = "mixed";
  int32_t decoding = 0;                  // sequences decoding (parked ones included)
  int64_t running_tokens = 0;            // their tokens (KV held)
  std::vector<int32_t> queued_prefills;  // prompt tokens left, per sequence not decoding yet
  // Speculative decoding: draft tokens verified, and those accepted.
  uint64_t draft_tokens = 0;
  uint64_t accepted_tokens = 0;
};

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
           x.cached_tokens, x.error, x.drafted, x.accepted);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sequence_request& x) {
  return f(caf::meta::type_name("sequence_request"), x.id, x.prompt, x.generated, x.sampling,
           x.max_tokens, x.stop_tokens, x.ignore_eos, x.cls, x.sink, x.constraint, x.prefill_only,
           x.ttft_target_ms, x.draft_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, instance_stats& x) {
  return f(caf::meta::type_name("instance_stats"), x.waiting, x.running, x.swapped,
           x.queued_prefill_tokens, x.steps, x.decode_tokens, x.prefill_tokens, x.cached_tokens,
           x.admitted, x.finished, x.aborted, x.preempted_recompute, x.preempted_swap, x.exported,
           x.imported, x.swap_bytes, x.step_ms, x.kv, x.kv_check, x.prefix_hashes, x.recent_steps,
           x.role, x.decoding, x.running_tokens, x.queued_prefills, x.draft_tokens,
           x.accepted_tokens, x.overlapped_steps, x.device_idle_ms);
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

using enqueue_atom = caf::atom_constant<caf::atom("enqueue")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using export_atom = caf::atom_constant<caf::atom("export")>;
using import_atom = caf::atom_constant<caf::atom("import")>;
using preempt_atom = caf::atom_constant<caf::atom("preempt")>;
using set_atom = caf::atom_constant<caf::atom("set")>;
using set_role_atom = caf::atom_constant<caf::atom("setrole")>;
using sequences_atom = caf::atom_constant<caf::atom("sequences")>;
using dp_join_atom = caf::atom_constant<caf::atom("dpjoin")>;
using dp_go_atom = caf::atom_constant<caf::atom("dpgo")>;
// stats_atom: messages/kv_pool.hpp

// enqueue: admit a sequence to the waiting queue; replies with the number
//          of sequences waiting before it was added, or an error
//          (sec::invalid_argument) for a bad request: empty or too long
//          prompt, bad sampling params, duplicate id, no sink.
// abort:   end sequence `id` in whatever state it is: it leaves the
//          scheduler, its sink gets a last batch (finish = aborted), then
//          its pages are freed.  Unknown ids are ignored (finish and
//          cancel may cross).
// export:  (id) takes sequence `id` out, whatever its state, and replies
//          with its KV blob (runtime/kv_blob: the KV of its computed tokens,
//          its sampler state).  The sink gets no last batch: whoever asked
//          moves the sequence on.  A batch the sink may still receive was
//          sent before the reply.
// import:  (request, blob) admits a sequence that resumes from a blob: the
//          request's prompt + generated tokens must start with the blob's
//          tokens, and the blob's geometry must be this arena's (an error
//          names the mismatch).  It waits like a swapped-out sequence and
//          streams from the next token.  Replies with the tokens whose KV
//          came with it.
// stats:   queue lengths, counters and the KV pages.
// relocate: (drain) asks each sequence's sink to move it elsewhere.
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
using instance_actor = caf::typed_actor<
    caf::reacts_to<relocate_atom>, caf::replies_to<enqueue_atom, sequence_request>::with<int32_t>,
    caf::reacts_to<abort_atom, uint64_t>,
    caf::replies_to<export_atom, uint64_t>::with<std::vector<uint8_t>>,
    caf::replies_to<import_atom, sequence_request, std::vector<uint8_t>>::with<int32_t>,
    caf::replies_to<stats_atom>::with<instance_stats>,
    caf::replies_to<preempt_atom, uint64_t>::with<int32_t>,
    caf::replies_to<set_atom, std::string, int32_t>::with<int32_t>,
    caf::replies_to<set_role_atom, std::string>::with<std::string>,
    caf::replies_to<sequences_atom>::with<std::vector<sequence_load>>,
    caf::replies_to<dp_join_atom, caf::actor, uint64_t>::with<int32_t>,
    caf::reacts_to<dp_go_atom, uint64_t>>;

}  // namespace troupe
