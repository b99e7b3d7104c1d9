#include "actors/dp_group.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include "messages/gateway.hpp"  // request_actor, migrate_atom
#include "runtime/service/dp_balance.hpp"

namespace troupe {

namespace {

struct member {
  router_instance inst;
  dp_replica_status st;
  pending_admissions pending;  // admitted, maybe not in its reports yet
  std::vector<sequence_load> seqs;
};

struct dp_group_state {
  dp_group_state() = default;  // not an aggregate: CAF would build it from the self pointer
  std::vector<member> members;
  dp_group_status totals;
  int32_t page_size = 16;
  bool checking = false;  // a check's reports are coming in
  int32_t over = 0;       // checks in a row that found the gap above the threshold
  int32_t moving = 0;     // migrations not answered yet
  // Lockstep rounds.
  uint64_t round = 0;
  bool round_open = false;
  std::set<uint64_t> ready;                       // replicas with work for the next round
  std::vector<std::pair<uint64_t, double>> done;  // this round's steps so far
  std::set<uint64_t> stepping;                    // this round's replicas not done yet
  static inline const char* name = "dp_group";
};

using self_ptr = dp_group_actor::stateful_pointer<dp_group_state>;
constexpr auto k_report_timeout = std::chrono::seconds(3);
constexpr auto k_migration_timeout = std::chrono::seconds(30);

// A replica's report: its sequences, and which admissions arrived.
void take_report(member& m, sequences_report& r) {
  m.st.kv_tokens = 0;
  for (const auto& s : r.seqs) m.st.kv_tokens += s.tokens;
  m.st.sequences = static_cast<int32_t>(r.seqs.size());
  m.seqs = std::move(r.seqs);
  m.pending.report(r.enqueues, std::chrono::steady_clock::now());
}

member* find(dp_group_state& st, uint64_t id) {
  for (auto& m : st.members)
    if (m.inst.id == id) return &m;
  return nullptr;
}

std::vector<replica_load> loads(const dp_group_state& st) {
  std::vector<replica_load> out;
  for (const auto& m : st.members)
    out.push_back({m.inst.id, m.st.state == "serving", m.st.capacity_tokens,
                   m.st.kv_tokens + m.pending.tokens()});
  return out;
}

void maybe_start_round(self_ptr self);

// The round ends when every replica in it reported (or went down): it
// lasted as long as its slowest step; each replica waited for that one.
void maybe_end_round(self_ptr self) {
  auto& st = self->state;
  if (!st.round_open || !st.stepping.empty()) return;
  st.round_open = false;
  if (!st.done.empty()) {
    double slowest = 0, sum = 0;
    for (const auto& [id, ms] : st.done) {
      slowest = std::max(slowest, ms);
      sum += ms;
    }
    ++st.totals.rounds;
    st.totals.round_ms += slowest;
    st.totals.straggler_ms += slowest - sum / double(st.done.size());
    for (const auto& [id, ms] : st.done)
      if (auto* m = find(st, id)) {
        m->st.step_ms += ms;
        m->st.wait_ms += slowest - ms;
      }
  }
  st.done.clear();
  maybe_start_round(self);
}

// A round starts when a replica has work: every serving replica steps in
// it (a dummy step when it has nothing).
void maybe_start_round(self_ptr self) {
  auto& st = self->state;
  if (!st.totals.config.lockstep || st.round_open || st.ready.empty()) return;
  st.ready.clear();
  ++st.round;
  st.round_open = true;
  for (const auto& m : st.members) {
    if (m.st.state != "serving") continue;
    st.stepping.insert(m.inst.id);
    self->send(m.inst.actor, dp_go_atom::value, st.round);
  }
  maybe_end_round(self);  // none serves: the round is over at once
}

// Moves one sequence: its request actor exports, imports and re-points.
void move_sequence(self_ptr self, const dp_move& mv, const token_sink_actor& sink) {
  auto& st = self->state;
  ++st.moving;
  auto req = caf::actor_cast<request_actor>(sink);
  self->request(req, k_migration_timeout, migrate_atom::value, mv.to)
      .then(
          [self, mv](uint64_t) {
            auto& s = self->state;
            --s.moving;
            ++s.totals.migrations;
            s.totals.migrated_tokens += mv.tokens;
            if (auto* m = find(s, mv.from)) ++m->st.moved_out;
            if (auto* m = find(s, mv.to)) ++m->st.moved_in;
          },
          [self, mv](caf::error& e) {
            auto& s = self->state;
            --s.moving;
            ++s.totals.failed_migrations;
            spdlog::debug("dp_group: moving request {} to instance {}: {}", mv.sequence, mv.to,
                          self->system().render(e));
          });
}

// Every report of a check is in: measure, decide, move.
void decide(self_ptr self) {
  auto& st = self->state;
  auto& t = st.totals;
  const auto l = loads(st);
  const dp_balance b = balance_of(l);
  ++t.checks;
  t.gap_over_mean = b.gap_over_mean;
  if (b.mean_tokens > 0) {
    t.mean_gap_over_mean += (b.gap_over_mean - t.mean_gap_over_mean) / double(++t.loaded_checks);
    t.max_gap_tokens = std::max(t.max_gap_tokens, b.max_tokens - b.min_tokens);
  }
  st.over = b.gap_over_mean > t.config.gap_share ? st.over + 1 : 0;
  // Moves from an earlier check still under way: their tokens are in
  // flight and the loads are not settled.
  if (!t.config.rebalance || st.moving > 0 || st.over < t.config.patience) return;
  const member* from = find(st, b.most_loaded);
  if (!from) return;
  std::vector<movable_sequence> movable;
  for (const auto& s : from->seqs)
    if (s.decoding && s.left >= t.config.min_left) movable.push_back({s.id, s.tokens});
  const auto moves = plan_dp_moves(l, movable, t.config.gap_share, t.config.max_moves);
  if (moves.empty()) return;
  st.over = 0;
  ++t.rebalances;
  t.last_decision = "gap " + std::to_string(b.max_tokens - b.min_tokens) + " KV tokens (" +
                    std::to_string(int(b.gap_over_mean * 100)) +
                    "% of the mean): " + std::to_string(moves.size()) +
                    " sequence(s) from instance " + std::to_string(b.most_loaded) + " to " +
                    std::to_string(b.least_loaded);
  spdlog::info("dp_group: {}", t.last_decision);
  for (const auto& mv : moves)
    for (const auto& s : from->seqs)
      if (s.id == mv.sequence) move_sequence(self, mv, s.sink);
}

// Asks every serving replica for its sequences; decides once all answered.
void check(self_ptr self) {
  auto& st = self->state;
  if (st.checking) return;
  st.checking = true;
  auto left = std::make_shared<size_t>(0);
  for (const auto& m : st.members) *left += m.st.state == "serving" ? 1 : 0;
  auto one_done = [self, left] {
    if (--*left > 0) return;
    self->state.checking = false;
    decide(self);
  };
  if (*left == 0) {
    st.checking = false;
    return;
  }
  for (auto& m : st.members) {
    if (m.st.state != "serving") continue;
    const uint64_t id = m.inst.id;
    self->request(m.inst.actor, k_report_timeout, sequences_atom::value)
        .then(
            [self, id, one_done](sequences_report& r) {
              if (auto* m = find(self->state, id)) take_report(*m, r);
              one_done();
            },
            [one_done](caf::error&) { one_done(); });
  }
}

// A replica joins (or, on a node that came back, joins again): the group
// watches it, learns its KV capacity and, in lockstep, makes it wait for
// rounds.
void join(self_ptr self, router_instance r) {
  auto& st = self->state;
  member* m = find(st, r.id);
  if (!m) {
    st.members.emplace_back();
    m = &st.members.back();
    m->st.instance = r.id;
  } else if (m->inst.actor) {
    if (m->inst.actor == r.actor && m->st.state != "down") return;  // already in
    self->demonitor(m->inst.actor.address());
  }
  m->inst = std::move(r);
  m->st.state = "serving";
  m->pending.reset();
  m->seqs.clear();
  self->monitor(m->inst.actor);
  const uint64_t id = m->inst.id;
  self->request(m->inst.actor, k_report_timeout, stats_atom::value)
      .then(
          [self, id](instance_stats& s) {
            if (auto* m = find(self->state, id))
              m->st.capacity_tokens = int64_t(s.kv.total) * self->state.page_size;
          },
          [](caf::error&) {});
  if (st.totals.config.lockstep)
    self->request(m->inst.actor, k_report_timeout, dp_join_atom::value,
                  caf::actor_cast<caf::actor>(self), id)
        .then([](int32_t) {},
              [self, id](caf::error& e) {
                spdlog::error("dp_group: instance {} did not join the lockstep: {}", id,
                              self->system().render(e));
              });
}

dp_group_actor::behavior_type dp_group_behavior(self_ptr self,
                                                std::vector<router_instance> replicas,
                                                dp_group_config cfg, int32_t page_size) {
  auto& st = self->state;
  st.totals.config = cfg;
  st.page_size = page_size;
  for (auto& r : replicas) join(self, std::move(r));
  // A replica died: it is down, and the round no longer waits for it.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& m : st.members) {
      if (m.inst.actor.address() != dm.source) continue;
      m.st.state = "down";
      st.ready.erase(m.inst.id);
      st.stepping.erase(m.inst.id);
    }
    maybe_end_round(self);
  });
  self->send(self, tick_atom::value);
  return {
      // Admission: the serving replica with the most free KV takes the prompt.
      [self](dp_admit_atom, int32_t prompt_tokens,
             const std::vector<uint64_t>& unavailable) -> caf::result<placement_reply> {
        auto& st = self->state;
        auto l = loads(st);
        for (auto& r : l)
          if (std::find(unavailable.begin(), unavailable.end(), r.instance) != unavailable.end())
            r.serving = false;
        const uint64_t id = admit_most_free_kv(l);
        member* m = find(st, id);
        if (!m)
          return caf::make_error(caf::sec::invalid_argument, "no replica of the group serves");
        const int64_t free = m->st.capacity_tokens - m->st.kv_tokens - m->pending.tokens();
        m->pending.admit(prompt_tokens, std::chrono::steady_clock::now());
        ++m->st.admitted;
        return placement_reply{id,
                               m->inst.actor,
                               "dp group: most free KV (" + std::to_string(free) + " tokens)",
                               false,
                               0,
                               {},
                               {}};
      },
      // A replica joins: a node's instance that is new or came back.
      [self](dp_add_atom, router_instance& r) {
        spdlog::info("dp_group: instance {} on {} joins", r.id, r.node.empty() ? "here" : r.node);
        join(self, std::move(r));
      },
      // The group's balance, moves and rounds, with each replica's figures.
      [self](dp_status_atom) {
        auto& st = self->state;
        dp_group_status out = st.totals;
        for (const auto& m : st.members) out.replicas.push_back(m.st);
        return out;
      },
      // Its own timer: check the balance, again after interval_ms.
      [self](tick_atom) {
        check(self);
        self->delayed_send(self, std::chrono::milliseconds(self->state.totals.config.interval_ms),
                           tick_atom::value);
      },
      // Lockstep: a serving replica has work; a round starts if none is open.
      [self](dp_ready_atom, uint64_t id) {
        auto& st = self->state;
        const member* m = find(st, id);
        if (!m || m->st.state != "serving") return;
        st.ready.insert(id);
        maybe_start_round(self);
      },
      // Lockstep: a replica's step of the current round is done.
      [self](dp_done_atom, uint64_t id, uint64_t round, double ms, bool dummy) {
        auto& st = self->state;
        if (round != st.round || !st.stepping.erase(id)) return;
        st.done.emplace_back(id, ms);
        if (dummy)
          if (auto* m = find(st, id)) ++m->st.dummy_steps;
        maybe_end_round(self);
      },
  };
}

}  // namespace

dp_group_actor spawn_dp_group(caf::actor_system& sys, std::vector<router_instance> replicas,
                              dp_group_config cfg, int32_t page_size) {
  if (cfg.interval_ms < 1) throw std::invalid_argument("dp group: interval_ms must be 1 or more");
  if (cfg.gap_share < 0) throw std::invalid_argument("dp group: gap_share must be 0 or more");
  return sys.spawn(dp_group_behavior, std::move(replicas), cfg, page_size);
}

}  // namespace troupe
