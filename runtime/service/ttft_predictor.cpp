#include "runtime/service/ttft_predictor.hpp"

#include <algorithm>
#include <cmath>

namespace troupe {

namespace {

// Features scaled to similar sizes (hundreds of rows, about 1e5 of
// attention work), so one starting covariance suits them all.
using step_features = double[4];

void features(double p, double d, double c, step_features& x) {
  x[0] = 1.0;
  x[1] = p / 100.0;
  x[2] = d / 100.0;
  x[3] = c / 1e5;
}

}  // namespace

step_time_model::step_time_model(double forgetting) : fit_(forgetting) {}

void step_time_model::observe(int32_t prefill_rows, int32_t decode_rows, int64_t context,
                              double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  step_features x;
  features(prefill_rows, decode_rows, static_cast<double>(context), x);
  fit_.observe(x, ms);
}

double step_time_model::step_ms(double prefill_rows, double decode_rows, double context) const {
  step_features x;
  features(prefill_rows, decode_rows, context, x);
  return std::max(0.0, fit_.predict(x));
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
  // The instance has worked on its queue since the view was taken: as
  // long as the view is old, up to all of it.  (Placements counted since
  // the poll are in the queue too; taking only the polled part off was
  // worse in the simulator, 28% off against 12% on bursty arrivals: in a
  // burst they arrive just after the poll and run from then.)  A view
  // older than a few polls says nothing of now: no correction.
  if (l.age_ms > 0 && l.age_ms <= k_stale_view_ms && queued > 0) {
    pd_load seen = l;
    seen.age_ms = 0;
    ms -= std::min(l.age_ms, predict_ttft_ms(seen, 0, m));
  }
  return std::max(0.0, ms);
}

}  // namespace troupe
