#include "sim/static_batch_sim.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace troupe {

namespace {

// A static batch's time: one prefill of every prompt padded to the
// longest, then one decode step per token of the longest output, every
// row computed (the padding of static batching).
double batch_ms(const std::vector<const static_request*>& b, const cost_model& cost) {
  int32_t prompt = 0, out = 0;
  for (const auto* r : b)
    prompt = std::max(prompt, r->prompt_tokens), out = std::max(out, r->output_tokens);
  const int32_t n = static_cast<int32_t>(b.size());
  double ms = cost.step_ms(n * prompt, 0, int64_t(n) * prompt * (prompt + 1) / 2);
  for (int32_t k = 1; k < out; ++k) ms += cost.step_ms(n, n, int64_t(n) * (prompt + k));
  return ms;
}

// The scheduler plans over the queue's first kWindowBatches batches' worth
// of requests by the order's own key (arrival, predicted length or
// deadline), as a real one looks at a bounded waiting window: planning
// (first fit) over the whole of an overloaded queue at every batch was
// quadratic in it per batch; now each batch costs time linear in the
// queue (the window's selection, the candidates, the removal).  The first
// batch of fifo, length and slo is the same either way.
constexpr int32_t kWindowBatches = 32;

void trim_to_window(std::vector<batch_candidate>& c, batch_order order, int32_t window) {
  if (int32_t(c.size()) <= window || order == batch_order::fifo) {
    if (int32_t(c.size()) > window) c.resize(size_t(window));  // arrival order already
    return;
  }
  auto key = [order](const batch_candidate& x) {
    return order == batch_order::length ? double(x.predicted_tokens) : x.slo_s;
  };
  // The first `window` by (key, arrival), in linear time.
  std::nth_element(c.begin(), c.begin() + window, c.end(),
                   [&](const batch_candidate& a, const batch_candidate& b) {
                     return key(a) != key(b) ? key(a) < key(b) : a.id < b.id;
                   });
  c.resize(size_t(window));
  // Back to arrival order (ids are arrival indices): the policies sort
  // stably, so ties keep arriving first-come.
  std::sort(c.begin(), c.end(),
            [](const batch_candidate& a, const batch_candidate& b) { return a.id < b.id; });
}

}  // namespace

static_batch_result run_static_batches(const std::vector<static_request>& reqs,
                                       const static_batch_config& cfg, const cost_model& cost) {
  static_batch_result res;
  output_length_predictor predictor;
  std::vector<size_t> queue;                   // indices into reqs, arrival order
  std::vector<int> predicted(reqs.size(), 0);  // by request: the bucket predicted at arrival
  std::vector<double> latencies;
  std::vector<char> done(reqs.size(), 0);
  double now = reqs.empty() ? 0 : reqs.front().arrival_s, first = now, end = now;
  uint64_t violated = 0, useful = 0, computed_rows = 0;
  size_t next = 0;
  while (next < reqs.size() || !queue.empty()) {
    if (queue.empty() && next < reqs.size()) now = std::max(now, reqs[next].arrival_s);
    for (; next < reqs.size() && reqs[next].arrival_s <= now; ++next) {
      queue.push_back(next);
      predicted[next] =
          cfg.oracle ? length_bucket(reqs[next].output_tokens) : predictor.predict(reqs[next].cls);
    }
    std::vector<batch_candidate> cands;
    for (size_t i : queue) {
      const auto& r = reqs[i];
      const int32_t tokens = cfg.oracle ? r.output_tokens : bucket_tokens(predicted[i]);
      cands.push_back({i, r.arrival_s + r.slo_s - now, tokens});
    }
    const int32_t max_batch = std::max(1, cfg.odbs.max_batch);
    trim_to_window(cands, cfg.order,
                   std::max(max_batch, std::min(max_batch * kWindowBatches, 4096)));
    const auto batches = plan_batches(cands, cfg.order, cfg.odbs);
    if (batches.empty()) break;  // nothing queued (only with arrival times that are not numbers)
    std::vector<const static_request*> batch;
    for (uint64_t i : batches.front()) batch.push_back(&reqs[i]);
    now += batch_ms(batch, cost) / 1000.0;
    int32_t longest = 0;
    for (uint64_t i : batches.front()) {
      const auto& r = reqs[i];
      longest = std::max(longest, r.output_tokens);
      const double lat = now - r.arrival_s;
      latencies.push_back(lat);
      if (lat > r.slo_s) ++violated;
      useful += r.output_tokens;
      predictor.observe(r.cls, predicted[i], r.output_tokens);
    }
    computed_rows += uint64_t(longest) * batch.size();
    ++res.batches;
    for (uint64_t i : batches.front()) done[i] = 1;
    queue.erase(std::remove_if(queue.begin(), queue.end(), [&](size_t i) { return done[i] != 0; }),
                queue.end());
    end = now;
  }
  res.completed = latencies.size();
  if (res.completed == 0) return res;
  res.violation_rate = double(violated) / res.completed;
  double sum = 0;
  for (double l : latencies) sum += l;
  res.mean_latency_s = sum / res.completed;
  std::sort(latencies.begin(), latencies.end());
  res.p99_latency_s = latencies[std::min(latencies.size() - 1, latencies.size() * 99 / 100)];
  res.output_tokens_per_s = end > first ? useful / (end - first) : 0;
  res.padding_share = computed_rows ? 1.0 - double(useful) / computed_rows : 0;
  res.bucket_accuracy = predictor.bucket_accuracy();
  return res;
}

std::vector<static_request> static_workload(uint64_t n, double rate, double slo_lo_s,
                                            double slo_hi_s, uint64_t seed) {
  if (!(rate > 0) || !std::isfinite(rate) || !(slo_lo_s > 0) || !(slo_hi_s >= slo_lo_s) ||
      !std::isfinite(slo_hi_s))
    throw std::invalid_argument(
        "static workload: the rate and the deadlines must be positive numbers, min <= max");
  static const char* classes[] = {"short", "medium", "long", "xlong"};
  // Each class's lengths fill one predictor bucket, one request in ten
  // the bucket above (the predictor cannot know which).
  static const int32_t lo[] = {8, 64, 256, 1024};
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::uniform_int_distribution<int> cls(0, 3), prompt(32, 255);
  std::uniform_real_distribution<double> slo(slo_lo_s, slo_hi_s), coin(0, 1);
  std::vector<static_request> out;
  double t = 0;
  for (uint64_t i = 0; i < n; ++i) {
    t += gap(rng);
    const int c = cls(rng);
    static_request r;
    r.arrival_s = t;
    r.prompt_tokens = prompt(rng);
    const int32_t base = coin(rng) < 0.1 ? 2 * lo[c] : lo[c];
    r.output_tokens = std::uniform_int_distribution<int32_t>(base, 2 * base - 1)(rng);
    r.cls = classes[c];
    r.slo_s = slo(rng);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace troupe
