#pragma once
// The monitor protocol (docs/architecture.md §2 "The actors", issue 11 item
// 3): request actors report first tokens (with the router's TTFT prediction)
// and finished requests' TPOT; the router reports each instance's steps and
// asks, once per window, for the figures its role switching needs.
#include <caf/all.hpp>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/instance.hpp"
#include "runtime/service/service_monitor.hpp"

namespace troupe {

// One window's figures: per instance, and the placement counts.
struct monitor_report {
  std::vector<instance_window> instances;
  int32_t prefills = 0;
  int32_t unmet_prefills = 0;  // predicted to miss the TTFT target
  double ttft_mape = 0;        // the TTFT predictor's mean absolute percentage error
  uint64_t ttft_predictions = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, instance_window& x) {
  return f(caf::meta::type_name("instance_window"), x.instance, x.ttft_ms, x.tpot_ms,
           x.token_interval_ms, x.busy, x.ttft_samples, x.steps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, monitor_report& x) {
  return f(caf::meta::type_name("monitor_report"), x.instances, x.prefills, x.unmet_prefills,
           x.ttft_mape, x.ttft_predictions);
}

// ttft:   (instance, predicted ms, measured ms) a request's first token.
// tpot:   (instance, ms) a finished request's time per output token.
// steps:  (instance, steps) forward passes not reported before.
// placed: (met) a prefill placement; false: nothing was predicted to meet TTFT.
// report: the window's figures; starts the next window's placement counts.
// peek:   the same without starting a new window (admin, metrics).
using monitor_actor =
    caf::typed_actor<caf::reacts_to<ttft_atom, uint64_t, double, double>,
                     caf::reacts_to<tpot_atom, uint64_t, double>,
                     caf::reacts_to<steps_atom, uint64_t, std::vector<step_timing>>,
                     caf::reacts_to<placed_atom, bool>,
                     caf::replies_to<report_atom>::with<monitor_report>,
                     caf::replies_to<peek_atom>::with<monitor_report>>;

}  // namespace troupe
