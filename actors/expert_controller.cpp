#include "actors/expert_controller.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <set>

#include "runtime/device/expert_placement.hpp"

namespace troupe {

namespace {

// One engine's device actor and what it last reported.
struct engine {
  device_actor device;
  std::vector<double> busy;  // [expert device]
  uint64_t epoch = 0;        // of the placement it uses
};

struct controller_state {
  std::vector<engine> engines;
  expert_controller_config cfg;
  int n_layers = 0, n_experts = 0, expert_devices = 0;
  std::vector<std::vector<int64_t>> window;  // [layer][expert], since the last swap
  std::vector<layer_experts> layouts;        // [layer], in use
  uint64_t layouts_epoch = 0;                // the placement `layouts` is (never an aborted one)
  std::set<caf::actor_addr> aligning;        // devices being brought to the placement
  uint64_t epoch = 0, swaps = 0, aborted = 0, aligned = 0;
  double last_before = 0, last_after = 0;
  std::string phase = "idle";
  bool reading = false;
  // When the timer's next tick is due: a tick well before it (sent from
  // outside) reads the loads without starting a second timer.
  std::chrono::steady_clock::time_point next_tick;
};

using self_ptr = expert_controller_actor::stateful_pointer<controller_state>;

engine* find(controller_state& st, const device_actor& d) {
  for (auto& e : st.engines)
    if (e.device == d) return &e;
  return nullptr;
}
constexpr auto k_device_timeout = std::chrono::seconds(30);

double worst_imbalance(const std::vector<layer_experts>& layouts,
                       const std::vector<std::vector<int64_t>>& window) {
  double worst = 1.0;
  for (size_t l = 0; l < layouts.size() && l < window.size(); ++l)
    worst = std::max(worst, balance_of(layouts[l], window[l]).max_over_mean);
  return worst;
}

// Sends `msg` to every device; `done(ok)` once all have answered.
template <class Msg, class Arg>
void to_all(self_ptr self, Msg msg, const Arg& arg, std::function<void(bool)> done) {
  auto left = std::make_shared<size_t>(self->state.engines.size());
  auto ok = std::make_shared<bool>(true);
  for (const auto& e : self->state.engines)
    self->request(e.device, k_device_timeout, msg, arg)
        .then(
            [=](uint64_t) {
              if (--*left == 0) done(*ok);
            },
            [=](caf::error&) {
              *ok = false;
              if (--*left == 0) done(*ok);
            });
}

void abort_swap(self_ptr self, uint64_t epoch) {
  for (const auto& e : self->state.engines)
    self->request(e.device, k_device_timeout, expert_abort_atom::value, epoch).then([](uint64_t) {
    });
  ++self->state.aborted;
  self->state.phase = "idle";
}

// Phase one (prepare everywhere), then phase two (commit everywhere).
void swap_to(self_ptr self, std::vector<layer_experts> plan) {
  auto& st = self->state;
  const uint64_t epoch = ++st.epoch;
  const double before = worst_imbalance(st.layouts, st.window);
  const double after = worst_imbalance(plan, st.window);
  st.phase = "preparing";
  expert_plan p{epoch, plan};
  to_all(self, expert_prepare_atom::value, p, [=](bool ready) {
    if (!ready) return abort_swap(self, epoch);
    self->state.phase = "committing";
    to_all(self, expert_commit_atom::value, epoch, [=](bool committed) {
      auto& s = self->state;
      // A commit is applied by the devices that answered; a failed one
      // leaves the controller's view as it was (the next read corrects it).
      if (committed) {
        s.layouts = plan;
        s.layouts_epoch = epoch;
        ++s.swaps;
        s.last_before = before;
        s.last_after = after;
        for (auto& w : s.window) std::fill(w.begin(), w.end(), 0);
      } else {
        ++s.aborted;
      }
      s.phase = "idle";
    });
  });
}

// Brings engines whose placement is not the controller's to it, one by one
// (a swap's two phases, for that device alone).  A swap decided right after
// is safe: its prepare reaches the device after this one, so this commit
// fails harmlessly and the swap's commits.
void align_stale(self_ptr self) {
  auto& st = self->state;
  // Against the placement in use: st.epoch also counts aborted plans,
  // which no engine runs.
  if (st.layouts_epoch == 0 || st.layouts.empty()) return;
  for (const auto& e : st.engines) {
    const device_actor d = e.device;
    if (e.epoch == st.layouts_epoch || !st.aligning.insert(d.address()).second) continue;
    const uint64_t epoch = st.layouts_epoch;
    auto done = [self, d] { self->state.aligning.erase(d.address()); };
    self->request(d, k_device_timeout, expert_prepare_atom::value, expert_plan{epoch, st.layouts})
        .then(
            [self, d, epoch, done](uint64_t) {
              self->request(d, k_device_timeout, expert_commit_atom::value, epoch)
                  .then(
                      [self, done](uint64_t) {
                        ++self->state.aligned;
                        done();
                      },
                      [done](caf::error&) { done(); });
            },
            [done](caf::error&) { done(); });
  }
}

void decide(self_ptr self) {
  auto& st = self->state;
  if (st.n_experts == 0 || st.expert_devices < 2) return;
  align_stale(self);
  const int slots = (st.n_experts + st.expert_devices - 1) / st.expert_devices + st.cfg.spare_slots;
  std::vector<layer_experts> plan = st.layouts;
  bool any = false;
  for (int l = 0; l < st.n_layers; ++l) {
    auto planned = plan_expert_layout(st.window[l], st.expert_devices, slots);
    if (worth_rebalancing(st.layouts[l], planned, st.window[l], st.cfg.threshold, st.cfg.min_gain,
                          st.cfg.min_tokens)) {
      plan[l] = std::move(planned);
      any = true;
    }
  }
  if (any) swap_to(self, std::move(plan));
}

void merge(controller_state& st, engine& en, const expert_stats& s) {
  if (s.n_experts == 0) return;
  if (st.n_experts == 0) {
    st.n_layers = s.n_layers;
    st.n_experts = s.n_experts;
    st.expert_devices = s.devices;
    st.window.assign(s.n_layers, std::vector<int64_t>(s.n_experts, 0));
  }
  if (st.layouts.empty() || s.epoch == st.epoch) {
    st.layouts = s.layouts;
    st.layouts_epoch = s.epoch;
  }
  en.epoch = s.epoch;
  for (int l = 0; l < s.n_layers && l < st.n_layers; ++l)
    for (int e = 0; e < s.n_experts && e < st.n_experts; ++e)
      st.window[l][e] += s.tokens[static_cast<size_t>(l) * s.n_experts + e];
  en.busy = s.busy_s;
}

void read_loads(self_ptr self) {
  auto& st = self->state;
  if (st.reading || st.phase != "idle" || st.engines.empty()) return;
  st.reading = true;
  auto left = std::make_shared<size_t>(st.engines.size());
  for (const auto& e : st.engines) {
    auto finish = [self, left] {
      if (--*left > 0) return;
      self->state.reading = false;
      decide(self);
    };
    const device_actor d = e.device;
    self->request(d, k_device_timeout, expert_stats_atom::value)
        .then(
            [self, d, finish](const expert_stats& s) {
              // Found again: an engine may have left meanwhile.
              if (auto* en = find(self->state, d)) merge(self->state, *en, s);
              finish();
            },
            [finish](caf::error&) { finish(); });
  }
}

expert_status status_of(const controller_state& st) {
  expert_status out;
  out.devices = st.expert_devices;
  out.engines = static_cast<int32_t>(st.engines.size());
  for (int l = 0; l < st.n_layers; ++l) {
    expert_layer_status ls;
    ls.tokens = st.window[l];
    if (static_cast<size_t>(l) < st.layouts.size()) {
      ls.layout = st.layouts[l];
      const auto b = balance_of(ls.layout, ls.tokens);
      ls.device_load = b.device_load;
      ls.imbalance = b.max_over_mean;
    }
    out.layers.push_back(std::move(ls));
  }
  for (const auto& e : st.engines) {
    if (out.busy_s.size() < e.busy.size()) out.busy_s.resize(e.busy.size(), 0.0);
    for (size_t d = 0; d < e.busy.size(); ++d) out.busy_s[d] += e.busy[d];
    out.engine_epochs.push_back(e.epoch);
  }
  out.epoch = st.epoch;
  out.swaps = st.swaps;
  out.aborted = st.aborted;
  out.last_before = st.last_before;
  out.last_after = st.last_after;
  out.phase = st.phase;
  out.aligned = st.aligned;
  return out;
}

expert_controller_actor::behavior_type controller(self_ptr self, std::vector<device_actor> devices,
                                                  expert_controller_config cfg) {
  auto& st = self->state;
  st.cfg = cfg;
  for (auto& d : devices) {
    self->monitor(d);
    st.engines.push_back(engine{std::move(d), {}, 0});
  }
  // A device that went down leaves: a swap needs every device's answer.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& en = self->state.engines;
    en.erase(std::remove_if(en.begin(), en.end(),
                            [&](const engine& e) { return e.device.address() == dm.source; }),
             en.end());
  });
  self->send(self, tick_atom::value);
  return {
      // One more engine's device: a node's instance that joined the router.
      [self](expert_add_atom, const device_actor& d) {
        auto& s = self->state;
        if (find(s, d)) return;
        // It starts on the initial placement; the next read finds it behind
        // and aligns it.
        s.engines.push_back(engine{d, {}, 0});
        self->monitor(d);
      },
      // The controller's view: loads, placement, swaps.
      [self](expert_status_atom) { return status_of(self->state); },
      // Read the loads and decide; a tick on schedule also sets the next one.
      [self](tick_atom) {
        read_loads(self);
        auto& st = self->state;
        const auto now = std::chrono::steady_clock::now();
        const auto every = std::chrono::milliseconds(std::max(10, st.cfg.interval_ms));
        // Half an interval of slack, should the timer fire a little early.
        if (now < st.next_tick - every / 2) return;
        st.next_tick = now + every;
        self->delayed_send(self, every, tick_atom::value);
      },
  };
}

}  // namespace

expert_controller_actor spawn_expert_controller(caf::actor_system& sys,
                                                std::vector<device_actor> devices,
                                                expert_controller_config cfg) {
  return sys.spawn(controller, std::move(devices), cfg);
}

}  // namespace troupe
