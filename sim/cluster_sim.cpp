#include "sim/cluster_sim.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "runtime/service/service_monitor.hpp"
#include "runtime/service/ttft_predictor.hpp"
#include "sim/sim_store.hpp"

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
  bool fetching = false;  // its prompt's pages are on their way from a KV store
  seq_class cls = seq_class::online;
  double deadline = 0;
  // Prefix caching: its tokens (prompt, then generated), and the pages a
  // store gave at its arrival: `fetched` of them from page `fetch_from` on.
  std::vector<int32_t> tokens;
  int32_t fetch_from = 0;
  int32_t fetched = 0;
  bool first_admission = true;
  uint64_t order = 0;  // arrival order (a later turn arrives after higher indices)
  // Where each fetched page came from, in order: 0 host, 1 disk, 2 pull.
  std::vector<uint8_t> fetched_from;
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
  int64_t context = 0;  // the step's attention work
  // Autoscaling: placed on only while active and ready.
  bool active = true;
  double ready_at = 0;  // serves from then (a started instance loads first)
  // Prefix caching: the arena's pages (free_pages unused then), and its
  // process's KV store.
  std::unique_ptr<page_pool> arena;
  std::unique_ptr<sim_store> store;
};

enum class ev : uint8_t { arrival, step_done, transfer_done, window, fetched };

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
  double arrival = 0;   // when it arrived (a later turn: after its previous one)
  int32_t cached = -1;  // prompt tokens not computed at its first admission; -1: no prefix caching
  bool failed = false;  // the arena could not hold it (make_room)
};

