#include "sim/epd_sim.hpp"

#include <algorithm>
#include <deque>
#include <queue>
#include <random>
#include <stdexcept>

namespace troupe {

namespace {

struct request_state {
  int32_t prompt = 0;  // text and image placeholder tokens
  int32_t images_left = 0;
  int32_t prefilled = 0;
  int32_t produced = 0;
  double first_token = -1, done = -1;
};

struct instance {
  epd_stages stages;
  bool busy = false;
  std::deque<int32_t> encode_queue;  // one entry per image: its request
  std::vector<int32_t> partial;      // requests whose prefill began
  std::deque<int32_t> waiting;       // requests ready to prefill
  std::vector<int32_t> decoding;
  int32_t incoming_decodes = 0;
  int64_t queued_prefill = 0;  // prompt tokens placed here and not yet computed
  // The running iteration.
  std::vector<int32_t> it_encodes;
  std::vector<std::pair<int32_t, int32_t>> it_prefill;  // request, rows
  std::vector<int32_t> it_decodes;
};

enum class event_kind { arrive, prefill_ready, decode_ready, iteration_end };

struct event {
  double t;
  uint64_t seq;  // ties in arrival order, so runs repeat exactly
  event_kind kind;
  int32_t req, inst;
  bool operator>(const event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

class epd_run {
 public:
  epd_run(const epd_sim_config& cfg, const std::vector<epd_request>& reqs)
      : cfg_(cfg), reqs_(reqs), state_(reqs.size()), encoder_(epd_sim_costs(cfg, {}).encode_ms) {
    profile();
    for (size_t i = 0; i < reqs.size(); ++i) {
      state_[i].prompt = reqs[i].text_tokens + reqs[i].images * cfg.image_tokens;
      state_[i].images_left = reqs[i].images;
      push(reqs[i].arrival_s, event_kind::arrive, static_cast<int32_t>(i), -1);
    }
  }

  epd_sim_result run() {
    double now = 0;
    while (!events_.empty()) {
      const event e = events_.top();
      events_.pop();
      now = e.t;
      switch (e.kind) {
        case event_kind::arrive:
          arrive(e.req, now);
          break;
        case event_kind::prefill_ready:
          enqueue_prefill(e.inst, e.req, now);
          break;
        case event_kind::decode_ready:
          --inst_[e.inst].incoming_decodes;
          inst_[e.inst].decoding.push_back(e.req);
          try_start(e.inst, now);
          break;
        case event_kind::iteration_end:
          finish_iteration(e.inst, now);
          break;
      }
    }
    return summarize(now);
  }

 private:
  double step_ms(int32_t rows, int32_t decode_rows, int64_t context) const {
    return cfg_.cost.step_ms(rows, decode_rows, context);
  }
  double encode_ms(int32_t images) const { return encoder_(images); }

  void profile() {
    if (cfg_.profile) {
      result_.profile = *cfg_.profile;
    } else {
      const auto w = epd_workload_of(reqs_, cfg_.image_tokens);
      result_.profile = profile_epd(epd_sim_costs(cfg_, w), w, cfg_.tpot_slo_s * 1000,
                                    cfg_.instances, cfg_.dual_stream, cfg_.strategy);
    }
    const auto pools = epd_pools(result_.profile.strategy);
    if (pools.size() != result_.profile.pools.size())
      throw std::invalid_argument("the profile's pools do not match its strategy");
    for (int32_t n : result_.profile.pools)
      if (n < 1) throw std::invalid_argument("every pool of the profile needs an instance");
    for (size_t p = 0; p < pools.size(); ++p)
      for (int32_t k = 0; k < result_.profile.pools[p]; ++k) {
        instance in;
        in.stages = pools[p];
        inst_.push_back(in);
      }
    if (inst_.empty()) throw std::invalid_argument("the profile has no instances");
  }

  void push(double t, event_kind k, int32_t req, int32_t inst) {
    events_.push(event{t, seq_++, k, req, inst});
  }

  // The router: least queued work among the instances that run a stage,
  // counted in prompt-token equivalents (an image as its rows times the
  // encoder's relative cost, a running decode as one row; decode placement
  // counts decodes only), ties to the next instance after the last pick.
  int32_t pick(bool epd_stages::*stage, bool for_decode) {
    int32_t best = -1;
    double best_load = 0;
    const size_t n = inst_.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (cursor_ + 1 + k) % n;
      const auto& in = inst_[i];
      if (!(in.stages.*stage)) continue;
      const double decodes = static_cast<double>(in.decoding.size() + in.incoming_decodes);
      const double load = for_decode
                              ? decodes
                              : static_cast<double>(in.queued_prefill) + decodes +
                                    in.encode_queue.size() * cfg_.image_tokens * cfg_.encoder_scale;
      if (best < 0 || load < best_load) best = static_cast<int32_t>(i), best_load = load;
    }
    cursor_ = static_cast<size_t>(best);
    return best;
  }

  void arrive(int32_t r, double now) {
    if (reqs_[r].images <= 0) return place_prefill(r, -1, now);
    const int32_t e = pick(&epd_stages::encode, false);
    for (int32_t k = 0; k < reqs_[r].images; ++k) inst_[e].encode_queue.push_back(r);
    try_start(e, now);
  }

  // A request ready to prefill, from encode instance `from` (-1: none).
  // Its tokens count in the prefill instance's load from placement on.
  void place_prefill(int32_t r, int32_t from, double now) {
    const bool here = from >= 0 && inst_[from].stages.prefill;
    const int32_t p = here ? from : pick(&epd_stages::prefill, false);
    inst_[p].queued_prefill += state_[r].prompt;
    if (from < 0 || here) return enqueue_prefill(p, r, now);
    const int64_t bytes =
        static_cast<int64_t>(reqs_[r].images) * cfg_.image_tokens * cfg_.embed_bytes_per_token;
    push(now + cfg_.cost.transfer_ms(bytes) / 1000, event_kind::prefill_ready, r, p);
  }

  void enqueue_prefill(int32_t p, int32_t r, double now) {
    inst_[p].waiting.push_back(r);
    // The instance finishing an iteration plans its next once, after all
    // that iteration's results are in (so one encoder batch's requests
    // start their prefills together).
    if (p != finishing_) try_start(p, now);
  }

  void place_decode(int32_t r, int32_t from, double now) {
    if (inst_[from].stages.decode) {
      inst_[from].decoding.push_back(r);
      return;
    }
    const int32_t d = pick(&epd_stages::decode, true);
    ++inst_[d].incoming_decodes;
    const int64_t bytes = static_cast<int64_t>(state_[r].prompt) * cfg_.cost.kv_bytes_per_token;
    push(now + cfg_.cost.transfer_ms(bytes) / 1000, event_kind::decode_ready, r, d);
  }

  void try_start(int32_t i, double now) {
    auto& in = inst_[i];
    if (in.busy) return;
    // (The iteration's lists are empty here: finish_iteration took them.)
    const epd_limits& lim = result_.profile.limits;
    epd_iteration plan;
    epd_queue q;
    q.decodes = static_cast<int32_t>(in.decoding.size());
    for (int32_t r : in.partial)
      q.partial_prefills.push_back(state_[r].prompt - state_[r].prefilled);
    for (int32_t r : in.waiting) q.new_prefills.push_back(state_[r].prompt);
    q.pending_encodes = static_cast<int32_t>(in.encode_queue.size());
    if (cfg_.stage_scheduling) {
      plan = plan_epd_iteration(q, lim);
    } else {
      // Request-level: everything waiting, whole.
      plan.decode_rows = q.decodes;
      plan.partial_rows = q.partial_prefills;
      plan.new_rows = q.new_prefills;
      plan.encodes = q.pending_encodes;
    }
    if (plan.empty()) return;
    int64_t context = 0;
    for (int32_t k = 0; k < plan.decode_rows; ++k) {
      const int32_t r = in.decoding[k];
      in.it_decodes.push_back(r);
      context += state_[r].prompt + state_[r].produced;
    }
    auto chunk = [&](int32_t r, int32_t rows) {
      const int64_t start = state_[r].prefilled;
      context += rows * start + static_cast<int64_t>(rows) * (rows + 1) / 2;
      in.it_prefill.emplace_back(r, rows);
    };
    for (size_t k = 0; k < plan.partial_rows.size(); ++k)
      if (plan.partial_rows[k] > 0) chunk(in.partial[k], plan.partial_rows[k]);
    for (size_t k = 0; k < plan.new_rows.size(); ++k) {
      const int32_t r = in.waiting.front();
      in.waiting.pop_front();
      in.partial.push_back(r);
      chunk(r, plan.new_rows[k]);
    }
    for (int32_t k = 0; k < plan.encodes; ++k) {
      in.it_encodes.push_back(in.encode_queue.front());
      in.encode_queue.pop_front();
    }
    const int32_t rows = plan.decode_rows + plan.prefill_rows();
    const double language = rows > 0 ? step_ms(rows, plan.decode_rows, context) : 0.0;
    const double vision = plan.encodes > 0 ? encode_ms(plan.encodes) : 0.0;
    const double ms = combine_streams(language, vision, cfg_.dual_stream, cfg_.dual_stream_overlap);
    if (plan.encodes > 0) {
      ++result_.encode_batches;
      encoded_images_ += plan.encodes;
    }
    in.busy = true;
    ++result_.iterations;
    push(now + ms / 1000, event_kind::iteration_end, -1, i);
  }

  void finish_iteration(int32_t i, double now) {
    auto& in = inst_[i];
    in.busy = false;
    finishing_ = i;
    // Taken out first: placing a finished encode here starts the next
    // iteration, which refills them.
    const auto decodes = std::move(in.it_decodes);
    const auto prefill = std::move(in.it_prefill);
    const auto encodes = std::move(in.it_encodes);
    in.it_decodes.clear();
    in.it_prefill.clear();
    in.it_encodes.clear();
    for (int32_t r : decodes) {
      if (++state_[r].produced < reqs_[r].output_tokens) continue;
      state_[r].done = now;
      in.decoding.erase(std::find(in.decoding.begin(), in.decoding.end(), r));
    }
    for (auto [r, rows] : prefill) {
      auto& s = state_[r];
      s.prefilled += rows;
      in.queued_prefill -= rows;
      if (s.prefilled < s.prompt) continue;
      in.partial.erase(std::find(in.partial.begin(), in.partial.end(), r));
      s.first_token = now;
      s.produced = 1;
      if (reqs_[r].output_tokens <= 1)
        s.done = now;
      else
        place_decode(r, i, now);
    }
    for (int32_t r : encodes)
      if (--state_[r].images_left == 0) place_prefill(r, i, now);
    finishing_ = -1;
    try_start(i, now);
  }

  epd_sim_result summarize(double end) {
    auto& out = result_;
    std::vector<double> ttft, tpot;
    uint64_t good = 0;
    for (size_t r = 0; r < reqs_.size(); ++r) {
      const auto& s = state_[r];
      // A request the run never finished (a profile that cannot serve it)
      // misses both SLOs.
      if (s.first_token < 0 || s.done < 0) {
        ttft.push_back(1e300);
        tpot.push_back(1e300);
        continue;
      }
      ++out.completed;
      const double t1 = s.first_token - reqs_[r].arrival_s;
      const double tp =
          reqs_[r].output_tokens > 1 ? (s.done - s.first_token) / (reqs_[r].output_tokens - 1) : 0;
      ttft.push_back(t1);
      tpot.push_back(tp);
      good += t1 <= cfg_.ttft_slo_s && tp <= cfg_.tpot_slo_s;
    }
    auto pct = [](std::vector<double> v, double q) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
    };
    out.requests = reqs_.size();
    out.attainment = reqs_.empty() ? 1.0 : static_cast<double>(good) / reqs_.size();
    out.ttft_p50_s = pct(ttft, 0.5);
    out.ttft_p99_s = pct(ttft, 0.99);
    out.tpot_p50_s = pct(tpot, 0.5);
    out.tpot_p99_s = pct(tpot, 0.99);
    out.mean_encode_batch =
        out.encode_batches ? static_cast<double>(encoded_images_) / out.encode_batches : 0;
    out.simulated_s = end;
    return out;
  }

