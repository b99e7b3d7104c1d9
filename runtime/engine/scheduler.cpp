#include "runtime/engine/scheduler.hpp"

#include <algorithm>
#include <limits>
#include <tuple>
#include <unordered_map>

namespace troupe {

const char* to_string(seq_class c) {
  return c == seq_class::online ? "online" : "offline";
}

std::string validate(const scheduler_limits& lim) {
  if (lim.max_batch_tokens <= 0) return "max_batch_tokens must be positive";
  if (lim.max_seqs <= 0) return "max_seqs must be positive";
  if (lim.chunk_size <= 0) return "chunk_size must be positive";
  if (lim.page_size <= 0) return "page_size must be positive";
  // Every running decode gets its row in every step, so none starves.
  if (lim.max_seqs > lim.max_batch_tokens) return "max_seqs must not exceed max_batch_tokens";
  return {};
}

bool runs_before(const sched_seq& a, const sched_seq& b) {
  constexpr double none = std::numeric_limits<double>::infinity();
  const double da = a.deadline > 0 ? a.deadline : none;
  const double db = b.deadline > 0 ? b.deadline : none;
  return std::tie(a.cls, da, a.order, a.id) < std::tie(b.cls, db, b.order, b.id);
}

namespace {

std::vector<const sched_seq*> by_priority(const std::vector<sched_seq>& seqs) {
  std::vector<const sched_seq*> out;
  out.reserve(seqs.size());
  for (const auto& s : seqs) out.push_back(&s);
  std::sort(out.begin(), out.end(),
            [](const sched_seq* a, const sched_seq* b) { return runs_before(*a, *b); });
  return out;
}

bool is_decode(const sched_seq& s) {
  return s.total - s.computed == 1;
}

}  // namespace

step_plan plan_step(const std::vector<sched_seq>& running, const std::vector<sched_seq>& waiting,
                    const scheduler_limits& lim, int32_t free_pages) {
  const int32_t ps = lim.page_size;
  auto pages_for = [ps](int64_t tokens) { return static_cast<int32_t>((tokens + ps - 1) / ps); };
  // New pages sequence s needs to compute n more tokens.
  auto need = [&](const sched_seq& s, int32_t n) {
    return std::max(0, pages_for(int64_t(s.computed) + n) - s.pages);
  };

  step_plan plan;
  int32_t free = free_pages;
  auto run = by_priority(running);
  size_t alive = run.size();  // run[alive..] are preempted: victims leave from the back
  // Holders of each known page among the running sequences: a victim's
  // page is free once its last holder is preempted.
  std::unordered_map<int32_t, int32_t> holders;
  for (const sched_seq* s : run)
    for (int32_t p : s->table) ++holders[p];
  auto preempt_last = [&] {
    const sched_seq* v = run[--alive];
    plan.preempted.push_back(v->id);
    if (v->table.empty()) {
      free += v->pages;
      return;
    }
    for (int32_t p : v->table)
      if (--holders[p] == 0) ++free;
  };

  // One pass per class when offline work yields, else one for both.  The
  // classes sort online first, so victims (from the back) are offline
  // ones for as long as any runs.
  const int all = -1;
  std::vector<int> groups = lim.offline_yields
                                ? std::vector<int>{int(seq_class::online), int(seq_class::offline)}
                                : std::vector<int>{all};
  auto in = [](const sched_seq& s, int g) { return g == all || int(s.cls) == g; };
  auto rows = [&] { return plan.decode.size() + plan.prefill.size(); };
  std::vector<const sched_seq*> queue = by_priority(waiting);
  size_t next_waiting = 0;
  size_t n_running = alive;
  // Admission is first come first served within priority: once a waiting
  // sequence does not fit, nobody behind it is admitted (an offline one
  // would take the pages an online one waits for).
  bool blocked = false;

  int32_t cap = lim.max_batch_tokens;
  for (int g : groups) {
    // Offline rows beside online ones are capped (offline_rows, the
    // instance's TPOT guard); alone, offline work has the whole budget.
    if (g == int(seq_class::offline) && plan.tokens > 0)
      cap = std::min(lim.max_batch_tokens, plan.tokens + std::max(0, lim.offline_rows));
    // Decode rows first: preempt until every one of them that fits the
    // token budget has its page.  (Offline decodes after online admissions
    // do not preempt, as a preempting plan admits nobody: they take the
    // pages there are and the rest skip the step.)
    const bool may_preempt = g != int(seq_class::offline) || plan.admitted.empty();
    for (; may_preempt;) {
      int32_t pages = 0, room = cap - plan.tokens;
      for (size_t i = 0; i < alive && room > 0; ++i)
        if (is_decode(*run[i]) && in(*run[i], g)) {
          pages += need(*run[i], 1);
          --room;
        }
      if (pages <= free) break;
      preempt_last();
    }
    for (size_t i = 0; i < alive && plan.tokens < cap; ++i) {
      const sched_seq& s = *run[i];
      if (!is_decode(s) || !in(s, g)) continue;
      if (need(s, 1) > free) continue;
      free -= need(s, 1);
      plan.new_pages += need(s, 1);
      plan.decode.push_back({s.id, s.computed, 1, true, {}});
      ++plan.tokens;
    }

    // Then the running prefills, each chunk shrunk to the pages left.  When
    // nothing at all fits, preempt until something does: the last survivor
    // alone always fits, since the instance never lets a sequence outgrow
    // the arena.
    const size_t prefill_before = plan.prefill.size();
    for (;;) {
      plan.prefill.resize(prefill_before);
      int32_t f = free, tokens = plan.tokens, pages = 0;
      bool waiting_prefill = false;  // a running prefill of this pass is alive
      for (size_t i = 0; i < alive; ++i) {
        const sched_seq& s = *run[i];
        if (is_decode(s) || !in(s, g)) continue;
        waiting_prefill = true;
        if (tokens >= cap) break;
        int32_t n = std::min({s.total - s.computed, lim.chunk_size, cap - tokens});
        n = std::min<int64_t>(n, int64_t(s.pages + f) * ps - s.computed);
        if (n <= 0) continue;
        f -= need(s, n);
        pages += need(s, n);
        tokens += n;
        plan.prefill.push_back({s.id, s.computed, n, s.computed + n == s.total, {}});
      }
      if (rows() > 0 || !waiting_prefill) {
        free = f;
        plan.tokens = tokens;
        plan.new_pages += pages;
        break;
      }
      preempt_last();
    }

    // Admissions, unless this step had to preempt (the freed pages go to
    // the survivors, not to newcomers who would be preempted next).
    if (!plan.preempted.empty()) return plan;
    if (blocked) break;
    n_running = alive + plan.admitted.size();
    for (; next_waiting < queue.size(); ++next_waiting) {
      const sched_seq& s = *queue[next_waiting];
      if (!in(s, g)) break;  // the queue is by class: the rest are the next pass's
      if (plan.tokens >= cap) break;
      int32_t n = std::min({s.total - s.computed, lim.chunk_size, cap - plan.tokens});
      auto fits = [&] {
        if (n_running >= size_t(lim.max_seqs)) return false;
        if (s.swapped) return pages_for(int64_t(s.computed) + n) <= free;
        return std::min<int64_t>(n, int64_t(free) * ps - s.computed) > 0;
      };
      if (!fits()) {
        // Co-location: an online sequence that cannot start takes the
        // place of running offline ones.  The plan then only preempts;
        // the caller plans again and admits it (a preempting plan admits
        // nobody).
        blocked = true;
        if (g != int(seq_class::online) || !plan.admitted.empty()) break;
        while (!fits() && alive > 0 && run[alive - 1]->cls == seq_class::offline) {
          preempt_last();
          --n_running;
        }
        if (plan.preempted.empty()) break;
        plan.decode.clear();
        plan.prefill.clear();
        plan.tokens = 0;
        plan.new_pages = 0;
        return plan;
      }
      int32_t pages;
      if (s.swapped) {
        // Its whole swapped-out table comes back with it.
        pages = pages_for(int64_t(s.computed) + n);
      } else {
        n = std::min<int64_t>(n, int64_t(free) * ps - s.computed);
        pages = pages_for(int64_t(s.computed) + n);
      }
      free -= pages;
      plan.new_pages += pages;
      plan.tokens += n;
      plan.admitted.push_back(s.id);
      plan.prefill.push_back({s.id, s.computed, n, s.computed + n == s.total, {}});
      ++n_running;
    }
  }
  return plan;
}

}  // namespace troupe
