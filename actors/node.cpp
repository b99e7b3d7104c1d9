#include "actors/node.hpp"
#include "messages/atoms.hpp"

#include <CL/cl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "actors/device.hpp"
#include "actors/instance.hpp"
#include "runtime/model/model_file.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/text/tokenizer.hpp"

namespace troupe {

scheduler_limits limits_of(const engine_settings& es) {
  scheduler_limits lim;
  lim.max_batch_tokens = es.max_batch_tokens;
  lim.max_seqs = es.max_seqs;
  lim.chunk_size = es.chunk_size;
  lim.page_size = es.page_size;
  lim.offline_yields = es.colocate;
  return lim;
}

admission_policy admission_policy_of(const engine_settings& es) {
  admission_policy p;
  p.mode = parse_batching_mode(es.batching).value_or(batching_mode::continuous);
  if (es.batch_order != "deadline") p.order = parse_batch_order(es.batch_order);
  p.odbs.max_batch = es.batch_max;
  p.odbs.threshold = es.odbs_threshold;
  p.odbs.fill = es.odbs_fill;
  return p;
}

kv_store_options kv_store_options_of(const engine_settings& es) {
  kv_store_options o;
  o.host_bytes = uint64_t(es.kv_host_mb) << 20;
  o.disk_dir = es.kv_disk_dir;
  o.disk_bytes = uint64_t(es.kv_disk_mb) << 20;
  o.policy = parse_tier_eviction(es.kv_tier_eviction).value_or(tier_eviction::lru);
  return o;
}

engine_handles spawn_engine(caf::actor_system& sys, int32_t slot, const instance_spec& spec,
                            std::shared_ptr<const model_file> model, kv_pool_actor tiers) {
  const engine_settings& es = spec.engine;
  if (!model) {
    auto where = resolve_model(es.model);
    model = model_file::open(where.model_path,
                             es.tokenizer.empty() ? where.tokenizer_path : es.tokenizer);
  }
  auto tok = tokenizer::create(model->vocab());
  engine_options eo = engine_options_from(es, {es.platform, es.device, spec.cores, spec.slice});
  instance_options io;
  io.limits = limits_of(es);
  io.preemption = es.preemption == "swap" ? preempt_mode::swap : preempt_mode::recompute;
  io.eog_tokens = tok->end_of_generation_ids();
  {
    auto bytes = std::make_shared<std::vector<std::string>>();
    for (int32_t id = 0; id < tok->n_vocab(); ++id) bytes->push_back(tok->token_bytes(id));
    io.token_bytes = std::move(bytes);
  }
  io.prefix_caching = es.prefix_caching;
  io.admission = admission_policy_of(es);
  io.role = spec.role;
  io.tpot_target_ms = spec.tpot_target_ms;
  io.draft_tokens = es.draft_tokens;
  io.step_overlap = es.step_overlap;
  io.kept_steps = static_cast<size_t>(std::max(1, es.step_history));
  io.kv_tiers = static_cast<bool>(tiers);
  engine_handles h;
  h.device = spawn_device(sys, std::move(model), eo);
  h.hosted.device = h.device;
  try {
    h.hosted.actor = spawn_instance(sys, h.device, io, tiers);
  } catch (...) {
    caf::anon_send_exit(h.device, caf::exit_reason::user_shutdown);
    throw;
  }
  h.hosted.slot = slot;
  h.hosted.store = tiers;
  // The instance answers from its own copy; this is the device's view.
  caf::scoped_actor self{sys};
  self->request(h.device, std::chrono::seconds(30), info_atom::value)
      .receive([&](device_info& i) { h.hosted.info = std::move(i); }, [](caf::error&) {});
  return h;
}

node_resources local_resources() {
  node_resources r;
  char host[256] = "";
  if (::gethostname(host, sizeof host - 1) == 0) r.host = host;
  r.cores = static_cast<int32_t>(::sysconf(_SC_NPROCESSORS_ONLN));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:") r.mem_total = kib << 10;
    if (key == "MemAvailable:") r.mem_available = kib << 10;
  }
  cl_uint np = 0;
  if (clGetPlatformIDs(0, nullptr, &np) == CL_SUCCESS && np > 0) {
    std::vector<cl_platform_id> plats(np);
    clGetPlatformIDs(np, plats.data(), nullptr);
    for (cl_uint p = 0; p < np; ++p) {
      cl_uint nd = 0;
      if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS) continue;
      std::vector<cl_device_id> devs(nd);
      clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs.data(), nullptr);
      for (cl_uint d = 0; d < nd; ++d) {
        char name[256] = "";
        clGetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof name - 1, name, nullptr);
        r.opencl_devices.push_back(std::to_string(p) + "/" + std::to_string(d) + ": " + name);
      }
    }
  }
  return r;
}

