#pragma once
// The engine's vocabulary, with no actor in it: what a sequence asks for,
// what it gets back, the device's geometry, the engine's options and
// counters.  messages/ adds the actor handles and the serialization.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/admission.hpp"
#include "runtime/engine/kv_blob.hpp"
#include "runtime/engine/page_pool.hpp"
#include "runtime/engine/prompt_embeds.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/scheduler.hpp"

namespace troupe {

struct device_info {
  std::string device_name;
  std::string model_path;
  std::string model_fingerprint;
  int32_t n_vocab = 0;
  int32_t n_ctx = 0;
  int32_t n_pages = 0;
  int32_t page_size = 0;
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes_per_page = 0;
  // The KV geometry, for blobs that move between arenas (runtime/engine/kv_blob).
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  std::string kv_dtype;  // "f16" or "f32"
  // A pipelined device (actors/pipeline.hpp): each stage's first layer,
  // and the layer moves between stages so far (empty and 0 otherwise).
  std::vector<int32_t> stage_first_layers;
  uint64_t layer_moves = 0;
  uint64_t memory_bytes = 0;  // the device's memory (OpenCL global memory)
  int32_t n_embd = 0;         // the width of a row's input (sequence_spec::embeds)
};

enum class finish_reason : uint8_t {
  none,        // still generating
  eos,         // an end-of-generation token (not with ignore_eos)
  stop_token,  // one of the sequence's stop token ids
  max_tokens,  // generated max_tokens
  context,     // reached the model's context length (or the KV arena's size)
  aborted,     // abort(id): cancel, timeout, disconnect
  error,       // the device failed the step; the batch's `error` says why
  embedded,    // an embedding request: its prompt was computed and pooled
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
    case finish_reason::embedded:
      return "embedded";
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
  int32_t tier_tokens = 0;    // of those, tokens the KV store's tiers gave back
  std::string error;
  // Speculative decoding in the step that produced these tokens: drafts
  // verified and accepted (the trace sums them).
  int32_t drafted = 0;
  int32_t accepted = 0;
  // An embedding request's last batch (finish embedded): the mean over the
  // prompt's rows of the final normed hidden state, L2-normalised.
  std::vector<float> embedding;
};

// A sequence as the engine takes it: the request side's id, its tokens and
// how to generate (messages/instance.hpp's sequence_request adds the sink
// that its tokens stream to).
struct sequence_spec {
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
  // Structured output: the whole generated text must match this regular
  // expression (runtime/text/regex_dfa); empty: free.
  std::string constraint;
  // Disaggregation (issue 11): compute the prompt and the first token, then
  // hold the KV (parked) until the request side exports it to a decode
  // instance.
  bool prefill_only = false;
  // Earliest deadline first among online sequences: the first token is due
  // this long after the instance takes the sequence (0: no target).
  double ttft_target_ms = 0;
  // Its TPOT target (0: none): with the TTFT target, the completion
  // deadline that SLO ordering (runtime/engine/admission) plans by.
  double tpot_target_ms = 0;
  // The output-length predictor's class for it (the client's name for an
  // application or template; empty: its first prompt tokens).
  std::string prompt_class;
  // Speculative decoding (n-gram drafts verified in one step): the most
  // draft tokens per step; -1: the instance's default, 0: off.
  int32_t draft_tokens = -1;
  // An embedding instead of a generation (/v1/embeddings): the prompt is
  // computed without the prefix cache's pages (every row's hidden state is
  // pooled), nothing is sampled, and the last batch carries the vector.
  bool embed = false;
  // Recovery from KV copies (docs/architecture.md §4.10): every this many
  // newly full pages, the sequence's pages are copied to a KV store on
  // another node (the instance knows which); 0: no copies.
  int32_t kv_copy_pages = 0;
  // Rows of the prompt computed from embeddings (images), sorted and
  // apart.  Such a prompt neither reuses nor offers prefix-cache pages:
  // its placeholder tokens do not say which image they stand for.
  std::vector<prompt_embeds> embeds;
};

enum class preempt_mode : uint8_t { recompute, swap };

// One forward pass: its rows and its wall time on the device.  The router
// fits its prefill-time model (runtime/service/placement) from these.
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
  // The output-length predictor (runtime/engine/slo_batching): finished
  // sequences scored, and those whose length bucket it predicted right;
  // static batches formed (runtime/engine/admission).
  uint64_t length_predicted = 0;
  uint64_t length_right = 0;
  uint64_t static_batches = 0;
  // KV store: evicted prefix pages offered to the process's kv_pool, and
  // pages loaded back from it (counted again as prefix hits when mapped).
  uint64_t spilled_pages = 0;
  uint64_t loaded_pages = 0;
  double tier_load_ms = 0;    // fetching them from the store (summed)
  uint64_t copied_pages = 0;  // full pages of running sequences copied to another node's store
  uint64_t pulled_pages = 0;  // prompt pages fetched from other processes' stores
  std::vector<kv_link_timing> pull_links;  // per store pulled from
  kv_store_stats store;  // the process's KV store, as its kv_pool answered (none: no tiers)
};

// How an engine replica runs (the instance actor's options).
struct instance_options {
  // Step limits; page_size is taken from the device.
  scheduler_limits limits;
  preempt_mode preemption = preempt_mode::recompute;
  // The model's end-of-generation ids (tokenizer::end_of_generation_ids()).
  std::vector<int32_t> eog_tokens;
  bool prefix_caching = true;
  // Each token's bytes (tokenizer::token_bytes), for constrained
  // decoding; without them a constrained request is refused.
  std::shared_ptr<const std::vector<std::string>> token_bytes;
  // Steps kept for stats' recent_steps (the router's model; the cost-model
  // calibration keeps many).
  size_t kept_steps = 16;
  // Speculative decoding: the most n-gram draft tokens a decoding sequence
  // verifies per step when its request does not say (0: off).
  int32_t draft_tokens = 0;
  std::string role = "mixed";  // reported; the router decides the work
  // Co-location's TPOT guard: while online sequences decode, a step slower
  // than this halves the offline rows a step may take beside them, and a
  // step under 80% of it gives 4 back (0: no guard).
  double tpot_target_ms = 0;
  // Step overlap (runtime/engine/step_overlap.hpp): plan and send the next step
  // while the device runs this one.
  bool step_overlap = true;
  // A kv_pool takes the indexed pages this engine evicts (engine_cmd::spill).
  bool kv_tiers = false;
  // Which waiting sequences may be admitted, in what order: continuous or
  // static batches, by deadline, arrival, length, SLO or SLO-ODBS.
  admission_policy admission;
};

}  // namespace troupe
