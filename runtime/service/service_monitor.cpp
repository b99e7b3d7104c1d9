#include "runtime/service/service_monitor.hpp"

#include <algorithm>
#include <cmath>

namespace troupe {

service_monitor::service_monitor(double window_s, size_t error_samples)
    : window_s_(window_s), max_errors_(error_samples) {}

void service_monitor::trim(std::deque<sample>& d, double now_s) const {
  while (!d.empty() && d.front().t < now_s - window_s_) d.pop_front();
}

void service_monitor::ttft(uint64_t instance, double predicted_ms, double actual_ms, double now_s) {
  auto& d = ttft_[instance];
  d.push_back({now_s, actual_ms, predicted_ms, 1});
  trim(d, now_s);
  // Predictions of 0 mean the model had no sample yet: not an error of it.
  if (predicted_ms > 0 && actual_ms > 0) {
    errors_.push_back(std::abs(predicted_ms - actual_ms) / actual_ms);
    if (errors_.size() > max_errors_) errors_.pop_front();
  }
}

void service_monitor::tpot(uint64_t instance, double ms, double now_s) {
  auto& d = tpot_[instance];
  d.push_back({now_s, ms, 0, 1});
  trim(d, now_s);
}

void service_monitor::step(uint64_t instance, int32_t rows, int32_t decode_rows, double ms,
                           double now_s) {
  auto& d = steps_[instance];
  d.push_back({now_s, ms, double(rows), decode_rows});
  trim(d, now_s);
}

void service_monitor::placed(bool meets_target) {
  ++counts_.prefills;
  if (!meets_target) ++counts_.unmet_prefills;
}

pd_window service_monitor::take_window() {
  pd_window w = counts_;
  counts_ = {};
  return w;
}

instance_window service_monitor::window(uint64_t instance, double now_s) const {
  instance_window w;
  w.instance = instance;
  auto mean_of = [&](std::map<uint64_t, std::deque<sample>>& m, int32_t* count) {
    auto it = m.find(instance);
    if (it == m.end()) return 0.0;
    trim(it->second, now_s);
    double sum = 0;
    for (const auto& s : it->second) sum += s.a;
    if (count) *count = int32_t(it->second.size());
    return it->second.empty() ? 0.0 : sum / double(it->second.size());
  };
  w.ttft_ms = mean_of(ttft_, &w.ttft_samples);
  w.tpot_ms = mean_of(tpot_, nullptr);
  if (auto it = steps_.find(instance); it != steps_.end()) {
    trim(it->second, now_s);
    // Each decode row waits its step's time for its token: the interval
    // is weighted by them, so one long prefill step beside a single
    // decode row counts for that row, as a TPOT would, not for a whole
    // batch's.
    double busy = 0, decode_row_ms = 0;
    int64_t decode_rows = 0;
    for (const auto& s : it->second) {
      busy += s.a;
      decode_row_ms += s.a * double(s.n);
      decode_rows += s.n;
    }
    w.steps = int32_t(it->second.size());
    w.busy = std::min(1.0, busy / (window_s_ * 1000.0));
    w.token_interval_ms = decode_rows > 0 ? decode_row_ms / double(decode_rows) : 0;
  }
  return w;
}

std::vector<instance_window> service_monitor::windows(double now_s) const {
  std::vector<uint64_t> ids;
  for (const auto* m : {&ttft_, &tpot_, &steps_})
    for (const auto& [id, d] : *m) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<instance_window> out;
  for (uint64_t id : ids) out.push_back(window(id, now_s));
  return out;
}

double service_monitor::ttft_mape() const {
  if (errors_.empty()) return 0;
  double sum = 0;
  for (double e : errors_) sum += e;
  return sum / double(errors_.size());
}

}  // namespace troupe
