#include "runtime/service/ttft_predictor.hpp"

#include <algorithm>
#include <cmath>

namespace troupe {

namespace {

// Features scaled to similar sizes (hundreds of rows, about 1e5 of
// attention work), so one starting covariance suits them all.
void features(double p, double d, double c, double x[4]) {
  x[0] = 1.0;
  x[1] = p / 100.0;
  x[2] = d / 100.0;
  x[3] = c / 1e5;
}

}  // namespace

step_time_model::step_time_model(double forgetting) : lambda_(forgetting) {
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) p_[i][j] = i == j ? 1e6 : 0;
}

void step_time_model::observe(int32_t prefill_rows, int32_t decode_rows, int64_t context,
                              double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  double x[k];
  features(prefill_rows, decode_rows, static_cast<double>(context), x);
  double px[k] = {0, 0, 0, 0};
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) px[i] += p_[i][j] * x[j];
  double denom = lambda_;
  for (int i = 0; i < k; ++i) denom += x[i] * px[i];
  double err = ms;
  for (int i = 0; i < k; ++i) err -= theta_[i] * x[i];
  for (int i = 0; i < k; ++i) theta_[i] += px[i] / denom * err;
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) p_[i][j] = (p_[i][j] - px[i] * px[j] / denom) / lambda_;
  // As prefill_model: a steady load repeats the same step shapes, and
  // forgetting then grows P without bound (RLS windup); its trace is
  // capped at the starting size.
  double trace = 0;
  for (int i = 0; i < k; ++i) trace += p_[i][i];
  if (trace > k * 1e6 || !std::isfinite(trace)) {
    const bool finite = std::isfinite(trace);
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j)
        p_[i][j] = finite ? p_[i][j] * (k * 1e6 / trace) : (i == j ? 1e6 : 0);
  }
  ++samples_;
}

double step_time_model::step_ms(double prefill_rows, double decode_rows, double context) const {
  double x[k];
  features(prefill_rows, decode_rows, context, x);
  double ms = 0;
  for (int i = 0; i < k; ++i) ms += theta_[i] * x[i];
  return std::max(0.0, ms);
}

double predict_ttft_ms(const pd_load& l, int32_t prompt_tokens, const ttft_model& m) {
  if (m.steps.samples() == 0) return 0;
  const double prompt = std::max(0, prompt_tokens);
  const double queued = static_cast<double>(l.queued_prefill_tokens());
  const double work = queued + prompt;
  const double decode = std::max(0, l.decoding);
  const double held = static_cast<double>(std::max<int64_t>(0, l.running_tokens));
  const double budget = std::max(1.0, m.step_rows - decode);
  const double steps =
      std::max({1.0, std::ceil(work / budget), std::ceil(prompt / std::max(1, m.chunk_rows))});
  // The prefills' attention work: each remaining prompt's rows attend to
  // the positions before them (the queued ones' done part is not known:
  // counted from 0).
  double attention = prompt * (prompt + 1) / 2;
  for (int32_t q : l.queued_prefills) attention += double(q) * (double(q) + 1) / 2;
  // Linear in its rows, the steps sum to `steps` steps of the mean shape.
  double ms = steps * m.steps.step_ms(work / steps, decode, held + attention / steps);
  // The step running when the prompt arrives ends first: half of one on
  // average, where the instance has work.
  if (decode > 0 || queued > 0) ms += 0.5 * m.steps.step_ms(std::min(queued, budget), decode, held);
  // What the view showed queued ahead has been worked on since it was
  // taken: as long as the view is old, up to all of it.
  if (l.age_ms > 0 && queued > 0) {
    pd_load ahead = l;
    ahead.age_ms = 0;
    ms -= std::min(l.age_ms, predict_ttft_ms(ahead, 0, m));
  }
  return std::max(0.0, ms);
}

}  // namespace troupe
