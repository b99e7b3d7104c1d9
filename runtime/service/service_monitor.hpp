#pragma once
// The monitor's figures (issue 11 item 3; docs/architecture.md
// §2 "The actors"): per instance, rolling TTFT, TPOT, token interval (decode
// step time), device busy share, queue, running tokens and KV use over a time
// window, and the TTFT predictor's error.  Plain data in, plain data out: the
// monitor actor wraps one, and the cluster simulator uses another the same
// way.
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "runtime/service/pd_policy.hpp"

namespace troupe {

struct instance_window {
  uint64_t instance = 0;
  double ttft_ms = 0;            // mean over the window's first tokens (0: none)
  double tpot_ms = 0;            // mean over the window's finished requests
  double token_interval_ms = 0;  // mean step time a decode row waited (weighted by rows)
  double busy = 0;               // share of the window its device computed
  int32_t ttft_samples = 0;
  int32_t steps = 0;
};

class service_monitor {
 public:
  explicit service_monitor(double window_s = 1.0, size_t error_samples = 1024);

  // A request's first token on `instance`: the router's prediction and what it was.
  void ttft(uint64_t instance, double predicted_ms, double actual_ms, double now_s);
  void tpot(uint64_t instance, double ms, double now_s);
  // One forward pass of `instance`, ending at now_s.
  void step(uint64_t instance, int32_t rows, int32_t decode_rows, double ms, double now_s);
  // A prefill placement and whether an instance was predicted to meet TTFT.
  void placed(bool meets_target);

  // The window's placement counts, reset for the next window.
  pd_window take_window();
  const pd_window& current_window() const { return counts_; }
  instance_window window(uint64_t instance, double now_s) const;
  std::vector<instance_window> windows(double now_s) const;

  // Mean absolute percentage error of the TTFT predictions kept, and how many.
  double ttft_mape() const;
  size_t ttft_predictions() const { return errors_.size(); }
  double window_s() const { return window_s_; }

 private:
  struct sample {
    double t, a, b;
    int32_t n;
  };
  void trim(std::deque<sample>& d, double now_s) const;
  double window_s_;
  size_t max_errors_;
  // Mutable: reading a window drops samples older than it.
  mutable std::map<uint64_t, std::deque<sample>> ttft_, tpot_, steps_;
  std::deque<double> errors_;  // |predicted - actual| / actual
  pd_window counts_;
};

}  // namespace troupe
