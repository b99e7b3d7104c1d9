#include "actors/instance.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <variant>

#include "actors/kv_transfer.hpp"
#include "messages/dp_group.hpp"
#include "runtime/common/elapsed.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/kv_blob.hpp"
#include "runtime/engine/prompt_embeds.hpp"
#include "runtime/kvstore/blob_stage.hpp"

// The instance actor is message glue around runtime/engine/engine: each handler
// calls the engine, then carries out the commands the engine appended
// (flush), in order; what the device answers goes back into the engine.
// The actor keeps what only an actor has: the sinks sequences stream to
// (monitored: a sink that dies takes its sequences with it), the data-
// parallel group it steps with, and the promises of exports in flight.

namespace troupe {

namespace {

// What becomes of an export's blob, or why there is none.
using export_done = std::function<void(caf::expected<std::vector<uint8_t>>)>;

// An export whose pages are being read: its blob waits for them.
struct pending_export {
  export_done done;
  kv_blob blob;
  uint64_t id = 0;
};

struct instance_state {
  // Not an aggregate: CAF would construct it from the actor's self pointer.
  instance_state() = default;

  device_actor dev;
  std::unique_ptr<engine> eng;
  std::unordered_map<uint64_t, token_sink_actor> sinks;  // by sequence key
  // Sinks the instance monitors, with their sequences' keys.
  std::unordered_map<caf::actor_addr, std::vector<uint64_t>> by_sink;
  std::unordered_map<uint64_t, pending_export> exports;  // by sequence key
  // The process's KV store (null: none), and the requests waiting for
  // their prefix from it, by request id: true once cancelled meanwhile.
  kv_pool_actor tiers;
  std::unordered_map<uint64_t, bool> fetching;
  uint64_t pulled_pages = 0;               // pages other processes' stores gave (kv_sources)
  std::vector<kv_link_timing> pull_links;  // and how long they took, per store
  // Where each sequence's KV copies go (its request's kv_copy_to), by key.
  std::unordered_map<uint64_t, kv_pool_actor> copies;
  // Blobs arriving from other instances in chunks, until imported; swept
  // for stale ones every k_stage_sweep while any is open.
  std::unique_ptr<blob_stage> staged;
  bool sweeping = false;
  // Lockstep in a dp_group's rounds (dpjoin); a null group: it steps freely.
  dp_group_actor group;
  uint64_t group_id = 0;
  uint64_t enqueues = 0;  // enqueue messages ever received (a dp_group's pending admissions)
  static inline const char* name = "instance";
};

using self_ptr = instance_actor::stateful_pointer<instance_state>;

caf::error refuse(const std::string& what) {
  return caf::make_error(caf::sec::invalid_argument, what);
}

void watch_sink(self_ptr self, uint64_t key, const token_sink_actor& sink) {
  self->state.sinks[key] = sink;
  auto& keys = self->state.by_sink[sink.address()];
  if (keys.empty()) self->monitor(sink);
  keys.push_back(key);
}

// The sequence has left the engine: its sink is no longer its.
void forget_sink(self_ptr self, uint64_t key) {
  auto& st = self->state;
  st.copies.erase(key);
  auto s = st.sinks.find(key);
  if (s == st.sinks.end()) return;
  const auto addr = s->second.address();
  st.sinks.erase(s);
  auto it = st.by_sink.find(addr);
  if (it == st.by_sink.end()) return;
  auto& keys = it->second;
  keys.erase(std::remove(keys.begin(), keys.end(), key), keys.end());
  if (keys.empty()) {
    self->demonitor(addr);
    st.by_sink.erase(it);
  }
}

void flush(self_ptr self);

// Pages sent to a store in one message, at most.
constexpr size_t k_put_pages = 16;
// The process's own store answers in microseconds, a disk read in
// milliseconds; past this a fetch counts as failed (its pages are
// computed).
constexpr auto k_fetch_timeout = std::chrono::seconds(10);

void read_export(self_ptr self, uint64_t key, std::vector<int32_t> pages) {
  auto& st = self->state;
  self->request(st.dev, caf::infinite, read_pages_atom::value, std::move(pages))
      .then(
          [self, key](std::vector<uint8_t>& data) {
            auto& st = self->state;
            auto p = st.exports.extract(key);
            if (p.empty()) return;
            auto& x = p.mapped();
            if (!st.eng->end_export(key)) {
              x.done(refuse("export request " + std::to_string(x.id) +
                            ": it ended while its pages were read"));
            } else {
              forget_sink(self, key);
              x.blob.pages = std::move(data);
              x.done(encode_kv_blob(x.blob));
            }
            flush(self);
          },
          [self, key](caf::error& e) {
            auto& st = self->state;
            auto p = st.exports.extract(key);
            if (st.eng->end_export(key)) forget_sink(self, key);
            if (!p.empty())
              p.mapped().done(refuse("export request " + std::to_string(p.mapped().id) +
                                     ": reading its pages failed: " + self->system().render(e)));
            flush(self);
          });
}

// Evicted prefix pages go to the KV store (copies of a running sequence's
// pages to its copy store, `to`): read (the device reads them before any
// later command writes them), cut into pages, put.  Nothing waits on it; a
// failed read only loses the offer.
void offer_pages(self_ptr self, engine_cmd::spill sp, kv_pool_actor to) {
  auto& st = self->state;
  self->request(st.dev, caf::infinite, read_pages_atom::value, std::move(sp.pages))
      .then(
          [self, to, meta = std::move(sp.meta)](std::vector<uint8_t>& data) {
            auto& st = self->state;
            const size_t per = st.eng->info().kv_bytes_per_page;
            if (!to || per == 0 || data.size() != per * meta.size()) return;
            // At most k_put_pages a message (the store may be another node's).
            std::vector<kv_page> pages;
            for (size_t i = 0; i < meta.size(); ++i) {
              const auto first = data.begin() + std::ptrdiff_t(i * per);
              pages.push_back({st.eng->kv_space(), meta[i].hash, meta[i].parent, meta[i].depth,
                               meta[i].tokens, std::vector<uint8_t>(first, first + per)});
              if (pages.size() == k_put_pages || i + 1 == meta.size())
                self->send(to, kv_put_atom::value, std::exchange(pages, {}));
            }
          },
          [](caf::error&) {});
}

// A swapped-out sequence's KV in the process's KV store: named by this
// instance (its actor id) and the sequence's key.
uint64_t swap_id(self_ptr self, uint64_t key) {
  return (uint64_t(self->id()) << 40) ^ key;
}

// Swap through the KV store (docs/architecture.md §4.5): the swapped-out
// KV goes to the kv_pool, within its swap budget; what does not fit stays
// with the engine as before.
void swap_to_store(self_ptr self, uint64_t key, std::vector<uint8_t> data) {
  self->request(self->state.tiers, k_fetch_timeout, kv_swap_put_atom::value, swap_id(self, key),
                std::move(data))
      .then(
          [self, key](std::vector<uint8_t>& back) {
            if (back.empty())
              self->state.eng->on_swapped_to_store(key);
            else
              self->state.eng->on_swapped_out(key, std::move(back));
            flush(self);
          },
          [self, key](caf::error& e) {
            self->state.eng->on_swap_out_failed(key, "the KV store: " + self->system().render(e));
            flush(self);
          });
}

// Carries out the engine's commands, in the order it gave them (the device
// serves its messages in that order).
void flush(self_ptr self) {
  auto& st = self->state;
  for (auto& cmd : st.eng->take_commands()) {
    std::visit(
        [self, &st](auto& c) {
          using T = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<T, engine_cmd::forward>) {
            const uint64_t id = c.step;
            if (c.dummy) {
              auto done = [self] {
                self->state.eng->on_dummy_done();
                flush(self);
              };
              self->request(st.dev, caf::infinite, forward_atom::value, std::move(c.batch))
                  .then([done](forward_result&) { done(); }, [done](caf::error&) { done(); });
              return;
            }
            self->request(st.dev, caf::infinite, forward_atom::value, std::move(c.batch))
                .then(
                    [self, id](forward_result& r) {
                      self->state.eng->on_step_done(id, r);
                      flush(self);
                    },
                    [self, id](caf::error& e) {
                      self->state.eng->on_step_failed(id, self->system().render(e));
                      flush(self);
                    });
          } else if constexpr (std::is_same_v<T, engine_cmd::copy_pages>) {
            self->request(st.dev, caf::infinite, copy_pages_atom::value, std::move(c.src),
                          std::move(c.dst))
                .then([](int32_t) {},
                      [self, owners = std::move(c.owners)](caf::error& e) {
                        const std::string why = "page copy failed: " + self->system().render(e);
                        for (uint64_t key : owners) self->state.eng->fail(key, why);
                        flush(self);
                      });
          } else if constexpr (std::is_same_v<T, engine_cmd::swap_out>) {
            const uint64_t key = c.key;
            self->request(st.dev, caf::infinite, read_pages_atom::value, std::move(c.pages))
                .then(
                    [self, key](std::vector<uint8_t>& data) {
                      if (self->state.tiers) return swap_to_store(self, key, std::move(data));
                      self->state.eng->on_swapped_out(key, std::move(data));
                      flush(self);
                    },
                    [self, key](caf::error& e) {
                      self->state.eng->on_swap_out_failed(key, self->system().render(e));
                      flush(self);
                    });
          } else if constexpr (std::is_same_v<T, engine_cmd::swap_fetch>) {
            const uint64_t key = c.key;
            self->request(st.tiers, k_fetch_timeout, kv_swap_take_atom::value, swap_id(self, key))
                .then(
                    [self, key](std::vector<uint8_t>& data) {
                      self->state.eng->on_swap_fetched(key, std::move(data));
                      flush(self);
                    },
                    [self, key](caf::error& e) {
                      self->state.eng->on_swap_fetch_failed(key, self->system().render(e));
                      flush(self);
                    });
          } else if constexpr (std::is_same_v<T, engine_cmd::swap_drop>) {
            if (st.tiers) self->send(st.tiers, kv_swap_drop_atom::value, swap_id(self, c.key));
          } else if constexpr (std::is_same_v<T, engine_cmd::swap_in>) {
            const uint64_t key = c.key;
            self->request(st.dev, caf::infinite, write_pages_atom::value, std::move(c.pages),
                          std::move(c.data))
                .then([](int32_t) {},
                      [self, key](caf::error& e) {
                        self->state.eng->fail(key, "swap-in: " + self->system().render(e));
                        flush(self);
                      });
          } else if constexpr (std::is_same_v<T, engine_cmd::spill>) {
            if (c.copy_of == 0) {
              if (st.tiers) offer_pages(self, std::move(c), st.tiers);
            } else if (auto to = st.copies.find(c.copy_of); to != st.copies.end()) {
              offer_pages(self, std::move(c), to->second);
            }
          } else if constexpr (std::is_same_v<T, engine_cmd::load>) {
            auto pages = c.pages;
            self->request(st.dev, caf::infinite, write_pages_atom::value, std::move(c.pages),
                          std::move(c.data))
                .then([self, pages](int32_t) { self->state.eng->on_loaded(pages); },
                      [self, pages](caf::error& e) {
                        self->state.eng->on_load_failed(pages, self->system().render(e));
                        flush(self);
                      });
          } else if constexpr (std::is_same_v<T, engine_cmd::export_read>) {
            read_export(self, c.key, std::move(c.pages));
          } else if constexpr (std::is_same_v<T, engine_cmd::emit>) {
            auto s = st.sinks.find(c.key);
            if (s == st.sinks.end()) return;
            const bool last = c.batch.finish != finish_reason::none;
            self->send(s->second, tokens_atom::value, std::move(c.batch));
            if (last) forget_sink(self, c.key);
          } else if constexpr (std::is_same_v<T, engine_cmd::preempted>) {
            auto s = st.sinks.find(c.key);
            if (s != st.sinks.end()) self->send(s->second, preempted_atom::value, c.id, c.swapped);
          } else if constexpr (std::is_same_v<T, engine_cmd::ask_round>) {
            if (st.group) self->send(st.group, dp_ready_atom::value, st.group_id);
          } else if constexpr (std::is_same_v<T, engine_cmd::round_done>) {
            if (st.group)
              self->send(st.group, dp_done_atom::value, st.group_id, c.round, c.ms, c.dummy);
          }
        },
        cmd);
  }
}

// Runs an engine call and carries out what it asked for.
template <class F>
auto with_engine(self_ptr self, F&& f) {
  auto result = f(*self->state.eng);
  flush(self);
  return result;
}

void leave_group(self_ptr self) {
  auto& st = self->state;
  if (st.group) self->demonitor(st.group.address());
  st.group = nullptr;
  st.eng->leave_group();
}

caf::result<int32_t> join_group(self_ptr self, const caf::actor& group, uint64_t id) {
  auto& st = self->state;
  leave_group(self);
  if (!group) {
    st.eng->step();
    flush(self);
    return 1;
  }
  // Set before the engine joins: joining may ask the group for a round.
  st.group = caf::actor_cast<dp_group_actor>(group);
  st.group_id = id;
  if (auto why = st.eng->join_group(); !why.empty()) {
    st.group = nullptr;
    flush(self);
    return refuse("dpjoin: " + why);
  }
  self->monitor(st.group);
  flush(self);
  return 1;
}

// Takes sequence `id` out as a blob, which `done` gets once its pages are
// read (or why there is none).  "" or why it cannot start: the sequence
// stays where it is.
std::string start_export(self_ptr self, uint64_t id, export_done done) {
  auto& st = self->state;
  engine::export_start x;
  if (auto why = st.eng->begin_export(id, x); !why.empty()) {
    flush(self);
    return "export: " + why;
  }
  if (x.pages.empty()) {
    forget_sink(self, x.key);
    flush(self);
    done(encode_kv_blob(x.blob));
    return "";
  }
  st.exports.emplace(x.key, pending_export{std::move(done), std::move(x.blob), id});
  flush(self);
  return "";
}

caf::result<std::vector<uint8_t>> export_sequence(self_ptr self, uint64_t id) {
  auto rp = self->make_response_promise<std::vector<uint8_t>>();
  auto why = start_export(self, id, [rp](caf::expected<std::vector<uint8_t>> b) mutable {
    if (b)
      rp.deliver(std::move(*b));
    else
      rp.deliver(std::move(b.error()));
  });
  // Once a promise exists CAF sends no returned error: it goes through it.
  if (!why.empty()) rp.deliver(refuse(why));
  return rp;
}

caf::result<uint64_t, uint64_t> export_to(self_ptr self, uint64_t id, kv_receiver_actor to) {
  if (!to) return refuse("exportto: no receiver");
  auto rp = self->make_response_promise<uint64_t, uint64_t>();
  auto why = start_export(self, id, [self, rp, to](caf::expected<std::vector<uint8_t>> b) mutable {
    if (!b) {
      rp.deliver(std::move(b.error()));
      return;
    }
    send_blob(self, to, std::move(*b),
              [rp](uint64_t transfer, uint64_t bytes) mutable { rp.deliver(transfer, bytes); });
  });
  if (!why.empty()) rp.deliver(refuse(why));
  return rp;
}

// A staged blob nobody imported within this long is dropped (its sender
// failed, or the request ended or recovered elsewhere), looked for this
// often.
constexpr auto k_stage_ttl = std::chrono::seconds(30);
constexpr auto k_stage_sweep = std::chrono::seconds(10);

// The most a blob for this arena can be: all its pages, its tokens (at
// most the context), the header.
uint64_t stage_cap(const engine& e) {
  const auto& i = e.info();
  return uint64_t(i.n_pages) * i.kv_bytes_per_page + uint64_t(i.n_ctx) * 8 + (uint64_t(1) << 20);
}

// Admits a sequence from a blob; the answer is the tokens whose KV came.
caf::result<int32_t> import_blob(self_ptr self, sequence_request& r,
                                 const std::vector<uint8_t>& bytes) {
  const std::string who = "import request " + std::to_string(r.id) + ": ";
  if (!r.sink) return refuse(who + "no sink to stream to");
  uint64_t key = 0;
  int32_t n_kv = 0;
  const auto sink = r.sink;
  auto copy_to = r.kv_copy_to;
  auto why = self->state.eng->import(std::move(r), bytes, key, n_kv);
  if (why.empty()) {
    watch_sink(self, key, sink);
    if (copy_to) self->state.copies[key] = copy_to;
  }
  flush(self);
  if (!why.empty()) return refuse(who + why);
  return n_kv;
}

caf::result<int32_t> import_staged(self_ptr self, sequence_request& r, uint64_t transfer) {
  auto bytes = self->state.staged->take(transfer);
  if (!bytes)
    return refuse("import request " + std::to_string(r.id) + ": transfer " +
                  std::to_string(transfer) + " is not here in full");
  return import_blob(self, r, *bytes);
}

// Queues a sequence in the engine, with the KV store's pages of its prompt
// (loaded at its admission); "" or why it was refused.
std::string enqueue_now(self_ptr self, sequence_request r, int32_t& ahead,
                        std::vector<kv_page> tier = {}) {
  uint64_t key = 0;
  const auto sink = r.sink;
  auto copy_to = r.kv_copy_to;
  auto why = self->state.eng->enqueue(std::move(r), key, ahead, std::move(tier));
  if (why.empty()) {
    watch_sink(self, key, sink);
    if (copy_to) self->state.copies[key] = std::move(copy_to);
  }
  flush(self);
  return why;
}

// The stores a prompt's missing pages may come from, in order: this
// process's, then the ones the request names (other nodes': a pull, or
// the copies of a request that recovers).
std::vector<kv_pool_actor> stores_for(self_ptr self, const sequence_request& r) {
  std::vector<kv_pool_actor> out;
  if (self->state.tiers) out.push_back(self->state.tiers);
  for (const auto& s : r.kv_sources)
    if (s && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

// A prompt whose prefix the arena lacks asks the KV stores for it first;
// the pages found wait with the sequence, and its admission writes those the
// arena still lacks into its table.  Empty when there is nothing to ask.
std::vector<uint64_t> missing_prefix(self_ptr self, const sequence_request& r, bool any_store) {
  auto& st = self->state;
  if (!any_store || r.embed || !st.eng->options().prefix_caching || st.fetching.count(r.id))
    return {};
  std::vector<int32_t> tokens = r.prompt;
  tokens.insert(tokens.end(), r.generated.begin(), r.generated.end());
  int32_t cached = 0;
  // Keyed as the engine keys them (image rows by their image).
  auto hashes = st.eng->prefix_hashes(keyed_tokens(std::move(tokens), r.embeds), cached);
  hashes.erase(hashes.begin(), hashes.begin() + std::min<size_t>(cached, hashes.size()));
  // No more than the arena could take now (an admission takes no more).
  hashes.resize(std::min<size_t>(hashes.size(), size_t(st.eng->pool().available())));
  return hashes;
}

// Another node's store is asked for k_pull_pages at a time (bounded
// messages), each within k_pull_timeout (the process's own store within
// k_fetch_timeout); a store that fails counts as holding nothing.
constexpr size_t k_pull_pages = 16;
constexpr auto k_pull_timeout = std::chrono::seconds(5);

// A prompt's run of missing pages, asked of each store in turn: a store
// gives a leading run; the next store is asked for the rest.
struct prefix_fetch {
  std::vector<kv_pool_actor> stores;
  size_t store = 0;
  std::vector<uint64_t> want;
  size_t next = 0;  // want[next] is the first page not found yet
  std::vector<kv_page> got;
  size_t pulled = 0;  // pages other processes' stores gave
  std::function<void(std::vector<kv_page>)> done;
};

// A pull's pages and time, for the router's per-link cost.
void note_pull(self_ptr self, const kv_pool_actor& store, size_t pages, double ms) {
  const auto name = caf::to_string(store.address());
  auto& links = self->state.pull_links;
  auto it = std::find_if(links.begin(), links.end(),
                         [&](const kv_link_timing& l) { return l.store == name; });
  if (it == links.end()) it = links.insert(links.end(), kv_link_timing{name, 0, 0});
  it->pages += pages;
  it->ms += ms;
}

void fetch_next(self_ptr self, std::shared_ptr<prefix_fetch> f) {
  if (f->next == f->want.size() || f->store == f->stores.size()) {
    self->state.pulled_pages += f->pulled;
    return f->done(std::move(f->got));
  }
  const bool local = f->stores[f->store] == self->state.tiers;
  const size_t n =
      local ? f->want.size() - f->next : std::min(k_pull_pages, f->want.size() - f->next);
  std::vector<uint64_t> ask(f->want.begin() + std::ptrdiff_t(f->next),
                            f->want.begin() + std::ptrdiff_t(f->next + n));
  const auto asked = std::chrono::steady_clock::now();
  self->request(f->stores[f->store], local ? k_fetch_timeout : k_pull_timeout, kv_fetch_atom::value,
                self->state.eng->kv_space(), ask)
      .then(
          [self, f, n, local, ask, asked](std::vector<kv_page>& pages) {
            size_t k = 0;  // the leading pages that are the ones asked (the engine checks the rest)
            while (k < pages.size() && k < n && pages[k].hash == ask[k]) ++k;
            for (size_t i = 0; i < k; ++i) f->got.push_back(std::move(pages[i]));
            f->next += k;
            if (!local) {
              f->pulled += k;
              // An answer with no page says nothing of the link's speed.
              if (k > 0) note_pull(self, f->stores[f->store], k, ms_since(asked));
            }
            if (k < n) ++f->store;
            fetch_next(self, f);
          },
          [self, f, local, asked](caf::error&) {
            if (!local) note_pull(self, f->stores[f->store], 0, ms_since(asked));
            ++f->store;
            fetch_next(self, f);
          });
}

caf::result<int32_t> enqueue_with_prefix(self_ptr self, sequence_request& r) {
  auto& st = self->state;
  const std::string who = "enqueue request " + std::to_string(r.id) + ": ";
  auto stores = stores_for(self, r);
  auto want = missing_prefix(self, r, !stores.empty());
  int32_t ahead = 0;
  if (want.empty()) {
    if (auto why = enqueue_now(self, std::move(r), ahead); !why.empty()) return refuse(who + why);
    return ahead;
  }
  const uint64_t id = r.id;
  st.fetching[id] = false;
  auto rp = self->make_response_promise<int32_t>();
  auto req = std::make_shared<sequence_request>(std::move(r));
  auto f = std::make_shared<prefix_fetch>();
  f->stores = std::move(stores);
  f->want = std::move(want);
  f->done = [self, rp, req, id, who,
             asked = std::chrono::steady_clock::now()](std::vector<kv_page> pages) mutable {
    auto& st = self->state;
    const bool cancelled = st.fetching[id];
    st.fetching.erase(id);
    if (!pages.empty()) st.eng->note_tier_load_ms(ms_since(asked));
    int32_t ahead = 0;
    if (auto why = enqueue_now(self, std::move(*req), ahead, std::move(pages)); !why.empty()) {
      rp.deliver(refuse(who + why));
      return;
    }
    if (cancelled) {
      st.eng->abort(id);
      flush(self);
    }
    rp.deliver(ahead);
  };
  fetch_next(self, f);
  return rp;
}

instance_actor::behavior_type instance_behavior(self_ptr self, device_actor dev, device_info info,
                                                instance_options opts, kv_pool_actor tiers) {
  auto& st = self->state;
  st.dev = std::move(dev);
  st.tiers = std::move(tiers);
  st.eng = std::make_unique<engine>(std::move(info), std::move(opts));
  st.staged = std::make_unique<blob_stage>(st.eng->geometry(), stage_cap(*st.eng), k_stage_ttl);
  // Without its device the instance cannot step: it ends with it (a
  // pipeline whose stage's node was lost, for one), so its requests see it
  // down and recover elsewhere, as for a crash of the instance itself.
  self->monitor(st.dev);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.dev.address()) {
      spdlog::warn("instance: its device ended ({}); the instance ends with it",
                   self->system().render(dm.reason));
      self->quit(dm.reason ? dm.reason : caf::error{caf::exit_reason::unknown});
      return;
    }
    if (st.group && dm.source == st.group.address()) {
      // The group is gone: step freely again.
      leave_group(self);
      st.eng->step();
      return flush(self);
    }
    auto it = st.by_sink.find(dm.source);
    if (it == st.by_sink.end()) return;
    const auto keys = it->second;  // flush() edits the map
    for (uint64_t key : keys) {
      if (!st.eng->has_key(key)) continue;
      spdlog::debug("instance: a request lost its sink, releasing it");
      st.eng->abort_key(key);
    }
    st.eng->step();
    flush(self);
  });
  return {
      // A new sequence; the answer is how many wait before it.
      [self](enqueue_atom, sequence_request& r) -> caf::result<int32_t> {
        ++self->state.enqueues;  // refused or not, it arrived
        if (!r.sink)
          return refuse("enqueue request " + std::to_string(r.id) + ": no sink to stream to");
        return enqueue_with_prefix(self, r);
      },
      // The sequence's KV as a blob (migration, disaggregation); it leaves.
      [self](export_atom, uint64_t id) -> caf::result<std::vector<uint8_t>> {
        return export_sequence(self, id);
      },
      // A sequence with its KV from a blob; the answer is the tokens it holds.
      [self](import_atom, sequence_request& r, std::vector<uint8_t>& bytes)
          -> caf::result<int32_t> { return import_blob(self, r, bytes); },
      // Export, the blob going straight to another instance in chunks.
      [self](export_to_atom, uint64_t id, kv_receiver_actor& to)
          -> caf::result<uint64_t, uint64_t> { return export_to(self, id, std::move(to)); },
      // One chunk of a blob another instance sends.
      [self](kv_stage_atom, uint64_t id, uint64_t offset, uint64_t total,
             std::vector<uint8_t>& chunk) -> caf::result<uint64_t> {
        auto& st = self->state;
        auto why = st.staged->add(id, offset, total, chunk, std::chrono::steady_clock::now());
        if (!st.sweeping && st.staged->open() > 0) {
          st.sweeping = true;
          self->delayed_send(self, k_stage_sweep, tick_atom::value);
        }
        if (!why.empty()) return refuse("kvstage: " + why);
        return id;
      },
      // Its own timer while blobs are staged: stale ones go.
      [self](tick_atom) {
        auto& st = self->state;
        st.staged->sweep(std::chrono::steady_clock::now());
        st.sweeping = st.staged->open() > 0;
        if (st.sweeping) self->delayed_send(self, k_stage_sweep, tick_atom::value);
      },
      // Import from a blob that arrived in chunks.
      [self](import_atom, sequence_request& r, uint64_t transfer) -> caf::result<int32_t> {
        return import_staged(self, r, transfer);
      },
      // Cancel: the sequence's last batch says aborted.
      [self](abort_atom, uint64_t id) {
        // Still waiting for its prefix: it is queued, then aborted.
        if (auto f = self->state.fetching.find(id); f != self->state.fetching.end())
          f->second = true;
        with_engine(self, [id](engine& e) { return e.abort(id); });
      },
      // Draining: the request side of every sequence that `client` (the
      // service process draining it; none: every process) streams to is
      // asked to move it.  Another service sharing this instance keeps
      // its sequences here.  Replies with how many that client still has.
      [self](relocate_atom, const caf::node_id& client) -> int32_t {
        int32_t held = 0;
        for (const auto& [key, id] : self->state.eng->ids()) {
          auto s = self->state.sinks.find(key);
          if (s == self->state.sinks.end()) continue;
          if (client != caf::node_id{} && s->second.node() != client) continue;
          ++held;
          self->send(s->second, relocate_atom::value, id);
        }
        return held;
      },
      // Rebalancing: at most n of the client's queued sequences (no KV
      // yet, so a move costs a placement) are asked to move, the latest
      // first.  n 0: how many sequences the client has here, none asked.
      [self](relocate_atom, const caf::node_id& client, int32_t n) -> int32_t {
        if (n <= 0) {
          int32_t held = 0;
          for (const auto& [key, id] : self->state.eng->ids()) {
            auto s = self->state.sinks.find(key);
            held += s != self->state.sinks.end() && s->second.node() == client ? 1 : 0;
          }
          return held;
        }
        auto seqs = self->state.eng->sequences();
        int32_t asked = 0;
        for (auto it = seqs.rbegin(); it != seqs.rend() && asked < n; ++it) {
          if (!it->queued) continue;
          auto s = self->state.sinks.find(it->key);
          if (s == self->state.sinks.end() || s->second.node() != client) continue;
          ++asked;
          self->send(s->second, relocate_atom::value, it->id);
        }
        return asked;
      },
      // D->P preemption by migration: the client's decoding sequences
      // are asked to move to `targets` in order (the router's plan), those
      // with the most tokens left first: each move frees the most decode
      // work.  Replies with how many were asked.
      [self](evacuate_atom, const caf::node_id& client,
             const std::vector<uint64_t>& targets) -> int32_t {
        const auto n = static_cast<int32_t>(targets.size());
        auto seqs = self->state.eng->sequences();
        std::stable_sort(
            seqs.begin(), seqs.end(),
            [](const engine_seq_view& a, const engine_seq_view& b) { return a.left > b.left; });
        int32_t asked = 0;
        for (const auto& q : seqs) {
          if (asked >= n) break;
          if (!q.decoding) continue;
          auto s = self->state.sinks.find(q.key);
          if (s == self->state.sinks.end() || s->second.node() != client) continue;
          self->send(s->second, relocate_atom::value, q.id, targets[size_t(asked)]);
          ++asked;
        }
        return asked;
      },
      // Preempt one running sequence now (the shell, tests).
      [self](preempt_atom, uint64_t id) -> caf::result<int32_t> {
        auto why = with_engine(self, [id](engine& e) { return e.preempt_request(id); });
        if (!why.empty()) return refuse("preempt: " + why);
        return 1;
      },
      // Change a step limit live; the answer is its old value.
      [self](set_atom, const std::string& key, int32_t value) -> caf::result<int32_t> {
        int32_t old = 0;
        auto why = with_engine(self, [&](engine& e) { return e.set_limit(key, value, old); });
        if (!why.empty()) return refuse(why);
        return old;
      },
      // Change the reported role; the answer is the old one.
      [self](set_role_atom, const std::string& role) -> caf::result<std::string> {
        std::string old;
        if (auto why = self->state.eng->set_role(role, old); !why.empty())
          return refuse("set role: " + why);
        return old;
      },
      // The sequences held, for a dp_group's moves.
      [self](sequences_atom) {
        sequences_report out;
        out.enqueues = self->state.enqueues;
        for (const auto& v : self->state.eng->sequences()) {
          auto s = self->state.sinks.find(v.key);
          out.seqs.push_back({v.id, v.tokens, v.decoding, v.left,
                              s != self->state.sinks.end() ? s->second : token_sink_actor{}});
        }
        return out;
      },
      // Step in a dp_group's rounds (a null group: freely again).
      [self](dp_join_atom, const caf::actor& group, uint64_t id) {
        return join_group(self, group, id);
      },
      // The group's round `round` has begun.
      [self](dp_go_atom, uint64_t round) {
        with_engine(self, [round](engine& e) {
          e.on_round(round);
          return 0;
        });
      },
      // Counters, queue, KV pool and recent steps.
      // With a KV store, its counters too (a local hop; its answer or not).
      [self](stats_atom) -> caf::result<instance_stats> {
        auto s = self->state.eng->stats();
        s.pulled_pages = self->state.pulled_pages;
        s.pull_links = self->state.pull_links;
        if (!self->state.tiers) return s;
        auto rp = self->make_response_promise<instance_stats>();
        self->request(self->state.tiers, std::chrono::seconds(2), stats_atom::value)
            .then(
                [rp, s](kv_store_stats& k) mutable {
                  s.store = std::move(k);
                  rp.deliver(std::move(s));
                },
                [rp, s](caf::error&) mutable { rp.deliver(std::move(s)); });
        return rp;
      },
  };
}

}  // namespace

instance_actor spawn_instance(caf::actor_system& sys, device_actor dev, instance_options opts,
                              kv_pool_actor tiers) {
  device_info info;
  std::string failure;
  {
    caf::scoped_actor self{sys};
    self->request(dev, caf::infinite, info_atom::value)
        .receive([&](device_info& i) { info = std::move(i); },
                 [&](caf::error& e) { failure = sys.render(e); });
  }
  if (!failure.empty()) throw std::runtime_error("instance: device info: " + failure);
  opts.limits.page_size = info.page_size;
  if (auto why = validate(opts.limits); !why.empty())
    throw std::invalid_argument("instance: " + why);
  opts.kv_tiers = static_cast<bool>(tiers);
  return sys.spawn(instance_behavior, std::move(dev), std::move(info), std::move(opts),
                   std::move(tiers));
}

}  // namespace troupe
