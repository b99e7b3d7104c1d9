#include "tools/troupe/local_engine.hpp"

#include <cstdio>
#include <stdexcept>
#include <string>

namespace troupe::cli {

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

instance_stats query_stats(caf::actor_system& sys, const instance_actor& inst) {
  caf::scoped_actor self{sys};
  instance_stats out;
  std::string err;
  self->request(inst, caf::infinite, stats_atom::value)
      .receive([&](instance_stats& s) { out = std::move(s); },
               [&](caf::error& e) { err = sys.render(e); });
  if (!err.empty()) throw std::runtime_error("instance stats: " + err);
  return out;
}

// Enqueues every request at once, then collects tokens until each has its
// last batch.  Progress goes to stderr when `progress` is set.
run_result run_all(caf::actor_system& sys, const instance_actor& inst,
                   std::vector<sequence_request> reqs, bool progress) {
  caf::scoped_actor self{sys};
  auto sink = caf::actor_cast<token_sink_actor>(self.ptr());
  const size_t n = reqs.size();
  std::vector<uint64_t> got(n, 0);
  std::vector<bool> started(n, false);
  run_result res;
  const auto t0 = clock_type::now();
  for (auto& r : reqs) {
    r.sink = sink;
    self->send(caf::actor_cast<caf::actor>(inst), enqueue_atom::value, std::move(r));
  }
  size_t open = n;
  size_t n_started = 0;
  auto last_progress = t0;
  std::string err;
  while (open > 0 && err.empty()) {
    self->receive(
        [&](tokens_atom, const token_batch& b) {
          const size_t i = static_cast<size_t>(b.id);
          if (i >= n) return;
          if (!started[i] && !b.tokens.empty()) {
            started[i] = true;
            if (++n_started == n) res.last_first_token_s = seconds_between(t0, clock_type::now());
          }
          got[i] += b.tokens.size();
          res.generated += b.tokens.size();
          if (n_started == n) res.generated_after_prefill += b.tokens.size();
          if (b.finish != finish_reason::none) {
            --open;
            if (b.finish != finish_reason::max_tokens) {
              ++res.bad_finishes;
              std::fprintf(stderr, "request %zu ended with %s%s%s\n", i, to_string(b.finish),
                           b.error.empty() ? "" : ": ", b.error.c_str());
            }
          }
        },
        [&](preempted_atom, uint64_t, bool) { ++res.preempt_notices; },
        [&](int32_t) {},  // enqueue replies
        [&](caf::error& e) { err = sys.render(e); });
    if (progress) {
      const auto now = clock_type::now();
      if (seconds_between(last_progress, now) >= 2.0 || open == 0) {
        last_progress = now;
        std::fprintf(stderr,
                     "\r[bench batch] %6.1f s  started %zu/%zu  finished %zu/%zu  tokens %llu",
                     seconds_between(t0, now), n_started, n, n - open, n,
                     static_cast<unsigned long long>(res.generated));
        if (open == 0) std::fprintf(stderr, "\n");
      }
    }
  }
  if (!err.empty()) throw std::runtime_error("enqueue: " + err);
  res.wall_s = seconds_between(t0, clock_type::now());
  return res;
}

}  // namespace troupe::cli
