#include "sim/cluster_sim.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "runtime/service/service_monitor.hpp"

namespace troupe {

namespace {

struct sim_seq {
  uint64_t id = 0;       // the request's index + 1
  int32_t total = 0;     // prompt + generated tokens
  int32_t computed = 0;  // tokens with KV
  int32_t pages = 0;
  bool running = false;
  bool parked = false;   // prefill done, waiting for its KV transfer
  bool swapped = false;  // imported: its KV arrives on admission
  bool prefill_only = false;
  seq_class cls = seq_class::online;
  double deadline = 0;
};

struct sim_instance {
  uint64_t id = 0;
  pd_pool pool = pd_pool::mixed;
  std::unordered_map<uint64_t, sim_seq> seqs;
  int32_t free_pages = 0;
  bool busy = false;
  double transfer_free_at = 0;     // its KV transfers go one at a time, first come first served
  std::vector<step_chunk> chunks;  // of the step on the device
  size_t n_decode = 0;
  double step_ms = 0;
  int32_t rows = 0;
  int32_t decode_rows = 0;
  // Autoscaling: placed on only while active and ready.
  bool active = true;
  double ready_at = 0;  // serves from then (a started instance loads first)
};

enum class ev : uint8_t { arrival, step_done, transfer_done, window };

struct event {
  double t;
  uint64_t order;  // ties in insertion order: deterministic
  ev kind;
  uint32_t inst;
  uint64_t a, b;
  bool operator>(const event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

struct tracker {
  double first = -1, last = 0;
  int32_t tokens = 0;
  bool keep_itl = false;
  std::vector<double> times;
  double predicted_ttft_ms = 0;
};

class simulation {
 public:
  simulation(const sim_config& cfg, const std::vector<sim_request>& reqs)
      : cfg_(cfg), reqs_(reqs), mon_(cfg.window_s) {
    if (cfg.instances <= 0) throw std::invalid_argument("sim: instances must be positive");
    if (auto why = validate(cfg.limits); !why.empty()) throw std::invalid_argument("sim: " + why);
    if (cfg.cost.kv_pages <= 0) throw std::invalid_argument("sim: the cost model has no kv_pages");
    if (cfg.pd && cfg.pd_placement != "slo" && cfg.pd_placement != "least-load" &&
        cfg.pd_placement != "round-robin")
      throw std::invalid_argument("sim: pd placement '" + cfg.pd_placement +
                                  "' (slo, least-load, round-robin)");
    if (cfg.autoscale && cfg.pd)
      throw std::invalid_argument("sim: --autoscale with --pd: not yet (mixed instances only)");
    if (cfg.autoscale && (cfg.scale.min < 1 || cfg.scale.max < cfg.scale.min))
      throw std::invalid_argument("sim: --autoscale needs 1 <= min <= max");
    // With autoscaling, a slot for every instance it may start.
    const int32_t slots = cfg.autoscale ? std::max(cfg.instances, cfg.scale.max) : cfg.instances;
    for (int32_t i = 0; i < slots; ++i) {
      sim_instance in;
      in.id = uint64_t(i + 1);
      in.active = i < cfg.instances;
      in.free_pages = cfg.cost.kv_pages;
      if (cfg.pd) {
        if (size_t(i) < cfg.roles.size())
          in.pool = pool_of(cfg.roles[size_t(i)]);
        else
          in.pool = i < (cfg.instances + 1) / 2 ? pd_pool::prefill : pd_pool::decode;
      }
      insts_.push_back(std::move(in));
    }
    track_.resize(reqs.size());
    int64_t tokens = 0;
    for (const auto& r : reqs) tokens += r.output;
    const int64_t every = std::max<int64_t>(1, tokens / 4'000'000);
    for (size_t i = 0; i < reqs.size(); ++i) track_[i].keep_itl = int64_t(i) % every == 0;
    lim_ = cfg.limits;
    lim_.page_size = cfg.cost.page_size;
  }

  sim_result run() {
    const auto wall0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < reqs_.size(); ++i) push(reqs_[i].arrival, ev::arrival, 0, i, 0);
    if (!reqs_.empty()) push(cfg_.window_s, ev::window, 0, 0, 0);
    while (!q_.empty() && finished_ < reqs_.size()) {
      event e = q_.top();
      q_.pop();
      now_ = e.t;
      ++res_.stats.events;
      switch (e.kind) {
        case ev::arrival:
          arrive(e.a);
          break;
        case ev::step_done:
          step_done(insts_[e.inst]);
          break;
        case ev::transfer_done:
          transfer_done(e.inst, uint32_t(e.b >> 40), e.a);
          break;
        case ev::window:
          window();
          if (finished_ < reqs_.size()) push(now_ + cfg_.window_s, ev::window, 0, 0, 0);
          break;
      }
    }
    for (size_t i = 0; i < reqs_.size(); ++i) {
      const auto& t = track_[i];
      bench::request_record r;
      r.send_time = reqs_[i].arrival;
      r.prompt_tokens = reqs_[i].prompt;
      r.output_tokens = t.tokens;
      r.success = t.tokens > 0;
      r.end_time = t.last;
      if (!r.success) {
        r.error_code = "unfinished";
        r.error_message = "the simulation ended before it finished";
      }
      if (t.keep_itl) {
        r.chunk_times = t.times;
        r.chunk_tokens.assign(t.times.size(), 1);
        for (size_t k = 1; k < t.times.size(); ++k)
          res_.itl_s.push_back(t.times[k] - t.times[k - 1]);
      } else if (t.tokens > 0) {
        r.chunk_times = {t.first};
        r.chunk_tokens = {1};
        if (t.tokens > 1) {
          r.chunk_times.push_back(t.last);
          r.chunk_tokens.push_back(t.tokens - 1);
        }
      }
      res_.records.push_back(std::move(r));
    }
    res_.stats.simulated_s = now_;
    res_.stats.ttft_mape = mon_.ttft_mape();
    res_.stats.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return std::move(res_);
  }

 private:
  void push(double t, ev kind, uint32_t inst, uint64_t a, uint64_t b) {
    q_.push(event{t, next_order_++, kind, inst, a, b});
  }

  int32_t pages_for(int64_t tokens) const {
    return int32_t((tokens + lim_.page_size - 1) / lim_.page_size);
  }

  pd_load load_of(const sim_instance& in) const {
    pd_load l;
    l.id = in.id;
    l.pool = in.pool;
    l.page_size = lim_.page_size;
    l.total_pages = cfg_.cost.kv_pages;
    l.used_pages = cfg_.cost.kv_pages - in.free_pages;
    for (const auto& [id, s] : in.seqs) {
      const bool decoding = s.parked || (s.running && s.total - s.computed == 1);
      if (decoding) {
        ++l.decoding;
        l.running_tokens += s.total;
      } else {
        l.queued_prefills.push_back(s.total - s.computed);
      }
    }
    l.prefilling = int32_t(l.queued_prefills.size());
    if (auto it = windows_.find(in.id); it != windows_.end()) {
      l.token_interval_ms = it->second.token_interval_ms;
      l.busy = it->second.busy;
    }
    return l;
  }

  std::vector<pd_load> loads() const {
    std::vector<pd_load> out;
    out.reserve(insts_.size());
    for (const auto& in : insts_) out.push_back(load_of(in));
    return out;
  }

  uint32_t index_of(uint64_t id) const { return uint32_t(id - 1); }

  void arrive(size_t i) {
    const auto& r = reqs_[i];
    uint64_t target = 0;
    bool prefill_only = false;
    double predicted = 0;
    if (!cfg_.pd) {
      std::vector<instance_snapshot> snaps;
      snaps.reserve(insts_.size());
      for (const auto& in : insts_) {
        if (!in.active || in.ready_at > now_) continue;
        instance_snapshot s;
        s.instance = in.id;
        for (const auto& [id, q] : in.seqs) {
          ++(q.running || q.parked ? s.running : s.waiting);
          if (q.total - q.computed > 1) s.queued_prefill_tokens += q.total - q.computed;
        }
        s.free_pages = in.free_pages;
        s.total_pages = cfg_.cost.kv_pages;
        snaps.push_back(std::move(s));
      }
      placement_request pr;
      pr.prompt_tokens = r.prompt;
      auto p = place(cfg_.mixed_policy, pr, snaps, cursor_, model_, cfg_.targets.ttft_ms);
      target = p.instance;
      predicted = p.predicted_ttft_ms;
      if (predicted == 0 && model_.samples() > 0)
        predicted = predicted_ttft_ms(load_of(insts_[index_of(target)]), r.prompt, model_);
    } else {
      auto ls = loads();
      if (cfg_.pd_placement == "slo") {
        auto c = place_prefill(r.prompt, ls, model_, cfg_.targets);
        mon_.placed(c.meets_target);
        target = c.instance;
        predicted = c.predicted_ttft_ms;
      } else {
        target = pick(ls, true);
        if (model_.samples() > 0)
          predicted = predicted_ttft_ms(load_of(insts_[index_of(target)]), r.prompt, model_);
      }
      if (target != 0) prefill_only = !takes_decode(insts_[index_of(target)].pool);
    }
    if (target == 0) throw std::runtime_error("sim: no instance can take a request");
    // As the instance refuses it: a request that can never fit the arena.
    if (int64_t(r.prompt) + r.output > int64_t(cfg_.cost.kv_pages) * lim_.page_size ||
        r.prompt <= 0 || r.output <= 0) {
      ++finished_;
      return;
    }
    track_[i].predicted_ttft_ms = model_.samples() > 0 ? predicted : 0;
    sim_seq s;
    s.id = i + 1;
    s.total = r.prompt;
    s.prefill_only = prefill_only;
    s.cls = r.offline ? seq_class::offline : seq_class::online;
    if (!r.offline && cfg_.targets.ttft_ms > 0)
      s.deadline = r.arrival * 1000 + cfg_.targets.ttft_ms;
    auto& in = insts_[index_of(target)];
    in.seqs.emplace(s.id, s);
    try_step(in);
  }

  // The baselines' placement: least load or round robin over the instances
  // that take prefill (or decode).
  uint64_t pick(const std::vector<pd_load>& ls, bool prefill) {
    std::vector<const pd_load*> c;
    for (const auto& l : ls)
      if (prefill ? takes_prefill(l.pool) : takes_decode(l.pool)) c.push_back(&l);
    if (c.empty()) return 0;
    if (cfg_.pd_placement == "round-robin") {
      auto& cur = prefill ? rr_prefill_ : rr_decode_;
      return c[cur++ % c.size()]->id;
    }
    const pd_load* best = c.front();
    for (const auto* l : c) {
      const int64_t a = prefill ? l->queued_prefill_tokens() : l->running_tokens;
      const int64_t b = prefill ? best->queued_prefill_tokens() : best->running_tokens;
      if (a < b) best = l;
    }
    return best->id;
  }

  sched_seq describe(const sim_seq& s) const {
    return {s.id, s.cls, s.id, s.computed, s.total, s.pages, s.swapped, {}, s.deadline};
  }

  // The instance actor's step() with the simulated pages and clock.
  void try_step(sim_instance& in) {
    if (in.busy) return;
    std::unordered_set<uint64_t> preempted_now;
    for (int guard = 0; guard < 100000; ++guard) {
      std::vector<sched_seq> running, waiting;
      for (const auto& [id, s] : in.seqs) {
        if (s.running)
          running.push_back(describe(s));
        else if (!s.parked && !preempted_now.count(id))
          waiting.push_back(describe(s));
      }
      auto plan = plan_step(running, waiting, lim_, in.free_pages);
      for (uint64_t v : plan.preempted) {
        auto& s = in.seqs.at(v);
        in.free_pages += s.pages;
        s.pages = 0;
        s.computed = 0;
        s.running = false;
        preempted_now.insert(v);
        ++res_.stats.preemptions;
      }
      if (!plan.admitted.empty()) {
        for (uint64_t a : plan.admitted) {
          auto& s = in.seqs.at(a);
          s.running = true;
          if (s.swapped) {
            s.pages = pages_for(s.computed);
            in.free_pages -= s.pages;
            s.swapped = false;
          }
        }
        continue;
      }
      if (plan.empty()) {
        if (!plan.preempted.empty()) continue;
        return;
      }
      in.chunks = plan.decode;
      in.chunks.insert(in.chunks.end(), plan.prefill.begin(), plan.prefill.end());
      in.n_decode = plan.decode.size();
      int32_t rows = 0, decode_rows = 0;
      int64_t context = 0;
      for (size_t k = 0; k < in.chunks.size(); ++k) {
        const auto& c = in.chunks[k];
        auto& s = in.seqs.at(c.id);
        const int32_t need = std::max(0, pages_for(c.start + c.n_tokens) - s.pages);
        s.pages += need;
        in.free_pages -= need;
        rows += c.n_tokens;
        if (k < in.n_decode) decode_rows += c.n_tokens;
        context += int64_t(c.n_tokens) * c.start + int64_t(c.n_tokens) * (c.n_tokens + 1) / 2;
      }
      in.busy = true;
      in.rows = rows;
      in.step_ms = cfg_.cost.step_ms(rows, decode_rows, context);
      in.decode_rows = decode_rows;
      push(now_ + in.step_ms / 1000, ev::step_done, index_of(in.id), 0, 0);
      return;
    }
    throw std::runtime_error("sim: the step planner did not settle");
  }

  void record_token(size_t i, uint64_t instance) {
    auto& t = track_[i];
    if (t.tokens == 0) {
      t.first = now_;
      mon_.ttft(instance, t.predicted_ttft_ms, (now_ - reqs_[i].arrival) * 1000, now_);
    }
    t.last = now_;
    ++t.tokens;
    if (t.keep_itl) t.times.push_back(now_);
  }

  void step_done(sim_instance& in) {
    in.busy = false;
    ++res_.stats.steps;
    if (in.rows > in.decode_rows)
      model_.observe(in.rows - in.decode_rows, in.step_ms);  // as the router does
    mon_.step(in.id, in.rows, in.decode_rows, in.step_ms, now_);
    for (size_t k = 0; k < in.chunks.size(); ++k) {
      const auto& c = in.chunks[k];
      auto it = in.seqs.find(c.id);
      if (it == in.seqs.end() || !it->second.running) continue;
      auto& s = it->second;
      s.computed += c.n_tokens;
      if (!c.sample) continue;
      const size_t ri = size_t(s.id - 1);
      ++s.total;
      record_token(ri, in.id);
      const auto& t = track_[ri];
      if (t.tokens >= reqs_[ri].output) {
        in.free_pages += s.pages;
        if (t.tokens > 1) mon_.tpot(in.id, (t.last - t.first) * 1000 / (t.tokens - 1), now_);
        in.seqs.erase(it);
        ++finished_;
        continue;
      }
      if (s.prefill_only) {
        s.running = false;
        s.parked = true;
        hand_off(in, s);
      }
    }
    in.pool = settle(in.pool, load_of(in));
    try_step(in);
  }

  // Disaggregation: where it decodes, then its KV through the source's
  // transfer queue.
  void hand_off(sim_instance& src, sim_seq& s) {
    uint64_t dst = 0;
    if (cfg_.pd_placement == "slo") {
      dst = place_decode(src.id, s.total, loads(), cfg_.pd_cfg, cfg_.targets).instance;
    } else {
      dst = pick(loads(), false);
    }
    if (dst == 0 || dst == src.id) {
      s.parked = false;
      s.prefill_only = false;
      s.running = true;  // decodes where it is, pages and all
      return;
    }
    const int64_t bytes = int64_t(s.total - 1) * cfg_.cost.kv_bytes_per_token;
    const double start = std::max(now_, src.transfer_free_at);
    const double ms = cfg_.cost.transfer_ms(bytes);
    src.transfer_free_at = start + ms / 1000;
    ++res_.stats.transfers;
    res_.stats.transfer_bytes += double(bytes);
    res_.stats.transfer_ms_total += (src.transfer_free_at - now_) * 1000;
    push(src.transfer_free_at, ev::transfer_done, index_of(src.id), s.id,
         uint64_t(index_of(dst)) << 40);
  }

  void transfer_done(uint32_t src_i, uint32_t dst_i, uint64_t id) {
    auto& src = insts_[src_i];
    auto it = src.seqs.find(id);
    if (it == src.seqs.end()) return;
    sim_seq s = it->second;
    src.free_pages += s.pages;
    src.seqs.erase(it);
    s.pages = 0;
    s.parked = false;
    s.prefill_only = false;
    s.running = false;
    s.swapped = true;
    s.computed = s.total - 1;
    auto& dst = insts_[dst_i];
    dst.seqs.emplace(id, s);
    src.pool = settle(src.pool, load_of(src));
    try_step(src);
    try_step(dst);
  }

  void window() {
    windows_.clear();
    for (const auto& w : mon_.windows(now_)) windows_[w.instance] = w;
    pd_window w = mon_.take_window();
    if (cfg_.autoscale) scale();
    if (!cfg_.pd || !cfg_.role_switching || cfg_.pd_placement != "slo") return;
    auto f = decide_flip(loads(), w, cfg_.targets, cfg_.pd_cfg, now_, flips_);
    if (!f) return;
    auto& in = insts_[index_of(f->instance)];
    in.pool = flip_pool(in.pool, f->to);
    in.pool = settle(in.pool, load_of(in));
    ++res_.stats.flips;
    if (res_.stats.flip_log.size() < 200) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "t=%.1fs instance %llu -> %s (pool %s): %s", now_,
                    static_cast<unsigned long long>(f->instance), to_string(f->to),
                    to_string(in.pool), f->why.c_str());
      res_.stats.flip_log.push_back(buf);
    }
    try_step(in);
  }

