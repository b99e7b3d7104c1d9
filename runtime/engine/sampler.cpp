#include "runtime/engine/sampler.hpp"

#include <sstream>
#include <stdexcept>

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace troupe {

std::string validate(const sampling_params& p) {
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(p.temperature) || p.temperature < 0.0f || p.temperature > 100.0f)
    return "temperature must be in [0, 100]";
  if (p.top_k < 0) return "top_k must be >= 0";
  if (!finite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f) return "top_p must be in (0, 1]";
  if (!finite(p.min_p) || p.min_p < 0.0f || p.min_p > 1.0f) return "min_p must be in [0, 1]";
  if (!finite(p.repetition_penalty) || p.repetition_penalty <= 0.0f || p.repetition_penalty > 10.0f)
    return "repetition_penalty must be in (0, 10]";
  if (!finite(p.presence_penalty) || std::fabs(p.presence_penalty) > 10.0f)
    return "presence_penalty must be in [-10, 10]";
  if (!finite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 10.0f)
    return "frequency_penalty must be in [-10, 10]";
  if (p.penalty_last_n < -1) return "penalty_last_n must be >= -1";
  if (p.n_logprobs < 0 || p.n_logprobs > 20) return "n_logprobs must be in [0, 20]";
  if (p.logit_bias.size() > k_max_logit_bias)
    return "logit_bias may hold at most " + std::to_string(k_max_logit_bias) + " tokens";
  for (const auto& b : p.logit_bias) {
    if (b.token < 0) return "logit_bias: token " + std::to_string(b.token) + " is negative";
    if (!finite(b.bias) || std::fabs(b.bias) > 100.0f)
      return "logit_bias: the bias of token " + std::to_string(b.token) + " must be in [-100, 100]";
  }
  return {};
}

sampler::sampler(const sampling_params& p) : params_(p) {}

double seeded_uniform(uint64_t seed, uint64_t position) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t bits = mix(mix(seed) ^ position);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 bits: [0, 1)
}

namespace {

// log-softmax value of logits[i]
std::vector<float> log_softmax(std::span<const float> logits) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
  return out;
}

}  // namespace

bool sampler::needs_history(const sampling_params& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

bool sampler::wants_logprobs(const sampling_params& p) {
  return p.logprobs || p.n_logprobs > 0;
}

sample_result sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  return pick(logits, history, history.size());
}

int32_t sampler::sample_at(std::span<const float> logits, size_t position) {
  if (needs_history(params_))
    throw std::logic_error("sample_at: penalties need the history's tokens");
  return pick(logits, {}, position).token;
}

sample_result sampler::pick(std::span<const float> raw, std::span<const int32_t> history,
                            size_t position) {
  const auto& p = params_;
  const int32_t n = static_cast<int32_t>(raw.size());
  sample_result res;
  // logit_bias first: every later stage (greedy, penalties, top-k/p, the
  // draw) sees the biased logits; logprobs are reported from `raw`.
  std::span<const float> logits = raw;
  if (!p.logit_bias.empty()) {
    biased_.assign(raw.begin(), raw.end());
    for (const auto& b : p.logit_bias)
      if (b.token < n) biased_[static_cast<size_t>(b.token)] += b.bias;
    logits = biased_;
  }

  // A broken forward pass (or a malformed reply from a remote device) must
  // end this sequence with an error, not pick an arbitrary token.
  if (n == 0) throw std::invalid_argument("sample: no logits");
  if (p.temperature == 0.0f && (!needs_history(p) || history.empty())) {
    // Greedy without penalties: one pass, no candidate list (the first of
    // equal maxima, as below).  Every decode row of a greedy batch comes
    // here, on the host's critical path.
    int32_t best = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (std::isnan(logits[i]))
        throw std::invalid_argument("sample: logit " + std::to_string(i) + " is NaN");
      if (logits[i] > logits[best]) best = i;
    }
    res.token = best;
    return with_logprobs(res, raw);
  }
  cand_.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i]))
      throw std::invalid_argument("sample: logit " + std::to_string(i) + " is NaN");
    cand_[i] = {logits[i], i};
  }

  // Penalties over the recent window (llama.cpp semantics).
  if (needs_history(p) && !history.empty()) {
    size_t window =
        p.penalty_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.penalty_last_n));
    std::unordered_map<int32_t, int> counts;
    for (size_t i = history.size() - window; i < history.size(); ++i) ++counts[history[i]];
    for (auto [tok, c] : counts) {
      if (tok < 0 || tok >= n) continue;
      float& v = cand_[tok].first;
      if (p.repetition_penalty != 1.0f)
        v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
      v -= static_cast<float>(c) * p.frequency_penalty + p.presence_penalty;
    }
  }

  if (p.temperature == 0.0f) {
    auto best = std::max_element(cand_.begin(), cand_.end(), [](auto& a, auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    res.token = best->second;
  } else {
    // Sort descending once; every truncation is then a prefix.
    size_t keep = cand_.size();
    if (p.top_k > 0) keep = std::min(keep, size_t(p.top_k));
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(),
                      [](auto& a, auto& b) { return a.first > b.first; });
    cand_.resize(keep);
    const float mx = cand_.front().first;
    std::vector<double> probs(keep);
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      probs[i] = std::exp(static_cast<double>((cand_[i].first - mx) / p.temperature));
      sum += probs[i];
    }
    for (auto& x : probs) x /= sum;
    if (p.min_p > 0.0f) {
      const double floor = probs[0] * p.min_p;
      size_t k = 1;
      while (k < keep && probs[k] >= floor) ++k;
      keep = k;
    }
    if (p.top_p < 1.0f) {
      double cum = 0.0;
      size_t k = 0;
      while (k < keep) {
        cum += probs[k++];
        if (cum >= p.top_p) break;
      }
      keep = k;
    }
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += probs[i];
    double r = total * seeded_uniform(p.seed, position), acc = 0.0;
    res.token = cand_[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      acc += probs[i];
      if (r < acc) {
        res.token = cand_[i].second;
        break;
      }
    }
  }

  return with_logprobs(res, raw);
}

// Logprobs are reported under the model's own distribution.
sample_result sampler::with_logprobs(sample_result res, std::span<const float> logits) const {
  const auto& p = params_;
  const int32_t n = static_cast<int32_t>(logits.size());
  if (!wants_logprobs(p)) return res;
  auto lp = log_softmax(logits);
  res.logprob = lp[res.token];
  if (p.n_logprobs > 0) {
    std::vector<int32_t> idx(n);
    for (int32_t i = 0; i < n; ++i) idx[i] = i;
    const size_t k = std::min<size_t>(p.n_logprobs, n);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
    for (size_t i = 0; i < k; ++i) res.top.push_back({idx[i], lp[idx[i]]});
  }
  return res;
}

}  // namespace troupe
