#pragma once
// Direct KV transfer, the sending side (docs/architecture.md §4.10 "The KV
// store"): a blob goes from the actor that holds it to the instance that
// imports it (kvstage, messages/instance.hpp), in chunks of k_chunk bytes,
// at most k_window unanswered, each answered within k_chunk_timeout.  So a
// transfer holds bounded memory in flight, and a stalled or dead receiver
// fails it in seconds.  Between two nodes the chunks travel on the nodes'
// own connection (actors/node: peers), never through a service process.
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "messages/instance.hpp"

namespace troupe {

constexpr size_t k_chunk = size_t(1) << 20;
constexpr int k_window = 4;
constexpr auto k_chunk_timeout = std::chrono::seconds(10);

// What the receiver calls the transfer (import it from there), 0 when it
// failed (refused, stalled, receiver gone); and the blob's size.
using transfer_done = std::function<void(uint64_t, uint64_t)>;

namespace detail {

struct outgoing_blob {
  std::vector<uint8_t> bytes;
  kv_receiver_actor to;
  transfer_done done;
  uint64_t id = 0;    // the receiver's name for it (its answer to the first chunk)
  size_t sent = 0;    // bytes sent
  size_t acked = 0;   // bytes the receiver took
  int in_flight = 0;  // chunks unanswered
  bool over = false;  // done was called
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  std::vector<uint8_t> next_chunk() {
    const size_t n = std::min(k_chunk, bytes.size() - sent);
    std::vector<uint8_t> c(bytes.begin() + std::ptrdiff_t(sent),
                           bytes.begin() + std::ptrdiff_t(sent + n));
    sent += n;
    return c;
  }
  void finish(uint64_t result) {
    if (over) return;
    over = true;
    const uint64_t size = bytes.size();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    spdlog::debug("KV transfer: {} bytes in {:.1f} ms ({:.0f} MB/s)", size, ms,
                  ms > 0 ? size / ms / 1e3 : 0.0);
    bytes = {};
    done(result, size);
  }
  void fail(const std::string& why) {
    if (over) return;
    spdlog::warn("KV transfer failed after {} of {} bytes: {}", acked, bytes.size(), why);
    finish(0);
  }
};

template <class Self>
void pump(Self* self, std::shared_ptr<outgoing_blob> t) {
  if (t->over) return;
  if (t->acked == t->bytes.size()) return t->finish(t->id);
  while (t->in_flight < k_window && t->sent < t->bytes.size()) {
    const uint64_t offset = t->sent;
    auto chunk = t->next_chunk();
    const size_t n = chunk.size();
    ++t->in_flight;
    self->request(t->to, k_chunk_timeout, kv_stage_atom::value, t->id, offset,
                  uint64_t(t->bytes.size()), std::move(chunk))
        .then(
            [self, t, n](uint64_t) {
              --t->in_flight;
              t->acked += n;
              pump(self, t);
            },
            [self, t](caf::error& e) { t->fail(self->system().render(e)); });
  }
}

}  // namespace detail

// Sends `blob` to `to`; `done` gets the transfer's id there, or 0.
template <class Self>
void send_blob(Self* self, kv_receiver_actor to, std::vector<uint8_t> blob, transfer_done done) {
  auto t = std::make_shared<detail::outgoing_blob>();
  t->bytes = std::move(blob);
  t->to = std::move(to);
  t->done = std::move(done);
  // The first chunk opens the transfer (id 0); the answer names it.
  auto first = t->next_chunk();
  const size_t n = first.size();
  self->request(t->to, k_chunk_timeout, kv_stage_atom::value, uint64_t{0}, uint64_t{0},
                uint64_t(t->bytes.size()), std::move(first))
      .then(
          [self, t, n](uint64_t id) {
            t->id = id;
            t->acked = n;
            detail::pump(self, t);
          },
          [self, t](caf::error& e) { t->fail(self->system().render(e)); });
}

}  // namespace troupe