device_actor spawn_stage_device(caf::actor_system& sys, const stage_spec& spec) {
  const engine_settings& es = spec.engine;
  auto where = resolve_model(es.model);
  auto model = model_file::open(where.model_path,
                                es.tokenizer.empty() ? where.tokenizer_path : es.tokenizer);
  const int layers = model->hparams().n_layer;
  if (spec.layer_first < 0 || spec.layer_end <= spec.layer_first || spec.layer_end > layers)
    throw std::invalid_argument("layers " + std::to_string(spec.layer_first) + ".." +
                                std::to_string(spec.layer_end - 1) + " are not a range of the " +
                                std::to_string(layers) + " layers of " + es.model);
  if (spec.n_pages <= 0) throw std::invalid_argument("a stage needs a KV page at least");
  // The node's device, whole: the stage is one device of the pipeline.
  engine_options eo = engine_options_from(es, {es.platform, es.device, 0, 0});
  eo.pipeline_stages = 1;
  eo.pipeline_nodes.clear();
  eo.expert_devices = 0;
  eo.layer_first = spec.layer_first;
  eo.layer_end = spec.layer_end;
  eo.n_pages = spec.n_pages;
  return spawn_device(sys, std::move(model), eo);
}

namespace {

// The detached builder: one model load at a time (two at once would only
// share the same cores), never on CAF's scheduler threads.
node_spawner_actor::behavior_type spawner_behavior(node_spawner_actor::pointer self) {
  // The node's KV store: spawned with the first instance that asks for one,
  // shared by every later one (its instances keep it alive).
  auto tiers = std::make_shared<kv_pool_actor>();
  return {
      // Build one instance (device and instance actor) from its spec.
      [self, tiers](spawn_instance_atom, int32_t slot,
                    const instance_spec& spec) -> caf::result<hosted_instance> {
        try {
          if (!*tiers && kv_store_options_of(spec.engine).enabled())
            *tiers = spawn_kv_pool(self->system(), kv_store_options_of(spec.engine));
          auto h = spawn_engine(self->system(), slot, spec, nullptr, *tiers);
          // The device lives as long as its instance.
          auto dev = h.device;
          h.hosted.actor->attach_functor([dev](const caf::error&) {
            caf::anon_send_exit(dev, caf::exit_reason::user_shutdown);
          });
          return h.hosted;
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error, "instance " + std::to_string(slot) +
                                                              " (model " + spec.engine.model +
                                                              "): " + e.what());
        }
      },
  };
}

stage_builder_actor::behavior_type stage_builder(stage_builder_actor::pointer self) {
  return {
      [self](spawn_stage_atom, const stage_spec& spec) -> caf::result<device_actor> {
        try {
          return spawn_stage_device(self->system(), spec);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error,
                                 "pipeline stage (model " + spec.engine.model + "): " + e.what());
        }
      },
  };
}

// One instance the node runs, shared by every service that asks for the
// same spec in the same slot (issue 37 item 3: several services of a
// cluster serve through the same instances, and the instance's admission
// arbitrates between their requests).  It stops once no service uses it.
struct shared_instance {
  hosted_instance hosted;
  std::set<std::string> users;  // service ids
};

// One service the node hosts instances for: which shared instance serves
// each of its slots.
struct hosted_service {
  node_link_actor link;
  bool link_alive = false;
  std::map<int32_t, std::string> slots;  // slot -> instance key
};

