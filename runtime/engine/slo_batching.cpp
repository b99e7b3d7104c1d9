#include "runtime/engine/slo_batching.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe {

int length_bucket(int64_t tokens) {
  if (tokens < 8) return 0;
  int b = 0;
  for (int64_t upper = 8; tokens >= upper && b < kLengthBuckets - 1; upper *= 2) ++b;
  return b;
}

int32_t bucket_tokens(int bucket) {
  bucket = std::clamp(bucket, 0, kLengthBuckets - 1);
  return int32_t(8) << bucket;  // 8, 16, ..., 2048, and 4096 for the last
}

int output_length_predictor::mode_of(const counts& c) {
  int best = -1;
  for (int b = 0; b < kLengthBuckets; ++b)
    if (c[b] > 0 && (best < 0 || c[b] >= c[best])) best = b;  // ties: the longer
  return best;
}

int output_length_predictor::predict(const std::string& cls, int fallback) const {
  if (auto it = by_class_.find(cls); it != by_class_.end()) {
    const int m = mode_of(it->second);
    if (m >= 0) return m;
  }
  const int m = mode_of(all_);
  return m >= 0 ? m : std::clamp(fallback, 0, kLengthBuckets - 1);
}

void output_length_predictor::observe(const std::string& cls, int predicted_bucket,
                                      int64_t actual_tokens) {
  const int b = length_bucket(actual_tokens);
  ++observed_;
  if (b == predicted_bucket) ++correct_;
  // Classes come from clients: past the cap a new class teaches only the
  // global counts (memory stays bounded whatever names arrive).
  auto it = by_class_.find(cls);
  if (it == by_class_.end() && by_class_.size() < kMaxLengthClasses)
    it = by_class_.emplace(cls, counts{}).first;
  if (it != by_class_.end()) ++it->second[b];
  ++all_[b];
}

const char* to_string(batch_order o) {
  switch (o) {
    case batch_order::fifo:
      return "fifo";
    case batch_order::length:
      return "length";
    case batch_order::slo:
      return "slo";
    case batch_order::slo_odbs:
      return "slo-odbs";
  }
  return "?";
}

std::optional<batch_order> parse_batch_order(std::string_view name) {
  for (auto o : {batch_order::fifo, batch_order::length, batch_order::slo, batch_order::slo_odbs})
    if (name == to_string(o)) return o;
  return std::nullopt;
}

namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::vector<std::vector<uint64_t>> cut(const std::vector<const batch_candidate*>& order,
                                       int32_t max_batch) {
  std::vector<std::vector<uint64_t>> out;
  for (const auto* c : order) {
    if (out.empty() || int32_t(out.back().size()) >= max_batch) out.emplace_back();
    out.back().push_back(c->id);
  }
  return out;
}

}  // namespace

std::vector<std::vector<uint64_t>> plan_batches(const std::vector<batch_candidate>& queue,
                                                batch_order order, const odbs_params& p) {
  const int32_t max_batch = std::max(1, p.max_batch);
  std::vector<const batch_candidate*> q;
  for (const auto& c : queue) q.push_back(&c);
  // Stable sorts: equal keys keep arrival order.
  auto by_slo = [](auto* a, auto* b) { return a->slo_s < b->slo_s; };
  switch (order) {
    case batch_order::fifo:
      return cut(q, max_batch);
    case batch_order::length:
      std::stable_sort(q.begin(), q.end(),
                       [](auto* a, auto* b) { return a->predicted_tokens < b->predicted_tokens; });
      return cut(q, max_batch);
    case batch_order::slo:
      std::stable_sort(q.begin(), q.end(), by_slo);
      return cut(q, max_batch);
    case batch_order::slo_odbs:
      break;
  }
  std::stable_sort(q.begin(), q.end(), by_slo);
  double l1 = p.l1, l2 = p.l2;
  if (l1 <= 0 || l2 <= 0) {
    std::vector<double> slos, lens;
    // Slack goes negative once a queue runs late: the scale is its size.
    for (const auto* c : q) slos.push_back(std::abs(c->slo_s)), lens.push_back(c->predicted_tokens);
    if (l1 <= 0) l1 = 1.0 / std::max(median_of(slos), 1e-3);
    if (l2 <= 0) l2 = 1.0 / std::max(median_of(lens), 1.0);
  }
  // First fit in SLO order: each request joins the earliest open batch it
  // costs at most the threshold to join, else opens one; batches run in
  // the order they opened (by their most urgent member).
  struct open_batch {
    std::vector<uint64_t> ids;
    std::vector<int32_t> lengths;  // the members' predicted lengths
    // Largest SLO and predicted length so far (slack may be negative).
    double l_cm = -std::numeric_limits<double>::infinity();
    double o_cm = -std::numeric_limits<double>::infinity();
  };
  std::vector<open_batch> open;
  for (const auto* c : q) {
    open_batch* into = nullptr;
    for (auto& b : open) {
      const double n = double(b.ids.size());
      if (n >= max_batch) continue;
      const double t_l = std::abs(c->slo_s - b.l_cm) * (n + 1) * l1;
      const double t_o = std::abs(double(c->predicted_tokens) - b.o_cm) * (n + 1) * l2;
      if (p.w1 * t_l + p.w2 * t_o <= p.threshold) {
        into = &b;
        break;
      }
    }
    if (!into) into = &open.emplace_back();
    into->ids.push_back(c->id);
    into->lengths.push_back(c->predicted_tokens);
    into->l_cm = std::max(into->l_cm, c->slo_s);
    into->o_cm = std::max(into->o_cm, double(c->predicted_tokens));
  }
  if (p.fill) {
    // Later groups' members, each group's in SLO order, move up into the
    // first group with room whose longest member is at least as long.
    for (size_t i = 0; i < open.size(); ++i) {
      auto& to = open[i];
      for (size_t j = i + 1; j < open.size() && to.ids.size() < size_t(max_batch); ++j) {
        auto& from = open[j];
        for (size_t k = 0; k < from.ids.size() && to.ids.size() < size_t(max_batch);) {
          if (from.lengths[k] > to.o_cm) {
            ++k;
            continue;
          }
          to.ids.push_back(from.ids[k]);
          to.lengths.push_back(from.lengths[k]);
          from.ids.erase(from.ids.begin() + long(k));
          from.lengths.erase(from.lengths.begin() + long(k));
        }
        // Its longest may have moved: what it may take later is bounded
        // by the members it kept.
        from.o_cm = -std::numeric_limits<double>::infinity();
        for (int32_t n : from.lengths) from.o_cm = std::max(from.o_cm, double(n));
      }
    }
  }
  std::vector<std::vector<uint64_t>> out;
  for (auto& b : open)
    if (!b.ids.empty()) out.push_back(std::move(b.ids));
  return out;
}

}  // namespace troupe
