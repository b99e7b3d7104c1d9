#include "runtime/engine/sampler.hpp"

#include "runtime/engine/draw_arith.hpp"

#include <sstream>
#include <stdexcept>

#include <algorithm>
#include <cmath>

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
  const uint64_t bits = draw::seeded_bits(seed, position);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 bits: [0, 1)
}

// A seeded draw from cand_ (the logits after bias and penalties, in token
// order), in draw_arith.hpp's arithmetic, which kernels/draw.cl's
// sample_rows repeats bit for bit: weights W_i = floor(exp((l_i - max) / T)
// * 2^31); candidates (W_i > 0) in order of larger logit, then smaller
// index; top-k keeps the first k, min-p those with exp(...) >= min_p,
// top-p the shortest prefix of those reaching top_p of the top-k's
// weight; the draw point (bits * total) >> 64 picks the first kept token,
// in token order, whose running weight passes it.
int32_t sampler::draw_sampled(size_t position) {
  const auto& p = params_;
  float mx = -INFINITY;
  for (const auto& c : cand_) mx = std::max(mx, c.first);
  if (!std::isfinite(mx)) {  // an infinite maximum: the first of them
    size_t i = 0;
    while (cand_[i].first != mx) ++i;
    return static_cast<int32_t>(i);
  }
  const float inv_t = 1.0f / p.temperature;
  if (!std::isfinite(inv_t)) {  // a temperature too small for its inverse: greedy
    size_t best = 0;
    for (size_t i = 1; i < cand_.size(); ++i)
      if (cand_[i].first > cand_[best].first) best = i;
    return static_cast<int32_t>(best);
  }
  const size_t n = cand_.size();
  weights_.resize(n);
  order_.clear();
  for (size_t i = 0; i < n; ++i) {
    weights_[i] = draw::exp_neg((cand_[i].first - mx) * inv_t);
    if (draw::weight(weights_[i]) > 0) order_.push_back(static_cast<int32_t>(i));
  }
  auto before = [&](int32_t a, int32_t b) {
    const uint32_t ka = draw::order_key(cand_[a].first), kb = draw::order_key(cand_[b].first);
    return ka > kb || (ka == kb && a < b);
  };
  const bool top_p = draw::top_p_fixed(p.top_p) < (1u << 24);
  size_t keep = order_.size();
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  if (keep == order_.size() && !top_p) {
    // No cut by order: min-p alone is a test of each token.
    if (p.min_p > 0.0f) std::erase_if(order_, [&](int32_t i) { return weights_[i] < p.min_p; });
  } else {
    // Cuts by order: the first `keep` in order suffice.
    if (keep < order_.size())
      std::partial_sort(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(keep), order_.end(),
                        before);
    else
      std::sort(order_.begin(), order_.end(), before);
    order_.resize(keep);
    uint64_t mass_k = 0;
    for (int32_t i : order_) mass_k += draw::weight(weights_[i]);
    // min-p tests each token (as the device does): not a prefix where
    // the rounded exp is not monotone.
    if (p.min_p > 0.0f) std::erase_if(order_, [&](int32_t i) { return weights_[i] < p.min_p; });
    size_t kept = order_.size();
    if (top_p) {
      const uint64_t need = draw::top_p_mass(mass_k, draw::top_p_fixed(p.top_p));
      uint64_t cum = 0;
      for (size_t j = 0; j < kept; ++j) {
        cum += draw::weight(weights_[order_[j]]);
        if (cum >= need) {
          kept = j + 1;
          break;
        }
      }
    }
    order_.resize(kept);
    std::sort(order_.begin(), order_.end());  // the draw walks in token order
  }
  uint64_t total = 0;
  for (int32_t i : order_) total += draw::weight(weights_[i]);
  const uint64_t r = draw::draw_point(draw::seeded_bits(p.seed, position), total);
  uint64_t acc = 0;
  for (int32_t i : order_) {
    acc += draw::weight(weights_[i]);
    if (acc > r) return i;
  }
  return order_.back();  // not reached: r < total
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

std::vector<token_count> sampler::penalty_counts(const sampling_params& p,
                                                 std::span<const int32_t> history) {
  std::vector<token_count> out;
  if (!needs_history(p)) return out;
  const size_t window =
      p.penalty_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.penalty_last_n));
  std::vector<int32_t> toks(history.end() - static_cast<ptrdiff_t>(window), history.end());
  std::sort(toks.begin(), toks.end());
  for (size_t i = 0; i < toks.size();) {
    size_t j = i;
    while (j < toks.size() && toks[j] == toks[i]) ++j;
    out.push_back({toks[i], static_cast<int32_t>(j - i)});
    i = j;
  }
  return out;
}

sample_result sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto counts = penalty_counts(params_, history);
  return pick(logits, counts, history.size());
}

int32_t sampler::sample_at(std::span<const float> logits, size_t position,
                           std::span<const token_count> counts) {
  return pick(logits, counts, position).token;
}

sample_result sampler::pick(std::span<const float> raw, std::span<const token_count> counts,
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
  const bool penalized = needs_history(p) && !counts.empty();
  if (p.temperature == 0.0f && !penalized) {
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

  // Penalties over the recent window (llama.cpp semantics; draw::penalize,
  // as kernels/penalty.cl computes them).
  if (penalized) {
    const float inv_rep = 1.0f / p.repetition_penalty;
    for (const auto& tc : counts) {
      if (tc.token < 0 || tc.token >= n || tc.count <= 0) continue;
      float& v = cand_[tc.token].first;
      v = draw::penalize(v, tc.count, p.repetition_penalty, inv_rep, p.frequency_penalty,
                         p.presence_penalty);
    }
  }

  if (p.temperature == 0.0f) {
    auto best = std::max_element(cand_.begin(), cand_.end(), [](auto& a, auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    res.token = best->second;
  } else {
    res.token = draw_sampled(position);
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