struct node_state {
  node_options opts;
  node_spawner_actor spawner;
  std::map<std::string, hosted_service> services;    // by service id
  std::map<std::string, shared_instance> instances;  // by instance key
  // Keys being built, with what waits for them (a second service asking
  // for an instance the first's request is building gets that one).
  // They are called with the build's error, or null once it is up.
  std::map<std::string, std::vector<std::function<void(const caf::error*)>>> starting;
  bool leaving = false;
  // Other nodes connected directly (by the address a service gave: their
  // node actor, monitored, so a lost connection is noticed and made
  // again), and those being connected.
  std::map<std::string, caf::actor> peers;
  std::set<std::string> connecting;
  // Pipeline stages it runs for pipelined devices elsewhere (monitored:
  // a stage ends with its pipeline).
  std::vector<device_actor> stages;
  static inline const char* name = "node";
};

using node_impl = node_control_actor::extend<caf::reacts_to<reap_atom, std::string>>;
using self_ptr = node_impl::stateful_pointer<node_state>;

// A direct connection to each peer not connected yet (the cluster's TLS,
// as a service connects): CAF routes messages between two nodes over
// their own connection once there is one, not through the service that
// introduced them, so KV moves node to node.  Connecting to itself only
// shows its own node id; a failure is logged and tried again at the next
// peers message (a service's node link sends them every few seconds).
void connect_peers(self_ptr self, const std::vector<std::string>& addresses) {
  auto& st = self->state;
  auto mm = self->system().openssl_manager().actor_handle();
  for (const auto& a : addresses) {
    if (st.peers.count(a) || st.connecting.count(a)) continue;
    const auto colon = a.rfind(':');
    if (colon == std::string::npos) continue;
    const std::string host = a.substr(0, colon);
    const auto port = static_cast<uint16_t>(std::atoi(a.c_str() + colon + 1));
    st.connecting.insert(a);
    self->request(mm, std::chrono::seconds(10), caf::connect_atom::value, host, port)
        .then(
            [self, a](const caf::node_id& nid, caf::strong_actor_ptr& ptr,
                      const std::set<std::string>&) {
              auto& st = self->state;
              st.connecting.erase(a);
              if (nid == self->system().node() || !ptr) return;
              auto peer = caf::actor_cast<caf::actor>(ptr);
              self->monitor(peer);
              st.peers[a] = peer;
              spdlog::info("node: direct connection to peer {}", a);
            },
            [self, a](caf::error& e) {
              self->state.connecting.erase(a);
              spdlog::warn("node: cannot connect to peer {}: {}", a, self->system().render(e));
            });
  }
}

// One instance's stats into the node's load; the KV store is the
// process's, counted once (every instance's stats carry it).
void add_instance_load(node_load& l, const instance_stats& s, bool& store_seen) {
  l.running += s.running;
  l.waiting += s.waiting;
  l.used_pages += static_cast<int64_t>(s.kv.used());
  l.total_pages += static_cast<int64_t>(s.kv.total);
  if (store_seen || s.store.tiers.empty()) return;
  store_seen = true;
  for (const auto& t : s.store.tiers) {
    (t.name == "disk" ? l.kv_disk_pages : l.kv_host_pages) += t.pages;
    l.kv_hits += t.hits;
  }
  l.kv_misses = s.store.tiers.back().misses;  // the lowest tier's: no tier held the page
}

// Which shared instance serves `spec` in `slot`: services that ask for the
// same engine in the same slot share it.
std::string instance_key(int32_t slot, const instance_spec& spec) {
  return std::to_string(slot) + "/" + caf::deep_to_string(spec);
}

// Service `svc` no longer uses the instance `key`: it stops when no
// other service does.
void release(self_ptr self, const std::string& svc, const std::string& key) {
  auto& st = self->state;
  auto it = st.instances.find(key);
  if (it == st.instances.end()) return;
  it->second.users.erase(svc);
  if (!it->second.users.empty()) return;
  self->send_exit(it->second.hosted.actor, caf::exit_reason::user_shutdown);
  st.instances.erase(it);
}

// The instances of `svc`'s slots, in slot order (those that are up).
std::vector<hosted_instance> hosted_of(const node_state& st, const hosted_service& hs) {
  std::vector<hosted_instance> out;
  for (const auto& [slot, key] : hs.slots)
    if (auto it = st.instances.find(key); it != st.instances.end())
      out.push_back(it->second.hosted);
  return out;
}

