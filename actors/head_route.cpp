#include "actors/head_route.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "messages/device.hpp"

namespace troupe {

namespace {

// One request, waited for (two minutes: a helper busy with a long prefill
// of its own answers after it).  Throws std::runtime_error with the error.
template <class Reply, class... Ts>
Reply ask(caf::scoped_actor& io, const caf::actor& to, Ts&&... xs) {
  Reply out{};
  std::string error;
  io->request(to, std::chrono::minutes(2), std::forward<Ts>(xs)...)
      .receive([&](Reply& r) { out = std::move(r); },
               [&](caf::error& e) { error = io->system().render(e); });
  if (!error.empty()) throw std::runtime_error(error);
  return out;
}

// A donor's request to its helper.
head_answer ask_helper(caf::actor_system& sys, const caf::actor& helper, head_op op) {
  caf::scoped_actor io{sys};
  try {
    return ask<head_answer>(io, helper, head_guest_atom::value, std::move(op));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("the head group's helper: ") + e.what());
  }
}

}  // namespace

head_answer serve_head_op(llama_forward& engine, head_route_state& st, const head_op& op) {
  if (op.kind == head_op::open) {
    if (st.guest) throw std::invalid_argument("this stage serves a head group already");
    if (st.helper) throw std::invalid_argument("this stage's own heads attend elsewhere");
    if (!st.guest_ctx) st.guest_ctx = guest_context(engine);
    st.guest = std::make_unique<head_guest>(engine, *st.guest_ctx, op);
    return {};
  }
  if (op.kind == head_op::close) {
    st.guest.reset();
    return {};
  }
  if (!st.guest) throw std::invalid_argument("this stage serves no head group");
  head_answer a;
  switch (op.kind) {
    case head_op::attend:
      return st.guest->attend(op);
    case head_op::write:
      st.guest->write_pages(op.pages, op.data);
      a.count = static_cast<int32_t>(op.pages.size());
      return a;
    case head_op::copy:
      st.guest->copy_pages(op.pages, op.dst);
      a.count = static_cast<int32_t>(op.pages.size());
      return a;
    default:
      throw std::invalid_argument("unknown head group request " + std::to_string(op.kind));
  }
}

void route_heads(caf::actor_system& sys, llama_forward& engine, head_route_state& st,
                 caf::actor helper, int kv_lo, int kv_hi) {
  if (kv_hi != kv_lo) {
    if (st.guest) throw std::invalid_argument("this stage serves another stage's head group");
    if (!helper) throw std::invalid_argument("no helper for the head group");
  }
  engine.attend_heads_elsewhere(
      kv_lo, kv_hi, [&sys, helper](head_op op) { return ask_helper(sys, helper, std::move(op)); });
  st.helper = kv_hi != kv_lo ? std::move(helper) : nullptr;
  st.kv_lo = kv_lo;
  st.kv_hi = kv_hi;
}

void mirror_page_write(caf::actor_system& sys, const llama_forward& engine,
                       const head_route_state& st, const std::vector<int32_t>& pages,
                       const std::vector<uint8_t>& data) {
  if (!st.helper || pages.empty()) return;
  head_op op;
  op.kind = head_op::write;
  op.pages = pages;
  op.data = group_of_pages(
      data, pages.size(), engine.layer_end() - engine.layer_first(), engine.hparams().n_head_kv,
      st.kv_lo, st.kv_hi,
      kv_head_bytes(engine.page_size(), engine.hparams().head_dim, engine.options().kv_f16));
  ask_helper(sys, st.helper, std::move(op));
}

void mirror_page_copy(caf::actor_system& sys, const head_route_state& st,
                      const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (!st.helper || src.empty()) return;
  head_op op;
  op.kind = head_op::copy;
  op.pages = src;
  op.dst = dst;
  ask_helper(sys, st.helper, std::move(op));
}

size_t move_head_group(caf::actor_system& sys, const caf::actor& donor, const caf::actor& helper,
                       const head_move& m, const std::vector<int32_t>& pages) {
  caf::scoped_actor io{sys};
  head_op open;
  open.kind = head_op::open;
  open.layer_first = m.layer_first;
  open.n_layers = m.layer_end - m.layer_first;
  open.kv_lo = m.kv_lo;
  open.kv_hi = m.kv_hi;
  ask<head_answer>(io, helper, head_guest_atom::value, open);
  try {
    head_op write;
    write.kind = head_op::write;
    write.pages = pages;
    if (!pages.empty())
      write.data =
          group_of_pages(ask<std::vector<uint8_t>>(io, donor, read_pages_atom::value, pages),
                         pages.size(), open.n_layers, m.n_kv, m.kv_lo, m.kv_hi, m.head_bytes);
    const size_t bytes = write.data.size();
    ask<head_answer>(io, helper, head_guest_atom::value, std::move(write));
    ask<int32_t>(io, donor, head_route_atom::value, helper, m.kv_lo, m.kv_hi);
    return bytes;
  } catch (...) {
    // The donor may have taken the route after all (a late answer): home
    // first (harmless when it never left), then the helper's copy goes.
    io->send(donor, head_route_atom::value, caf::actor{}, int32_t{0}, int32_t{0});
    head_op close;
    close.kind = head_op::close;
    io->send(helper, head_guest_atom::value, close);
    throw;
  }
}

std::string bring_head_group_home(caf::actor_system& sys, const caf::actor& donor,
                                  const caf::actor& helper) {
  caf::scoped_actor io{sys};
  ask<int32_t>(io, donor, head_route_atom::value, caf::actor{}, int32_t{0}, int32_t{0});
  // Home from here on, whatever the helper says.
  head_op close;
  close.kind = head_op::close;
  try {
    ask<head_answer>(io, helper, head_guest_atom::value, close);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace troupe
