#pragma once
// The device protocol: one actor per OpenCL device runs forward passes over
// flattened batches (runtime/engine/forward_batch.hpp) against its paged KV arena.
#include <caf/all.hpp>
#include "messages/atoms.hpp"

#include "runtime/device/head_group.hpp"
#include "runtime/engine/engine_types.hpp"
#include "runtime/engine/forward_batch.hpp"

namespace troupe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forward_seq& x) {
  return f(caf::meta::type_name("forward_seq"), x.first_row, x.n_rows, x.pages);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_bias& x) {
  return f(caf::meta::type_name("token_bias"), x.token, x.bias);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_count& x) {
  return f(caf::meta::type_name("token_count"), x.token, x.count);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_k, x.top_p, x.min_p,
           x.repetition_penalty, x.presence_penalty, x.frequency_penalty, x.penalty_last_n, x.seed,
           x.logprobs, x.n_logprobs, x.logit_bias);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, presample_row& x) {
  return f(caf::meta::type_name("presample_row"), x.logit_index, x.sampling, x.position, x.counts,
           x.count_input);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placeholder_row& x) {
  return f(caf::meta::type_name("placeholder_row"), x.row, x.drawn_index);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forward_batch& x) {
  return f(caf::meta::type_name("forward_batch"), x.tokens, x.positions, x.seqs, x.logit_rows,
           x.step, x.presample, x.after, x.placeholders, x.hidden_rows, x.stage_input, x.embed_rows,
           x.embed_input);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forward_result& x) {
  return f(caf::meta::type_name("forward_result"), x.n_vocab, x.logits, x.drawn, x.n_embd, x.hidden,
           x.device_ms, x.idle_ms, x.stage_output);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_info& x) {
  return f(caf::meta::type_name("device_info"), x.device_name, x.model_path, x.model_fingerprint,
           x.n_vocab, x.n_ctx, x.n_pages, x.page_size, x.weight_bytes, x.kv_bytes_per_page,
           x.n_layers, x.n_kv_heads, x.head_dim, x.kv_dtype, x.stage_first_layers, x.layer_moves,
           x.memory_bytes, x.n_embd);
}

// Mixture of experts: one layer's placement, for each expert device the
// experts it holds (runtime/device/device_weights.hpp's expert_layout).
using layer_experts = std::vector<std::vector<int32_t>>;

// What the expert controller reads from a device: tokens routed to each
// expert of each layer since the previous read, each expert device's
// kernel seconds since the start, the placement in use and its epoch.
struct expert_stats {
  int32_t n_layers = 0;
  int32_t n_experts = 0;               // 0: a dense model
  int32_t devices = 0;                 // expert devices
  std::vector<int64_t> tokens;         // [layer][expert]
  std::vector<double> busy_s;          // [expert device]
  std::vector<layer_experts> layouts;  // [layer]
  uint64_t epoch = 0;                  // of the placement in use (0: the initial one)
  uint64_t swaps = 0;                  // placements committed
};

// A new placement for every layer, tagged with the controller's epoch.
struct expert_plan {
  uint64_t epoch = 0;
  std::vector<layer_experts> layouts;  // [layer]
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_stats& x) {
  return f(caf::meta::type_name("expert_stats"), x.n_layers, x.n_experts, x.devices, x.tokens,
           x.busy_s, x.layouts, x.epoch, x.swaps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_plan& x) {
  return f(caf::meta::type_name("expert_plan"), x.epoch, x.layouts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, head_op& x) {
  return f(caf::meta::type_name("head_op"), x.kind, x.layer_first, x.n_layers, x.kv_lo, x.kv_hi,
           x.layer, x.n_rows, x.att_rows, x.quant_out, x.pos, x.row_seq, x.pt, x.pt_off, x.q, x.kv,
           x.pages, x.dst, x.data);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, head_answer& x) {
  return f(caf::meta::type_name("head_answer"), x.out, x.oq, x.od, x.os, x.count);
}

// forward: run one step, reply with the logits of batch.logit_rows.
// info: what the device holds.
// readpages: the KV data of the pages, in order, kv_bytes_per_page each
//            (llama_forward::read_pages), for swap-out and transfer.
// writepages: (pages, data) the reverse, for swap-in and import; replies
//            with the pages written.
// copypages: (src, dst) copy page data, for copy-on-write; replies with the
//            pages copied.
// expstats: expert_stats (reading resets the token counts).
// expprepare: (plan) the expert swap's first phase: upload every layer's
//            experts as the plan places them into new buffers beside the
//            ones in use (the double buffer); replies with the plan's epoch
//            when ready, an error when the plan does not fit the model.
// expcommit: (epoch) the second phase: the prepared buffers replace the
//            ones in use from the next forward pass on (a step boundary);
//            replies with the epoch, an error if none was prepared.
// expabort: (epoch) drops a prepared plan.
// movelayers: (from, to, layers) a pipelined device moves `layers` layers
//            from stage `from` to its neighbour `to`, weights and KV, as its
//            own layer migration does (two phases, no step sees half a
//            move); replies once moved, saying what moved and what it cost.
//            One device refuses: it has no stages.
// moveheads: (from, to, heads) a pipelined device moves the attention of
//            `heads` KV heads of stage `from`'s layers (its last ones),
//            with their pages, to stage `to` (runtime/device/head_group.hpp);
//            heads 0 brings them home.  Between two steps; replies saying
//            what moved and what it cost.  One device refuses.
// headguest: (op) a stage serves another stage's group of KV heads
//            (head_op: open, attend, write, copy, close).
// headroute: (helper, kv_lo, kv_hi) a stage's KV heads [kv_lo, kv_hi)
//            attend on `helper` from the next step on (kv_hi == kv_lo:
//            at home); its page writes and copies reach the helper too.
// The device serves its messages in order, so a page read sent before a
// forward pass sees the data from before that pass.
using device_actor = caf::typed_actor<
    caf::replies_to<forward_atom, forward_batch>::with<forward_result>,
    caf::reacts_to<step_done_atom, uint64_t>, caf::replies_to<info_atom>::with<device_info>,
    caf::replies_to<read_pages_atom, std::vector<int32_t>>::with<std::vector<uint8_t>>,
    caf::replies_to<write_pages_atom, std::vector<int32_t>, std::vector<uint8_t>>::with<int32_t>,
    caf::replies_to<copy_pages_atom, std::vector<int32_t>, std::vector<int32_t>>::with<int32_t>,
    caf::replies_to<expert_stats_atom>::with<expert_stats>,
    caf::replies_to<expert_prepare_atom, expert_plan>::with<uint64_t>,
    caf::replies_to<expert_commit_atom, uint64_t>::with<uint64_t>,
    caf::replies_to<expert_abort_atom, uint64_t>::with<uint64_t>,
    caf::replies_to<move_layers_atom, int32_t, int32_t, int32_t>::with<std::string>,
    caf::replies_to<move_heads_atom, int32_t, int32_t, int32_t>::with<std::string>,
    caf::replies_to<head_guest_atom, head_op>::with<head_answer>,
    caf::replies_to<head_route_atom, caf::actor, int32_t, int32_t>::with<int32_t>>;

}  // namespace troupe