// Spawns the missing slots of `svc` one after the other (or waits for
// the one another service's request is building), then delivers.
void fill_slots(self_ptr self, std::string svc, std::vector<int32_t> todo, size_t next,
                std::vector<instance_spec> specs,
                caf::typed_response_promise<std::vector<hosted_instance>> rp) {
  auto& st = self->state;
  auto it = st.services.find(svc);
  if (it == st.services.end()) {
    rp.deliver(caf::make_error(caf::sec::runtime_error, "the service went away"));
    return;
  }
  if (next == todo.size()) {
    rp.deliver(hosted_of(st, it->second));
    return;
  }
  const int32_t slot = todo[next];
  const auto sit = it->second.slots.find(slot);
  if (sit == it->second.slots.end()) {  // released meanwhile (a later host asked for fewer)
    fill_slots(self, svc, std::move(todo), next + 1, std::move(specs), rp);
    return;
  }
  const std::string key = sit->second;
  // A later host of this service gave the slot another spec: that call
  // builds it.
  if (key != instance_key(slot, specs[size_t(slot)])) {
    fill_slots(self, svc, std::move(todo), next + 1, std::move(specs), rp);
    return;
  }
  auto again = [self, svc, todo, next, specs, rp](const caf::error* failed) mutable {
    if (failed)
      rp.deliver(*failed);
    else
      fill_slots(self, svc, std::move(todo), next, std::move(specs), rp);
  };
  if (auto have = st.instances.find(key); have != st.instances.end()) {
    have->second.users.insert(svc);
    fill_slots(self, svc, std::move(todo), next + 1, std::move(specs), rp);
    return;
  }
  if (auto b = st.starting.find(key); b != st.starting.end()) {
    b->second.push_back(again);
    return;
  }
  st.starting[key];
  auto wake = [self, key](const caf::error* failed) {
    auto& st = self->state;
    auto w = st.starting.find(key);
    if (w == st.starting.end()) return;
    auto waiters = std::move(w->second);
    st.starting.erase(w);
    for (auto& f : waiters) f(failed);
  };
  self->request(st.spawner, caf::infinite, spawn_instance_atom::value, slot, specs[size_t(slot)])
      .then(
          [self, svc, todo, next, specs, rp, key, wake](hosted_instance& h) mutable {
            auto& st = self->state;
            // Wanted still by a service that asked for it?
            bool wanted = false;
            for (const auto& [id, hs] : st.services)
              for (const auto& [s, k] : hs.slots) wanted = wanted || k == key;
            if (!wanted) {
              caf::anon_send_exit(h.actor, caf::exit_reason::user_shutdown);
            } else {
              spdlog::info("node: instance {} is up ({} pages of {} tokens)", h.slot,
                           h.info.n_pages, h.info.page_size);
              self->monitor(h.actor);
              auto& si = st.instances[key];
              si.hosted = h;
              for (const auto& [id, hs] : st.services)
                for (const auto& [s, k] : hs.slots)
                  if (k == key) si.users.insert(id);
            }
            wake(nullptr);
            fill_slots(self, svc, std::move(todo), next + 1, std::move(specs), rp);
          },
          [rp, wake](caf::error& e) mutable {
            wake(&e);  // those waiting for the same build get its error
            rp.deliver(std::move(e));
          });
}

}  // namespace

