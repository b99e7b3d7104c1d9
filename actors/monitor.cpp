#include "actors/monitor.hpp"

#include <chrono>

namespace troupe {

namespace {

struct monitor_state {
  monitor_state() = default;
  std::unique_ptr<service_monitor> mon;
  std::chrono::steady_clock::time_point born = std::chrono::steady_clock::now();
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - born).count();
  }
  static inline const char* name = "monitor";
};

using self_ptr = monitor_actor::stateful_pointer<monitor_state>;

monitor_report make_report(monitor_state& st, pd_window w) {
  monitor_report r;
  r.instances = st.mon->windows(st.now());
  r.prefills = w.prefills;
  r.unmet_prefills = w.unmet_prefills;
  r.ttft_mape = st.mon->ttft_mape();
  r.ttft_predictions = st.mon->ttft_predictions();
  return r;
}

}  // namespace

monitor_actor spawn_monitor(caf::actor_system& sys, double window_s) {
  return sys.spawn([window_s](self_ptr self) -> monitor_actor::behavior_type {
    self->state.mon = std::make_unique<service_monitor>(window_s);
    return {
        // A request's first token: the router's prediction and the measured time.
        [self](ttft_atom, uint64_t instance, double predicted, double actual) {
          auto& st = self->state;
          st.mon->ttft(instance, predicted, actual, st.now());
        },
        // A finished request's time per output token.
        [self](tpot_atom, uint64_t instance, double ms) {
          auto& st = self->state;
          st.mon->tpot(instance, ms, st.now());
        },
        // An instance's forward passes not reported before.
        [self](steps_atom, uint64_t instance, const std::vector<step_timing>& steps) {
          // They arrive with the router's poll: all end about now.
          auto& st = self->state;
          for (const auto& t : steps) st.mon->step(instance, t.rows, t.decode_rows, t.ms, st.now());
        },
        // A prefill placement; met false: nothing was predicted to meet TTFT.
        [self](placed_atom, bool met) { self->state.mon->placed(met); },
        // The window's figures; the next window's placement counts start.
        [self](report_atom) {
          auto& st = self->state;
          return make_report(st, st.mon->take_window());
        },
        // The same, without starting a new window (admin, metrics).
        [self](peek_atom) {
          auto& st = self->state;
          return make_report(st, st.mon->current_window());
        },
    };
  });
}

}  // namespace troupe