  const epd_sim_config& cfg_;
  const std::vector<epd_request>& reqs_;
  std::vector<request_state> state_;
  std::function<double(int32_t)> encoder_;  // the stand-in encoder (epd_sim_costs)
  std::vector<instance> inst_;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  size_t cursor_ = 0;       // the router's last pick
  int32_t finishing_ = -1;  // the instance whose iteration is being finished
  uint64_t encoded_images_ = 0;
  epd_sim_result result_;
};

}  // namespace

epd_workload epd_workload_of(const std::vector<epd_request>& reqs, int32_t image_tokens) {
  double prompt = 0, output = 0, images = 0;
  for (const auto& r : reqs) {
    prompt += r.text_tokens + static_cast<double>(r.images) * image_tokens;
    output += r.output_tokens;
    images += r.images;
  }
  const double n = std::max<double>(1, static_cast<double>(reqs.size()));
  return {images / n, prompt / n, output / n};
}

epd_costs epd_sim_costs(const epd_sim_config& cfg, const epd_workload& w) {
  epd_costs c;
  // Attention work at the workload's mean lengths: a decode row attends
  // to its prompt and half its output, a prefill row to half its prompt.
  c.language_ms = [cost = cfg.cost, w](int32_t rows, int32_t decode_rows) {
    const double ctx = decode_rows * (w.prompt_tokens + w.output_tokens / 2) +
                       (rows - decode_rows) * w.prompt_tokens / 2;
    return cost.step_ms(rows, decode_rows, static_cast<int64_t>(ctx));
  };
  // The stand-in encoder: the language model's forward of the image's
  // rows, full attention among them.
  c.encode_ms = [cost = cfg.cost, t = int64_t{cfg.image_tokens},
                 scale = cfg.encoder_scale](int32_t images) {
    return scale * cost.step_ms(static_cast<int32_t>(images * t), 0, images * t * (t + 1) / 2);
  };
  c.dual_stream_overlap = cfg.dual_stream_overlap;
  return c;
}

epd_profile epd_sim_profile(const epd_sim_config& cfg, uint64_t trial_requests, uint64_t seed,
                            double target) {
  const auto w =
      epd_workload_of(textcaps_like_workload(trial_requests, 1.0, seed), cfg.image_tokens);
  auto trial = [&](epd_strategy s, const epd_limits& lim, const std::vector<int32_t>& pools) {
    auto c = cfg;
    epd_profile p;
    p.strategy = s;
    p.limits = lim;
    p.pools = pools;
    c.profile = p;
    return epd_goodput(c, trial_requests, seed, target);
  };
  return profile_epd_by_trial(epd_sim_costs(cfg, w), w, cfg.tpot_slo_s * 1000, cfg.instances,
                              cfg.dual_stream, trial, cfg.strategy);
}

epd_sim_result simulate_epd(const epd_sim_config& cfg, const std::vector<epd_request>& reqs) {
  if (cfg.image_tokens < 1) throw std::invalid_argument("image tokens must be at least 1");
  if (!(cfg.encoder_scale > 0)) throw std::invalid_argument("the encoder scale must be positive");
  if (!(cfg.ttft_slo_s > 0) || !(cfg.tpot_slo_s > 0))
    throw std::invalid_argument("the TTFT and TPOT SLOs must be positive");
  for (const auto& r : reqs)
    if (r.images < 0 || r.text_tokens < 0 || r.output_tokens < 1 || r.text_tokens + r.images < 1)
      throw std::invalid_argument("a request needs a prompt and at least one output token");
  epd_run run(cfg, reqs);
  return run.run();
}

std::vector<epd_request> textcaps_like_workload(uint64_t n, double rate, uint64_t seed) {
  if (!(rate > 0)) throw std::invalid_argument("the request rate must be positive");
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(1.0);
  std::uniform_int_distribution<int32_t> text(16, 63), output(8, 31);
  std::vector<epd_request> out;
  double t = 0;
  for (uint64_t i = 0; i < n; ++i) {
    t += gap(rng) / rate;
    epd_request r;
    r.arrival_s = t;
    r.images = 1;
    r.text_tokens = text(rng);
    r.output_tokens = output(rng);
    out.push_back(r);
  }
  return out;
}

double epd_goodput(const epd_sim_config& cfg, uint64_t n, uint64_t seed, double target,
                   epd_sim_result* at) {
  auto meets = [&](double rate, epd_sim_result* r) {
    auto res = simulate_epd(cfg, textcaps_like_workload(n, rate, seed));
    if (r) *r = res;
    return res.attainment >= target;
  };
  double lo = 0, hi = 1;
  // Bracket: double until a rate fails, or halve until one passes.
  if (meets(hi, nullptr)) {
    lo = hi;
    for (hi = 2; meets(hi, nullptr) && hi < 1e4; hi *= 2) lo = hi;
  } else {
    for (lo = 0.5; lo > 1e-3 && !meets(lo, nullptr); lo /= 2) hi = lo;
    if (lo <= 1e-3) lo = 0;
  }
  while (lo > 0 && (hi - lo) / lo > 0.02) {
    const double mid = (lo + hi) / 2;
    if (meets(mid, nullptr))
      lo = mid;
    else
      hi = mid;
  }
  if (at) meets(lo > 0 ? lo : 1e-3, at);
  return lo;
}

}  // namespace troupe