  // The autoscaling policy at a window: instances held are counted, then
  // started (the first inactive slots, serving after start_s) or retired
  // (no new work; it finishes what it holds).
  void scale() {
    std::vector<scaled_instance> view;
    int32_t held = 0;
    for (const auto& in : insts_) {
      if (in.active || !in.seqs.empty()) ++held;
      if (!in.active) continue;
      scaled_instance s;
      s.id = in.id;
      s.starting = in.ready_at > now_;
      for (const auto& [id, q] : in.seqs) ++(q.running || q.parked ? s.running : s.waiting);
      s.max_seqs = lim_.max_seqs;
      if (auto it = windows_.find(in.id); it != windows_.end()) s.ttft_ms = it->second.ttft_ms;
      view.push_back(s);
    }
    res_.stats.instance_seconds += held * cfg_.window_s;
    res_.stats.peak_instances = std::max(res_.stats.peak_instances, held);
    auto d = decide_autoscale(cfg_.scale, view, cfg_.targets.ttft_ms, now_, scale_mem_);
    if (d.why.empty()) return;
    for (int32_t k = 0; k < d.grow; ++k)
      for (auto& in : insts_)
        if (!in.active) {
          in.active = true;
          in.ready_at = now_ + cfg_.start_s;
          ++res_.stats.scale_ups;
          break;
        }
    if (d.retire != 0) {
      insts_[index_of(d.retire)].active = false;
      ++res_.stats.scale_downs;
    }
    if (res_.stats.scale_log.size() < 200) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "t=%.1fs: %s", now_, d.why.c_str());
      res_.stats.scale_log.push_back(buf);
    }
  }

  const sim_config& cfg_;
  const std::vector<sim_request>& reqs_;
  scheduler_limits lim_;
  std::vector<sim_instance> insts_;
  std::vector<tracker> track_;
  std::priority_queue<event, std::vector<event>, std::greater<event>> q_;
  uint64_t next_order_ = 0;
  double now_ = 0;
  size_t finished_ = 0;
  service_monitor mon_;
  prefill_model model_;
  placement_cursor cursor_;
  flip_memory flips_;
  autoscale_memory scale_mem_;
  std::unordered_map<uint64_t, instance_window> windows_;
  size_t rr_prefill_ = 0, rr_decode_ = 0;
  sim_result res_;
};

}  // namespace

sim_result simulate(const sim_config& cfg, const std::vector<sim_request>& reqs) {
  simulation sim(cfg, reqs);
  return sim.run();
}

}  // namespace troupe
