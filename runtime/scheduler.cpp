#include "runtime/scheduler.hpp"

#include <algorithm>
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
  return std::tie(a.cls, a.order, a.id) < std::tie(b.cls, b.order, b.id);
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

  // Decode rows first: preempt until every one of them has its page.
  for (;;) {
    int32_t pages = 0;
    for (size_t i = 0; i < alive; ++i)
      if (is_decode(*run[i])) pages += need(*run[i], 1);
    if (pages <= free) break;
    preempt_last();
  }
  for (size_t i = 0; i < alive && plan.tokens < lim.max_batch_tokens; ++i) {
    const sched_seq& s = *run[i];
    if (!is_decode(s)) continue;
    free -= need(s, 1);
    plan.new_pages += need(s, 1);
    plan.decode.push_back({s.id, s.computed, 1, true});
    ++plan.tokens;
  }

  // Then the running prefills, each chunk shrunk to the pages left.  When
  // nothing at all fits, preempt until something does: the last survivor
  // alone always fits, since the instance never lets a sequence outgrow
  // the arena.
  const size_t decode_rows = plan.decode.size();
  for (;;) {
    plan.prefill.clear();
    int32_t f = free, tokens = plan.tokens, pages = 0;
    for (size_t i = 0; i < alive && tokens < lim.max_batch_tokens; ++i) {
      const sched_seq& s = *run[i];
      if (is_decode(s)) continue;
      int32_t n = std::min({s.total - s.computed, lim.chunk_size, lim.max_batch_tokens - tokens});
      n = std::min<int64_t>(n, int64_t(s.pages + f) * ps - s.computed);
      if (n <= 0) continue;
      f -= need(s, n);
      pages += need(s, n);
      tokens += n;
      plan.prefill.push_back({s.id, s.computed, n, s.computed + n == s.total});
    }
    if (decode_rows > 0 || !plan.prefill.empty() || alive == 0) {
      free = f;
      plan.tokens = tokens;
      plan.new_pages += pages;
      break;
    }
    preempt_last();
  }

  // Admissions, unless this step had to preempt (the freed pages go to the
  // survivors, not to newcomers who would be preempted next).
  if (!plan.preempted.empty()) return plan;
  size_t n_running = alive;
  for (const sched_seq* w : by_priority(waiting)) {
    if (n_running >= size_t(lim.max_seqs) || plan.tokens >= lim.max_batch_tokens) break;
    const sched_seq& s = *w;
    int32_t n =
        std::min({s.total - s.computed, lim.chunk_size, lim.max_batch_tokens - plan.tokens});
    int32_t pages;
    if (s.swapped) {
      // Its whole swapped-out table comes back with it, or it waits.
      pages = pages_for(int64_t(s.computed) + n);
      if (pages > free) break;
    } else {
      n = std::min<int64_t>(n, int64_t(free) * ps - s.computed);
      if (n <= 0) break;
      pages = pages_for(int64_t(s.computed) + n);
    }
    free -= pages;
    plan.new_pages += pages;
    plan.tokens += n;
    plan.admitted.push_back(s.id);
    plan.prefill.push_back({s.id, s.computed, n, s.computed + n == s.total});
    ++n_running;
  }
  return plan;
}

}  // namespace troupe
