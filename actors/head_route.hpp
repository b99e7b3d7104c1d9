#pragma once
// A device actor's part in KV-head migration (runtime/device/head_group.hpp):
// as a helper it serves a donor stage's group (head_guest); as a donor it
// sends its group's rows, page writes and copies to its helper, waiting for
// each answer (a device actor is detached, and a helper never waits for its
// donor, so this cannot deadlock).
#include <memory>
#include <vector>

#include <caf/all.hpp>

#include "runtime/device/llama_forward.hpp"

namespace troupe {

struct head_route_state {
  std::unique_ptr<cl::context> guest_ctx;  // the guest's context, kept for the next group
  std::unique_ptr<head_guest> guest;       // a donor's group served here (on guest_ctx)
  caf::actor helper;                       // where this stage's group attends (null: home)
  int kv_lo = 0, kv_hi = 0;
};

// Serves one request of the guest protocol.  Throws std::invalid_argument
// for a malformed one (or one with no group open).
head_answer serve_head_op(llama_forward& engine, head_route_state& st, const head_op& op);

// Sends this stage's KV heads [kv_lo, kv_hi) to `helper` (kv_hi == kv_lo:
// home).  Throws as llama_forward::attend_heads_elsewhere does.
void route_heads(caf::actor_system& sys, llama_forward& engine, head_route_state& st,
                 caf::actor helper, int kv_lo, int kv_hi);

// A donor's page writes and copies, for its helper's copy of the group.
// Throws std::runtime_error when the helper does not answer.
void mirror_page_write(caf::actor_system& sys, const llama_forward& engine,
                       const head_route_state& st, const std::vector<int32_t>& pages,
                       const std::vector<uint8_t>& data);
void mirror_page_copy(caf::actor_system& sys, const head_route_state& st,
                      const std::vector<int32_t>& src, const std::vector<int32_t>& dst);

// A pipeline's group move, run between two steps (no step in flight): the
// helper opens the group, gets the group's part of every page in `pages`
// as the donor holds it, and the donor routes the group there.  Returns
// the bytes moved; throws std::runtime_error (the group then stays home,
// the helper closed) when a stage refuses or does not answer.
struct head_move {
  int32_t layer_first = 0, layer_end = 0;  // the donor's layers
  int32_t n_kv = 0, kv_lo = 0, kv_hi = 0;
  size_t head_bytes = 0;  // one head's part of one layer's page: page_size x head_dim values
};
size_t move_head_group(caf::actor_system& sys, const caf::actor& donor, const caf::actor& helper,
                       const head_move& m, const std::vector<int32_t>& pages);
// The reverse: the donor's group attends at home again (its cache kept
// every head), and the helper drops its copy.  Throws std::runtime_error
// when the donor does not answer (the group is then where it was);
// returns why the helper did not drop its copy (empty: it did).
std::string bring_head_group_home(caf::actor_system& sys, const caf::actor& donor,
                                  const caf::actor& helper);

}  // namespace troupe
