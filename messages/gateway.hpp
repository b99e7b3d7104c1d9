#pragma once
// The gateway and request protocols (docs/architecture.md §2 "The actors",
// §3.1 "Generate"): the gateway owns a client socket and spawns one request
// actor per Generate; each request actor speaks to an instance as its token
// sink and hands the gateway finished wire frames (serialized
// troupe.wire.ServerMessage) to send back to its client.
#include <caf/all.hpp>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/instance.hpp"

namespace troupe {

// What one request did, kept by the gateway for inspection (admin).
struct request_trace {
  uint64_t request_id = 0;  // the client's id
  std::string client;       // the client's socket identity, hex
  std::string finish;       // stop, length, eos, cancelled, timeout, error, rejected
  std::string stop_matched;
  std::string error;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t tier_tokens = 0;  // of the cached ones, those the KV store's tiers gave back
  int32_t preemptions = 0;
  int32_t priority = 0;
  seq_class cls = seq_class::online;
  double encode_ms = 0;             // its images through the vision encoder (EPD's E)
  // Hybrid EPD (--epd): the instance whose encoder took its images, and
  // why (0 and empty: the service's one encoder, or no images).
  uint64_t encode_instance = 0;
  std::string encode_placement;
  double queue_ms = 0;              // arrival until the instance took the sequence
  double ttft_ms = 0;               // arrival until the first token
  double tpot_ms = 0;               // mean time per output token after the first
  double total_ms = 0;              // arrival until finish
  std::vector<uint64_t> instances;  // the instances that served it, in order
  std::string placement;            // why the first one (the router's policy)
  int32_t migrations = 0;
  uint64_t migrated_bytes = 0;  // KV blob bytes moved
  double migration_ms = 0;      // export asked to import answered, summed over migrations
  int32_t recoveries = 0;       // times its instance was lost and it was placed again
  // Disaggregation (issue 11): where it prefilled and decoded, and the KV
  // handoff between them (0 and empty when it ran on one instance).
  uint64_t prefill_instance = 0;
  uint64_t decode_instance = 0;
  uint64_t transfer_bytes = 0;
  double transfer_ms = 0;  // export asked to import answered
  std::string decode_placement;
  double predicted_ttft_ms = 0;  // the router's prediction (0: none)
  double slo_ttft_ms = 0;        // its targets (0: none)
  double slo_tpot_ms = 0;
  bool slo_met = true;  // every target it has was met
  // Speculative decoding: draft tokens verified and accepted over its life.
  int32_t draft_tokens = 0;
  int32_t accepted_tokens = 0;
  // queued (not on an instance yet), running, migrating, recovering (its
  // instance was lost; being placed again), finished
  std::string state;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_trace& x) {
  return f(caf::meta::type_name("request_trace"), x.request_id, x.client, x.finish, x.stop_matched,
           x.error, x.prompt_tokens, x.completion_tokens, x.cached_tokens, x.preemptions,
           x.priority, x.cls, x.queue_ms, x.ttft_ms, x.tpot_ms, x.total_ms, x.instances,
           x.placement, x.migrations, x.migrated_bytes, x.migration_ms, x.recoveries, x.state,
           x.prefill_instance, x.decode_instance, x.transfer_bytes, x.transfer_ms,
           x.decode_placement, x.predicted_ttft_ms, x.slo_ttft_ms, x.slo_tpot_ms, x.slo_met,
           x.draft_tokens, x.accepted_tokens, x.tier_tokens, x.encode_ms, x.encode_instance,
           x.encode_placement);
}

// A request in flight, as the gateway sees it (admin).
struct inflight_request {
  uint64_t request_id = 0;  // the client's id
  std::string client;       // the client's socket identity, hex
  double age_ms = 0;        // since the gateway took it
  request_trace live;       // its trace so far, from its request actor (empty if it did not answer)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inflight_request& x) {
  return f(caf::meta::type_name("inflight_request"), x.request_id, x.client, x.age_ms, x.live);
}

// reply:  (client identity, request id, frame, last) a frame for the
//         client; `last` ends the request (Finished, or an Error for it).
// trace:  a finished request's trace record.
// traces: the most recent trace records, oldest first.
// drain:  (cancel) stop taking new requests; with cancel, also cancel the
//         ones in flight.  Replies with the number still in flight.
// poll:   the gateway's own loop (socket, then mailbox, then again).
// requests: the requests in flight (admin).
// cancel: (request id) cancels the in-flight requests with this id, of any
//         client (admin); replies with how many.
// migrate: (request id, instance id) moves the in-flight request with this
//         id (of any client; an error when none or several) to that
//         instance; replies with the instance once it runs there.
// adminport: (port) the admin actor's TCP port, told to clients in Pong
//         (0: none); published after the gateway exists, so set later.
//         Replies with the port, once set.
using gateway_actor =
    caf::typed_actor<caf::reacts_to<reply_atom, std::string, uint64_t, std::string, bool>,
                     caf::reacts_to<trace_atom, request_trace>,
                     caf::replies_to<traces_atom>::with<std::vector<request_trace>>,
                     caf::replies_to<drain_atom, bool>::with<int32_t>, caf::reacts_to<poll_atom>,
                     caf::replies_to<requests_atom>::with<std::vector<inflight_request>>,
                     caf::replies_to<cancel_atom, uint64_t>::with<int32_t>,
                     caf::replies_to<admin_port_atom, uint32_t>::with<uint32_t>,
                     caf::replies_to<migrate_atom, uint64_t, uint64_t>::with<uint64_t>,
                     caf::replies_to<trace_atom, uint64_t>::with<request_trace>,
                     caf::replies_to<preempt_atom, uint64_t>::with<int32_t>>;

// A request actor is the token sink of its sequence, and takes the
// client's cancel and its own deadline.  Either ends the request at once:
// the sequence is aborted in the instance, then Finished goes out.
// cancel with a reason: the server ended it (a slow reader); the reason
// goes to the client in Finished.error.
// migrate: (instance id) move the sequence there (export, import,
// re-point); replies with the instance.  retry: its own timer while it
// looks for an instance after a loss.  trace: its trace so far (finish
// "in_flight"; instances: where it has run, the last where it runs now).
using request_actor = token_sink_actor::extend<
    caf::reacts_to<cancel_atom>, caf::reacts_to<cancel_atom, std::string>,
    caf::reacts_to<deadline_atom>, caf::replies_to<migrate_atom, uint64_t>::with<uint64_t>,
    caf::reacts_to<retry_atom>, caf::replies_to<trace_atom>::with<request_trace>,
    caf::replies_to<preempt_atom>::with<int32_t>>;

}  // namespace troupe