class simulation {
 public:
  simulation(const sim_config& cfg, const std::vector<sim_request>& reqs)
      : cfg_(cfg), reqs_(reqs), mon_(cfg.window_s) {
    if (cfg.instances <= 0) throw std::invalid_argument("sim: instances must be positive");
    if (auto why = validate(cfg.limits); !why.empty()) throw std::invalid_argument("sim: " + why);
    if (cfg.cost.kv_pages <= 0) throw std::invalid_argument("sim: the cost model has no kv_pages");
    for (auto r : cfg.roles)
      if (r == instance_role::encode)
        throw std::invalid_argument(
            "sim: the encode role is hybrid EPD's (troupe bench epd); text requests have no "
            "encode stage");
    if (cfg.pd && cfg.pd_placement != "slo" && cfg.pd_placement != "least-load" &&
        cfg.pd_placement != "round-robin")
      throw std::invalid_argument("sim: pd placement '" + cfg.pd_placement +
                                  "' (slo, least-load, round-robin)");
    if (cfg.autoscale && cfg.pd)
      throw std::invalid_argument("sim: --autoscale with --pd: not yet (mixed instances only)");
    if (cfg.autoscale && (cfg.scale.min < 1 || cfg.scale.max < cfg.scale.min))
      throw std::invalid_argument("sim: --autoscale needs 1 <= min <= max");
    if (cfg.pipeline.stages > 1 && (cfg.autoscale || cfg.pd))
      throw std::invalid_argument(
          "sim: pipelined instances are mixed and fixed (no --pd, no --autoscale): not yet");
    if (cfg.pipeline.stages > 1)
      for (int32_t i = 0; i < cfg.instances; ++i) pipes_.push_back(make_sim_pipeline(cfg.pipeline));
    res_.stats.devices = cfg.instances * std::max(1, cfg.pipeline.stages);
    res_.stats.pipelined = cfg.pipeline.stages > 1;
    // With autoscaling, a slot for every instance it may start.
    const int32_t slots = cfg.autoscale ? std::max(cfg.instances, cfg.scale.max) : cfg.instances;
    for (int32_t i = 0; i < slots; ++i) {
      sim_instance in;
      in.id = uint64_t(i + 1);
      in.active = i < cfg.instances;
      in.free_pages = cfg.cost.kv_pages;
      if (cfg.prefix_caching) {
        in.arena = std::make_unique<page_pool>(cfg.cost.kv_pages, cfg.cost.page_size, k_salt);
        if (cfg.kv_host_bytes > 0 || cfg.kv_disk_bytes > 0) {
          in.store = std::make_unique<sim_store>(cfg.kv_host_bytes, cfg.kv_disk_bytes, page_bytes(),
                                                 cfg.tier_policy);
          in.arena->record_evictions(true);
        }
      }
      if (cfg.pd) {
        if (size_t(i) < cfg.roles.size())
          in.pool = pool_of(cfg.roles[size_t(i)]);
        else if (cfg.role_switching && cfg.pd_cfg.via_mixed)
          in.pool = pd_pool::mixed;  // as troupe serve starts them (pd_start_role)
        else
          in.pool = i < (cfg.instances + 1) / 2 ? pd_pool::prefill : pd_pool::decode;
      }
      insts_.push_back(std::move(in));
    }
    if (cfg.kv_pull && !(cfg.prefix_caching && cfg.kv_host_bytes + cfg.kv_disk_bytes > 0))
      throw std::invalid_argument("sim: pulls need prefix caching and a KV store (a host budget)");
    track_.resize(reqs.size());
    next_turn_.assign(reqs.size(), -1);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const long a = reqs[i].after;
      if (a >= long(i)) throw std::invalid_argument("sim: a turn follows a later request");
      if (!reqs[i].tokens.empty() && int64_t(reqs[i].tokens.size()) != reqs[i].prompt)
        throw std::invalid_argument("sim: request " + std::to_string(i) + " has " +
                                    std::to_string(reqs[i].tokens.size()) +
                                    " token ids for a prompt of " + std::to_string(reqs[i].prompt));
      if (a >= 0 && next_turn_[size_t(a)] >= 0)
        throw std::invalid_argument("sim: two requests follow request " + std::to_string(a));
      if (a >= 0) next_turn_[size_t(a)] = long(i);
    }
    int64_t tokens = 0;
    for (const auto& r : reqs) tokens += r.output;
    const int64_t every = std::max<int64_t>(1, tokens / 4'000'000);
    for (size_t i = 0; i < reqs.size(); ++i) track_[i].keep_itl = int64_t(i) % every == 0;
    lim_ = cfg.limits;
    lim_.page_size = cfg.cost.page_size;
    ttft_.step_rows = lim_.max_batch_tokens;
    ttft_.chunk_rows = lim_.chunk_size;
  }

  sim_result run() {
    const auto wall0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (reqs_[i].after < 0) push(reqs_[i].arrival, ev::arrival, 0, i, 0);
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
        case ev::fetched:
          fetched(insts_[e.inst], e.a);
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
      r.send_time = t.arrival;
      r.prompt_tokens = reqs_[i].prompt;
      r.cached_tokens = t.cached;
      r.turn = reqs_[i].turn;
      r.index = i;
      r.output_tokens = t.tokens;
      r.success = t.tokens > 0 && !t.failed;
      r.end_time = t.last;
      if (t.failed) {
        r.error_code = "kv_exhausted";
        r.error_message = "the KV arena could not hold its step (shared prefix pages)";
      } else if (!r.success) {
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
    for (const auto& in : insts_) {
      if (!res_.stats.kv_check.empty()) break;
      if (in.arena) res_.stats.kv_check = in.arena->check_invariants();
      if (res_.stats.kv_check.empty() && in.store)
        res_.stats.kv_check = in.store->check_invariants();
    }
    res_.stats.simulated_s = now_;
    res_.stats.ttft_mape = mon_.ttft_mape();
    res_.stats.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return std::move(res_);
  }

 private:
  // One model, so one salt for every arena: a prompt's page hashes are
  // the same in all of them.
  static constexpr uint64_t k_salt = 0x5157;
  // The pages a pull asks another store for at a time (the instance's
  // k_pull_pages): what one page's link cost is spread over.
  static constexpr int32_t k_pull_pages = 16;

  void push(double t, ev kind, uint32_t inst, uint64_t a, uint64_t b) {
    q_.push(event{t, next_order_++, kind, inst, a, b});
  }

  // The policies that weigh what an instance holds of the prompt.
  static bool needs_hashes(placement_policy p) {
    return p == placement_policy::prefix || p == placement_policy::slo;
  }

  // A page in a KV store tier: its KV and its tokens (kv_page::footprint).
  uint64_t page_bytes() const {
    return uint64_t(cfg_.cost.kv_bytes_per_page()) + uint64_t(cfg_.cost.page_size) * 4;
  }

  // Pages an allocation may take: free and reusable ones.
  int32_t available(const sim_instance& in) const {
    return in.arena ? in.arena->available() : in.free_pages;
  }

  // The sequence's pages go back to its arena (released to the prefix
  // index with prefix caching).
  void release(sim_instance& in, sim_seq& s) {
    if (in.arena)
      in.arena->free_sequence(s.id);
    else
      in.free_pages += s.pages;
    s.pages = 0;
  }

  // What the arena evicted from its prefix index goes to its store.
  void spill(sim_instance& in) {
    if (!in.arena || !in.arena->has_evicted()) return;
    auto pages = in.arena->take_evicted();
    res_.stats.spilled_pages += pages.size();
    if (in.store) in.store->put(pages);
  }

  // A generated token: any id, as long as one sequence always draws the
  // same ones (its pages are indexed like a prompt's).
  static int32_t generated_token(uint64_t id, int32_t pos) {
    uint64_t x = id * 0x9e3779b97f4a7c15ull + uint64_t(pos);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return int32_t(256 + x % 31744);
  }

  // A conversation's next turn arrives its think time after this one ended.
  void follow_up(size_t i) {
    const long k = next_turn_[i];
    if (k >= 0) push(now_ + reqs_[size_t(k)].think_s, ev::arrival, 0, uint64_t(k), 0);
  }

  int32_t pages_for(int64_t tokens) const { return kv_pages_for(tokens, lim_.page_size); }

  pd_load load_of(const sim_instance& in) const {
    pd_load l;
    l.id = in.id;
    l.pool = in.pool;
    l.page_size = lim_.page_size;
    l.total_pages = cfg_.cost.kv_pages;
    l.used_pages = cfg_.cost.kv_pages - available(in);
    for (const auto& [id, s] : in.seqs) {
      const bool decoding = s.parked || (s.running && s.total - s.computed == 1);
      if (decoding) {
        ++l.decoding;
        l.running_tokens += s.total;
      } else {
        l.queued_prefills.push_back(s.total - s.computed);
        l.waiting += !s.running && !s.parked;
      }
    }
    l.prefilling = int32_t(l.queued_prefills.size());
    if (auto it = windows_.find(in.id); it != windows_.end()) {
      l.token_interval_ms = it->second.token_interval_ms;
      l.tpot_ms = it->second.tpot_ms;
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

  // The queue counts the router sees of one instance now (exact).
  instance_snapshot counts_of(const sim_instance& in) const {
    instance_snapshot s;
    s.instance = in.id;
    for (const auto& [id, q] : in.seqs) {
      ++(q.running || q.parked ? s.running : s.waiting);
      if (q.total - q.computed > 1) s.queued_prefill_tokens += q.total - q.computed;
    }
    s.free_pages = available(in);
    s.total_pages = cfg_.cost.kv_pages;
    return s;
  }

  // Whether the router's snapshot expired (taking a new one), when stale.
  void refresh_snapshots() {
    if (cfg_.router_staleness_s <= 0 || now_ - snapshot_at_ < cfg_.router_staleness_s) return;
    snapshot_at_ = now_;
    ++res_.stats.router_snapshots;
    snapshots_.clear();
    for (const auto& in : insts_) snapshots_[in.id] = counts_of(in);
    stale_loads_ = loads();
  }

  // A placement counted into the stale snapshot at once, as the real
  // router does (actors/router.cpp), so a burst does not all go to the
  // instance the last snapshot showed idle.
  void counted_prefill(uint64_t id, int32_t prompt) {
    if (cfg_.router_staleness_s <= 0) return;
    if (auto s = snapshots_.find(id); s != snapshots_.end()) {
      ++s->second.waiting;
      s->second.queued_prefill_tokens += prompt;
    }
    for (auto& l : stale_loads_)
      if (l.id == id) {
        l.queued_prefills.push_back(prompt);
        ++l.prefilling;
        ++l.waiting;
      }
  }
  void counted_decode(uint64_t id, int32_t context) {
    if (cfg_.router_staleness_s <= 0) return;
    for (auto& l : stale_loads_)
      if (l.id == id) {
        ++l.decoding;
        l.running_tokens += context;
      }
  }

  // The loads as the router sees them: exact, or its last snapshot (an
  // instance started since is seen once the next one is taken).
  std::vector<pd_load> router_loads() {
    if (cfg_.router_staleness_s <= 0) return loads();
    refresh_snapshots();
    // The pools are the router's own state, never stale.
    auto out = stale_loads_;
    for (auto& l : out) {
      const auto& in = insts_[index_of(l.id)];
      l.pool = in.pool;
      l.age_ms = (now_ - snapshot_at_) * 1000;
    }
    return out;
  }

  // Instance `id` as the router sees it (its snapshot when stale, with the
  // placements counted since).
  pd_load view_of(uint64_t id) {
    for (const auto& l : router_loads())
      if (l.id == id) return l;
    return load_of(insts_[index_of(id)]);
  }

  uint32_t index_of(uint64_t id) const { return uint32_t(id - 1); }

  void arrive(size_t i) {
    const auto& r = reqs_[i];
    track_[i].arrival = now_;
    // Its tokens, when prefix caching needs them: the dataset's, else its
    // own (no other prompt shares them).
    std::vector<int32_t> tokens;
    if (cfg_.prefix_caching) {
      if (!r.tokens.empty())
        tokens.assign(r.tokens.begin(), r.tokens.end());
      else
        for (int32_t k = 0; k < r.prompt; ++k) tokens.push_back(generated_token(i + 1, -1 - k));
    }
    uint64_t target = 0;
    bool prefill_only = false;
    double predicted = 0;
    if (!cfg_.pd) {
      std::vector<uint64_t> hashes;
      if (needs_hashes(cfg_.mixed_policy) && cfg_.prefix_caching)
        hashes = insts_.front().arena->prompt_hashes(tokens);
      std::vector<instance_snapshot> snaps;
      snaps.reserve(insts_.size());
      refresh_snapshots();
      for (const auto& in : insts_) {
        if (!in.active || in.ready_at > now_) continue;
        instance_snapshot s;
        if (cfg_.router_staleness_s <= 0) {
          s = counts_of(in);
        } else {
          auto old = snapshots_.find(in.id);
          if (old == snapshots_.end()) continue;  // not polled yet
          s = old->second;
        }
        // What the prefix and slo policies weigh: the prompt's pages the
        // arena holds (its cached run) and its store's that continue it,
        // each in its tier.  Only the prompt's own hashes: that is all the
        // policies look up.
        if (!hashes.empty() && in.arena) {
          const auto dev = size_t(in.arena->cached_pages(tokens));
          s.prefix_hashes.insert(hashes.begin(), hashes.begin() + std::ptrdiff_t(dev));
          for (size_t k = dev; in.store && k < hashes.size(); ++k) {
            if (in.store->in_host(hashes[k]))
              s.tier_hashes.insert(hashes[k]);
            else if (in.store->in_disk(hashes[k]))
              s.disk_hashes.insert(hashes[k]);
            else
              break;
          }
          if (in.store) {
            s.tier_load_ms_per_page = cfg_.cost.tier_load_ms(k_pull_pages, 0) / k_pull_pages;
            s.disk_load_ms_per_page = cfg_.cost.tier_load_ms(0, k_pull_pages) / k_pull_pages;
          }
        }
        snaps.push_back(std::move(s));
      }
      placement_request pr;
      pr.prompt_tokens = r.prompt;
      pr.page_size = lim_.page_size;
      pr.page_hashes = std::move(hashes);
      auto p = place(cfg_.mixed_policy, pr, snaps, cursor_, model_, cfg_.targets.ttft_ms);
      target = p.instance;
      predicted = p.predicted_ttft_ms;
      if (predicted == 0) predicted = predict_ttft_ms(view_of(target), r.prompt, ttft_);
    } else {
      auto ls = router_loads();
      if (cfg_.pd_placement == "slo") {
        auto c = place_prefill(r.prompt, ls, ttft_, cfg_.targets);
        mon_.placed(c.meets_target);
        target = c.instance;
        predicted = c.predicted_ttft_ms;
      } else {
        target = pick(ls, true);
        predicted = predict_ttft_ms(view_of(target), r.prompt, ttft_);
      }
      if (target != 0) prefill_only = !takes_decode(insts_[index_of(target)].pool);
    }
    if (target == 0) throw std::runtime_error("sim: no instance can take a request");
    counted_prefill(target, r.prompt);
    // As the instance refuses it: a request that can never fit the arena.
    if (int64_t(r.prompt) + r.output > int64_t(cfg_.cost.kv_pages) * lim_.page_size ||
        r.prompt <= 0 || r.output <= 0) {
      ++finished_;
      follow_up(i);
      return;
    }
    track_[i].predicted_ttft_ms = ttft_.steps.samples() > 0 ? predicted : 0;
    sim_seq s;
    s.id = i + 1;
    s.total = r.prompt;
    s.prefill_only = prefill_only;
    s.cls = r.offline ? seq_class::offline : seq_class::online;
    s.tokens = std::move(tokens);
    s.order = ++arrivals_;
    if (!r.offline && cfg_.targets.ttft_ms > 0) s.deadline = now_ * 1000 + cfg_.targets.ttft_ms;
    auto& in = insts_[index_of(target)];
    const double fetch_ms = fetch_prefix(in, s);
    auto& placed = in.seqs.emplace(s.id, std::move(s)).first->second;
    if (fetch_ms > 0) {
      placed.fetching = true;
      push(now_ + fetch_ms / 1000, ev::fetched, index_of(in.id), placed.id, 0);
      return;
    }
    try_step(in);
  }

  // The instance's enqueue_with_prefix: the prompt's pages past its
  // arena's cached run, asked of its store (host, then disk) and then of
  // the other store pick_kv_pull picks; they wait with the sequence until
  // its admission.  Returns the fetch's time in ms (0: nothing fetched).
  double fetch_prefix(sim_instance& in, sim_seq& s) {
    if (!in.arena || !in.store || s.tokens.empty()) return 0;
    const auto hashes = in.arena->prompt_hashes(s.tokens);
    const int32_t have = in.arena->cached_pages(s.tokens);
    const auto want_n = std::min<size_t>(hashes.size() - size_t(have), size_t(available(in)));
    std::span<const uint64_t> want(hashes.data() + have, want_n);
    auto got = in.store->fetch(want);
    double ms = cfg_.cost.tier_load_ms(got.host, got.disk);
    s.fetched_from = std::move(got.from);
    int32_t n = got.pages();
    if (cfg_.kv_pull && size_t(n) < want.size()) {
      // The router's rule, with each link's cost from the cost model.
      const auto rest = want.subspan(size_t(n));
      std::vector<int32_t> runs;
      std::vector<sim_instance*> from;
      const double link_ms =
          cfg_.cost.transfer_ms(int64_t(page_bytes()) * k_pull_pages) / k_pull_pages;
      for (auto& o : insts_) {
        if (&o == &in || !o.store || !o.active) continue;
        runs.push_back(o.store->run_length(rest));
        from.push_back(&o);
      }
      const double compute = compute_ms_per_page(s.total, lim_.page_size, model_);
      const auto pull = pick_kv_pull(runs, std::vector<double>(runs.size(), link_ms), compute);
      if (pull.store >= 0) {
        const int32_t pulled = from[size_t(pull.store)]->store->fetch(rest).pages();
        // In round trips of k_pull_pages, as the instance asks.
        for (int32_t k = 0; k < pulled; k += k_pull_pages)
          ms += cfg_.cost.transfer_ms(int64_t(page_bytes()) * std::min(k_pull_pages, pulled - k));
        s.fetched_from.insert(s.fetched_from.end(), size_t(pulled), 2);
        n += pulled;
      }
    }
    s.fetch_from = have;
    s.fetched = n;
    return n > 0 ? ms : 0;
  }

  void fetched(sim_instance& in, uint64_t id) {
    auto it = in.seqs.find(id);
    if (it == in.seqs.end()) return;
    it->second.fetching = false;
    try_step(in);
  }

  // A first or later admission: the arena's cached run mapped, then the
  // pages its store gave that continue it loaded into fresh pages (engine
  // admit and load_from_tier).
  void admit_cached(sim_instance& in, sim_seq& s) {
    auto m = in.arena->match_prefix(s.id, s.tokens);
    s.computed = m.cached_tokens;
    s.pages = int32_t(m.pages.size());
    const int32_t ps = lim_.page_size;
    const int32_t end = s.fetch_from + s.fetched;
    int32_t n = s.pages >= s.fetch_from ? std::max(0, end - s.pages) : 0;
    n = std::min(n, std::max(0, available(in) - 1));
    s.fetched = 0;  // loaded or not, they are dropped (the engine's s.tier)
    // Where the loaded pages came from (those past the arena's run).
    for (int32_t k = 0; k < n; ++k) {
      const uint8_t from = s.fetched_from[size_t(s.pages - s.fetch_from + k)];
      (from == 0   ? res_.stats.host_hit_tokens
       : from == 1 ? res_.stats.disk_hit_tokens
                   : res_.stats.pulled_tokens) += uint64_t(ps);
    }
    s.fetched_from.clear();
    if (n > 0) {
      const auto hashes = in.arena->prompt_hashes(s.tokens);
      const auto fresh = in.arena->reserve(n);
      spill(in);
      for (int32_t k = 0; k < int32_t(fresh.size()); ++k) {
        const int32_t d = s.pages + k;
        const std::vector<int32_t> page(s.tokens.begin() + size_t(d) * ps,
                                        s.tokens.begin() + size_t(d + 1) * ps);
        in.arena->append_loaded(s.id, fresh[size_t(k)], hashes[size_t(d)],
                                d == 0 ? 0 : hashes[size_t(d - 1)], d, page);
      }
      s.pages += int32_t(fresh.size());
      s.computed += int32_t(fresh.size()) * ps;
    }
    if (s.first_admission) {
      const size_t ri = size_t(s.id - 1);
      track_[ri].cached = s.computed;
      res_.stats.prompt_tokens += uint64_t(s.total);
      res_.stats.device_hit_tokens += uint64_t(m.cached_tokens);
      s.first_admission = false;
    }
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

  // With prefix caching running sequences share pages: the plan needs
  // their tables to count what preempting one frees.
  sched_seq describe(const sim_instance& in, const sim_seq& s) const {
    sched_seq d{s.id, s.cls, s.order, s.computed, s.total, s.pages, s.swapped, {}, s.deadline};
    if (in.arena && s.running && in.arena->has_sequence(s.id)) d.table = in.arena->table(s.id);
    return d;
  }

  // Pages of the arena the sequence alone holds.
  int32_t own_pages(const sim_instance& in, uint64_t id) const {
    int32_t n = 0;
    for (int32_t p : in.arena->table(id)) n += in.arena->refcount(p) == 1;
    return n;
  }

  // The engine's make_room: a step the arena cannot hold (its plan did not
  // see pages shared with parked sequences) preempts the running sequence
  // that runs last and owns a page, never the first; with none, the step's
  // last sequence fails, as the engine fails it.
  void make_room(sim_instance& in, std::unordered_set<uint64_t>& preempted_now) {
    const sim_seq* best = nullptr;
    for (const auto& [id, s] : in.seqs)
      if (s.running && (!best || runs_before(describe(in, s), describe(in, *best)))) best = &s;
    sim_seq* victim = nullptr;
    for (auto& [id, s] : in.seqs)
      if (s.running && &s != best && own_pages(in, id) > 0 &&
          (!victim || runs_before(describe(in, *victim), describe(in, s))))
        victim = &s;
    if (victim) {
      release(in, *victim);
      victim->computed = 0;
      victim->running = false;
      preempted_now.insert(victim->id);
      ++res_.stats.preemptions;
      return;
    }
    sim_seq* last = nullptr;
    for (const auto& c : in.chunks) {
      auto& s = in.seqs.at(c.id);
      if (!last || runs_before(describe(in, *last), describe(in, s))) last = &s;
    }
    const size_t ri = size_t(last->id - 1);
    track_[ri].failed = true;
    release(in, *last);
    in.seqs.erase(last->id);
    ++finished_;
    follow_up(ri);
  }

  // The instance actor's step() with the simulated pages and clock.
  void try_step(sim_instance& in) {
    if (in.busy) return;
    std::unordered_set<uint64_t> preempted_now;
    for (int guard = 0; guard < 100000; ++guard) {
      std::vector<sched_seq> running, waiting;
      for (const auto& [id, s] : in.seqs) {
        if (s.running)
          running.push_back(describe(in, s));
        else if (!s.parked && !s.fetching && !preempted_now.count(id))
          waiting.push_back(describe(in, s));
      }
      auto plan = plan_step(running, waiting, lim_, available(in));
      for (uint64_t v : plan.preempted) {
        auto& s = in.seqs.at(v);
        release(in, s);
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
            const int32_t need = pages_for(s.computed);
            if (in.arena) {
              auto pages = in.arena->reserve(need);
              spill(in);
              // An admission before it in this plan loaded store pages
              // the plan did not count: it waits for the next (engine::admit).
              if (pages.empty()) {
                s.running = false;
                continue;
              }
              in.arena->attach({s.id, s.computed, std::move(pages)});
            } else {
              in.free_pages -= need;
            }
            s.pages = need;
            s.swapped = false;
          } else if (in.arena) {
            admit_cached(in, s);
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
      if (in.arena) {
        std::vector<alloc_request> grow;
        for (const auto& c : in.chunks) grow.push_back({c.id, c.start + c.n_tokens});
        auto a = in.arena->allocate_step(grow);
        if (!a.ok) {
          make_room(in, preempted_now);
          continue;
        }
        for (const auto& t : a.tables) in.seqs.at(t.seq).pages = int32_t(t.pages.size());
        spill(in);
      }
      for (size_t k = 0; k < in.chunks.size(); ++k) {
        const auto& c = in.chunks[k];
        auto& s = in.seqs.at(c.id);
        if (!in.arena) {
          const int32_t need = std::max(0, pages_for(c.start + c.n_tokens) - s.pages);
          s.pages += need;
          in.free_pages -= need;
        }
        rows += c.n_tokens;
        if (k < in.n_decode) decode_rows += c.n_tokens;
        context += int64_t(c.n_tokens) * c.start + int64_t(c.n_tokens) * (c.n_tokens + 1) / 2;
      }
      in.busy = true;
      in.rows = rows;
      in.context = context;
      in.step_ms = cfg_.cost.step_ms(rows, decode_rows, context);
      if (!pipes_.empty()) {
        const size_t i = index_of(in.id);
        in.step_ms = pipeline_step_ms(pipes_[i], cfg_.pipeline, i * size_t(cfg_.pipeline.stages),
                                      in.step_ms, now_, rows, static_cast<double>(context));
      }
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
      mon_.ttft(instance, t.predicted_ttft_ms, (now_ - t.arrival) * 1000, now_);
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
    ttft_.steps.observe(in.rows - in.decode_rows, in.decode_rows, in.context, in.step_ms);
    mon_.step(in.id, in.rows, in.decode_rows, in.step_ms, now_);
    for (size_t k = 0; k < in.chunks.size(); ++k) {
      const auto& c = in.chunks[k];
      auto it = in.seqs.find(c.id);
      if (it == in.seqs.end() || !it->second.running) continue;
      auto& s = it->second;
      s.computed += c.n_tokens;
      // Its computed full pages join the prefix index (the engine's commit).
      if (in.arena) in.arena->commit_full_pages(s.id, s.tokens);
      if (!c.sample) continue;
      const size_t ri = size_t(s.id - 1);
      if (in.arena) s.tokens.push_back(generated_token(s.id, s.total));
      ++s.total;
      record_token(ri, in.id);
      const auto& t = track_[ri];
      if (t.tokens >= reqs_[ri].output) {
        release(in, s);
        if (t.tokens > 1) mon_.tpot(in.id, (t.last - t.first) * 1000 / (t.tokens - 1), now_);
        in.seqs.erase(it);
        ++finished_;
        follow_up(ri);
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
      dst = place_decode(src.id, s.total, router_loads(), cfg_.pd_cfg, cfg_.targets).instance;
    } else {
      dst = pick(router_loads(), false);
    }
    if (dst != 0 && dst != src.id) counted_decode(dst, s.total);
    if (dst == 0 || dst == src.id) {
      s.parked = false;
      s.prefill_only = false;
      s.running = true;  // decodes where it is, pages and all
      return;
    }
    send_kv(src, s, dst);
  }

  // The sequence's KV to instance `dst` through the source's transfer
  // queue; it is parked until it lands.
  void send_kv(sim_instance& src, sim_seq& s, uint64_t dst) {
    s.running = false;
    s.parked = true;
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

  // D->P preemption by migration (pd_config::preempt_migrate): the
  // decoding sequences of an instance that left decode move where
  // plan_evacuation says, those with the most tokens still to generate
  // first (each move frees the most decode work).  A sequence in the step
  // on the device loses that step's token and computes it again there.
  void evacuate(sim_instance& in) {
    std::vector<sim_seq*> decoding;
    for (auto& [id, s] : in.seqs)
      if (s.running && !s.prefill_only && s.total - s.computed == 1) decoding.push_back(&s);
    if (decoding.empty()) return;
    auto left = [&](const sim_seq* s) {
      const size_t ri = size_t(s->id - 1);
      return reqs_[ri].output - track_[ri].tokens;
    };
    std::sort(decoding.begin(), decoding.end(), [&](const sim_seq* a, const sim_seq* b) {
      return left(a) != left(b) ? left(a) > left(b) : a->id < b->id;
    });
    std::vector<int32_t> contexts;
    for (const auto* s : decoding) contexts.push_back(s->total);
    const auto to = plan_evacuation(in.id, contexts, router_loads(), cfg_.pd_cfg, cfg_.targets);
    for (size_t k = 0; k < decoding.size(); ++k) {
      if (to[k] == 0) continue;
      counted_decode(to[k], decoding[k]->total);
      send_kv(in, *decoding[k], to[k]);
      ++res_.stats.evacuated;
    }
  }

  void transfer_done(uint32_t src_i, uint32_t dst_i, uint64_t id) {
    auto& src = insts_[src_i];
    auto it = src.seqs.find(id);
    if (it == src.seqs.end()) return;
    sim_seq s = std::move(it->second);
    release(src, s);
    src.seqs.erase(it);
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
    for (auto& p : pipes_) {
      const auto r = pipeline_window(p, cfg_.pipeline, cfg_.window_s, now_);
      res_.stats.layer_moves += r.layers_moved > 0;
      res_.stats.layers_moved += uint64_t(r.layers_moved);
      res_.stats.head_moves += r.heads_moved > 0;
      res_.stats.heads_home += r.heads_home;
      res_.stats.move_pause_ms += r.pause_ms;
    }
    if (!cfg_.pd || !cfg_.role_switching || cfg_.pd_placement != "slo") return;
    for (const auto& f : decide_flips(router_loads(), w, cfg_.targets, cfg_.pd_cfg, now_, flips_)) {
      auto& in = insts_[index_of(f.instance)];
      in.pool = flip_pool(in.pool, f.to);
      const uint64_t moved_before = res_.stats.evacuated;
      if (in.pool == pd_pool::decode_to_prefill && cfg_.pd_cfg.preempt_migrate) evacuate(in);
      in.pool = settle(in.pool, load_of(in));
      ++res_.stats.flips;
      if (res_.stats.flip_log.size() < 200) {
        char buf[320];
        std::snprintf(buf, sizeof buf, "t=%.1fs instance %llu -> %s (pool %s): %s%s", now_,
                      static_cast<unsigned long long>(f.instance), to_string(f.to),
                      to_string(in.pool), f.why.c_str(),
                      res_.stats.evacuated > moved_before
                          ? ("; " + std::to_string(res_.stats.evacuated - moved_before) +
                             " decoding sequences migrate")
                                .c_str()
                          : "");
        res_.stats.flip_log.push_back(buf);
      }
      try_step(in);
    }
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
  std::vector<sim_pipeline> pipes_;  // per instance, when pipelined
  std::vector<tracker> track_;
  std::priority_queue<event, std::vector<event>, std::greater<event>> q_;
  uint64_t next_order_ = 0;
  double now_ = 0;
  size_t finished_ = 0;
  service_monitor mon_;
  prefill_model model_;
  ttft_model ttft_;  // the TTFT predictor, learning from every step as the router's does
  placement_cursor cursor_;
  flip_memory flips_;
  autoscale_memory scale_mem_;
  std::unordered_map<uint64_t, instance_window> windows_;
  // The router's snapshots when it is stale (cfg_.router_staleness_s):
  // per instance, as of snapshot_at_.
  std::unordered_map<uint64_t, instance_snapshot> snapshots_;
  std::vector<pd_load> stale_loads_;
  double snapshot_at_ = -1;
  std::vector<long> next_turn_;  // a conversation's next turn, by request (-1: none)
  uint64_t arrivals_ = 0;
  size_t rr_prefill_ = 0, rr_decode_ = 0;
  sim_result res_;
};

}  // namespace

sim_result simulate(const sim_config& cfg, const std::vector<sim_request>& reqs) {
  simulation sim(cfg, reqs);
  return sim.run();
}

}  // namespace troupe