node_control_actor spawn_node(caf::actor_system& sys, node_options opts) {
  auto impl = sys.spawn([opts](self_ptr self) -> node_impl::behavior_type {
    auto& st = self->state;
    st.opts = opts;
    // Spawned here and held by the state alone: a handle captured by this
    // closure lived as long as the node's actor object, which a pending
    // delayed message (reap, up to reap_after) keeps; the detached
    // spawner's thread, and the process's exit with it, waited that long.
    st.spawner = self->spawn<caf::detached + caf::linked>(spawner_behavior);
    // The instances it hosts end with it: nothing else holds them in this
    // process, and the actor system (so the process) waits for every actor
    // before it exits.  Exit messages are trapped for that alone.
    self->set_exit_handler([self](caf::exit_msg& m) {
      for (auto& [key, si] : self->state.instances) self->send_exit(si.hosted.actor, m.reason);
      self->state.instances.clear();
      for (auto& d : self->state.stages) self->send_exit(d, m.reason);
      self->state.stages.clear();
      self->state.services.clear();
      self->quit(m.reason);
    });
    // A lost link: its service's instances wait reap_after; a dead one leaves.
    self->set_down_handler([self](const caf::down_msg& dm) {
      auto& st = self->state;
      st.stages.erase(
          std::remove_if(st.stages.begin(), st.stages.end(),
                         [&](const device_actor& d) { return d.address() == dm.source; }),
          st.stages.end());
      for (auto it = st.peers.begin(); it != st.peers.end();)
        if (it->second.address() == dm.source) {
          spdlog::warn("node: lost the direct connection to peer {}", it->first);
          it = st.peers.erase(it);
        } else {
          ++it;
        }
      for (auto& [svc, hs] : st.services) {
        if (hs.link && dm.source == hs.link.address() && hs.link_alive) {
          hs.link_alive = false;
          spdlog::warn("node: lost service {} ({}); keeping its {} instances for {} s", svc,
                       self->system().render(dm.reason), hs.slots.size(),
                       st.opts.reap_after.count());
          self->delayed_send(self, st.opts.reap_after, reap_atom::value, svc);
        }
      }
      for (auto it = st.instances.begin(); it != st.instances.end();)
        if (it->second.hosted.actor.address() == dm.source) {
          spdlog::warn("node: instance {} ({} services) is down: {}", it->second.hosted.slot,
                       it->second.users.size(), self->system().render(dm.reason));
          it = st.instances.erase(it);
        } else {
          ++it;
        }
    });
    return {
        // A service's instances, one per spec: the ones it runs, else spawned now.
        [self](
            host_atom, const std::string& svc, node_link_actor link,
            const std::vector<instance_spec>& specs) -> caf::result<std::vector<hosted_instance>> {
          auto& st = self->state;
          if (st.leaving) return caf::make_error(caf::sec::runtime_error, "the node is stopping");
          auto& hs = st.services[svc];
          // A second link of the same service while the first lives: the
          // service reaches this node under two names (localhost and
          // 127.0.0.1); the second would take over the first's instances.
          if (hs.link && hs.link != link && hs.link_alive)
            return caf::make_error(caf::sec::invalid_argument,
                                   "this service reaches this node already (under another "
                                   "address); one link per node");
          // Watched again each time it comes back: a monitor fires once, and
          // a link whose connection dropped and returned must still be
          // noticed when its service dies later.
          if (hs.link != link || !hs.link_alive) {
            hs.link = link;
            self->monitor(link);
          }
          hs.link_alive = true;
          std::vector<int32_t> todo;
          for (size_t i = 0; i < specs.size(); ++i) {
            const auto slot = static_cast<int32_t>(i);
            const auto key = instance_key(slot, specs[i]);
            auto have = hs.slots.find(slot);
            // A different engine in this slot: the old one is released.
            if (have != hs.slots.end() && have->second != key) release(self, svc, have->second);
            hs.slots[slot] = key;
            if (auto si = st.instances.find(key); si != st.instances.end())
              si->second.users.insert(svc);
            else
              todo.push_back(slot);
          }
          for (auto it = hs.slots.begin(); it != hs.slots.end();)
            if (it->first >= static_cast<int32_t>(specs.size())) {
              release(self, svc, it->second);
              it = hs.slots.erase(it);
            } else {
              ++it;
            }
          spdlog::info(
              "node: service {} asks for {} instances ({} to start, the rest shared "
              "or its own already)",
              svc, specs.size(), todo.size());
          auto rp = self->make_response_promise<std::vector<hosted_instance>>();
          fill_slots(self, svc, std::move(todo), 0, specs, rp);
          return rp;
        },
        // The service's other nodes: connect to them directly.
        [self](peers_atom, const std::vector<std::string>& addresses) {
          connect_peers(self, addresses);
        },
        // A stage of a pipelined device elsewhere (issue 35), built on a
        // one-off builder (below); it ends with the pipeline that links to
        // it, or with the node.
        [self](spawn_stage_atom, stage_spec& spec) -> caf::result<device_actor> {
          if (self->state.leaving)
            return caf::make_error(caf::sec::invalid_argument,
                                   "this node is stopping: it takes no new pipeline stage");
          auto rp = self->make_response_promise<device_actor>();
          spdlog::info("node: loading a pipeline stage of {} (layers {}..{}, {} KV pages)",
                       spec.engine.model, spec.layer_first, spec.layer_end - 1, spec.n_pages);
          // A builder of its own: the instance spawner may be waiting for
          // this very stage (an instance of this node with a stage here), or
          // for one on a node that waits for this one.
          auto builder = self->spawn<caf::detached>(stage_builder);
          self->request(builder, caf::infinite, spawn_stage_atom::value, std::move(spec))
              .then(
                  [self, rp, builder](device_actor& d) mutable {
                    self->send_exit(builder, caf::exit_reason::user_shutdown);
                    self->monitor(d);
                    self->state.stages.push_back(d);
                    rp.deliver(std::move(d));
                  },
                  [self, rp, builder](caf::error& e) mutable {
                    self->send_exit(builder, caf::exit_reason::user_shutdown);
                    rp.deliver(std::move(e));
                  });
          return rp;
        },
        // What this machine offers, with the instances it hosts for all services.
        [self](resources_atom) {
          auto r = local_resources();
          for (const auto& [a, nid] : self->state.peers) r.peers.push_back(a);
          r.instances = static_cast<int32_t>(self->state.instances.size());
          return r;
        },
        // The node stops: services are told once; replies with sequences still held.
        [self](stop_atom) -> caf::result<int32_t> {
          auto& st = self->state;
          if (!st.leaving) {
            st.leaving = true;
            for (auto& [svc, hs] : st.services)
              if (hs.link_alive) self->send(hs.link, leaving_atom::value);
          }
          // The sequences still held, summed over every instance.
          std::vector<instance_actor> all;
          for (auto& [key, si] : st.instances) all.push_back(si.hosted.actor);
          if (all.empty()) return 0;
          auto rp = self->make_response_promise<int32_t>();
          auto total = std::make_shared<int32_t>(0);
          auto left = std::make_shared<size_t>(all.size());
          for (const auto& a : all)
            self->request(a, std::chrono::seconds(2), stats_atom::value)
                .then(
                    [rp, total, left](const instance_stats& s) mutable {
                      *total += s.waiting + s.running;
                      if (--*left == 0) rp.deliver(*total);
                    },
                    [rp, total, left](caf::error&) mutable {
                      if (--*left == 0) rp.deliver(*total);
                    });
          return rp;
        },
        // Its load for the registry: every instance's stats, summed.
        [self](node_load_atom) -> caf::result<node_load> {
          auto& st = self->state;
          auto sum = std::make_shared<node_load>();
          sum->instances = static_cast<int32_t>(st.instances.size());
          if (st.instances.empty()) return *sum;
          auto rp = self->make_response_promise<node_load>();
          auto left = std::make_shared<size_t>(st.instances.size());
          auto store_seen = std::make_shared<bool>(false);
          for (const auto& [key, si] : st.instances)
            self->request(si.hosted.actor, std::chrono::milliseconds(400), stats_atom::value)
                .then(
                    [rp, sum, left, store_seen](const instance_stats& s) mutable {
                      add_instance_load(*sum, s, *store_seen);
                      if (--*left == 0) rp.deliver(*sum);
                    },
                    [rp, sum, left](caf::error&) mutable {
                      if (--*left == 0) rp.deliver(*sum);
                    });
          return rp;
        },
        // A lost service did not come back in time: its instances stop.
        [self](reap_atom, const std::string& svc) {
          auto& st = self->state;
          auto it = st.services.find(svc);
          if (it == st.services.end() || it->second.link_alive) return;
          spdlog::warn(
              "node: service {} did not come back; releasing its {} instances (those "
              "no other service uses stop)",
              svc, it->second.slots.size());
          const auto slots = std::move(it->second.slots);
          st.services.erase(it);
          for (const auto& [slot, key] : slots) release(self, svc, key);
        },
    };
  });
  return caf::actor_cast<node_control_actor>(impl);
}

}  // namespace troupe
