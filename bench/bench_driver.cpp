#include "bench/bench_driver.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

namespace troupe::bench {

namespace {

using clock = std::chrono::steady_clock;

// A counting semaphore whose capacity 0 means unbounded.
class slots {
 public:
  explicit slots(size_t cap) : cap_(cap) {}
  void acquire() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return cap_ == 0 || used_ < cap_; });
    ++used_;
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      --used_;
    }
    cv_.notify_one();
  }

 private:
  size_t cap_, used_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

struct progress_state {
  std::atomic<size_t> sent{0}, done{0}, failed{0};
  std::atomic<long> tokens{0};
  size_t total = 0;
};

void print_progress(const progress_state& p, double elapsed, bool tty, bool final_line) {
  const size_t sent = p.sent, done = p.done, failed = p.failed;
  const long tokens = p.tokens;
  std::fprintf(stderr,
               "%s[%7.1fs] sent %zu/%zu  done %zu  failed %zu  in flight %zu  output %ld tok "
               "(%.1f tok/s)%s",
               tty ? "\r" : "", elapsed, sent, p.total, done, failed, sent - done - failed, tokens,
               elapsed > 0 ? tokens / elapsed : 0.0, tty && !final_line ? "" : "\n");
  std::fflush(stderr);
}

// Runs the backend, turning an escaping exception into a failed record.
void run_one(bench_backend& backend, const bench_request& req, const request_context& ctx,
             request_record& rec) {
  rec.prompt_tokens = req.prompt_len;
  rec.send_time = ctx.now();
  try {
    backend.run(req, ctx, rec);
  } catch (const std::exception& e) {
    rec.success = false;
    rec.error_code = "client";
    rec.error_message = e.what();
  }
  rec.end_time = ctx.now();
  if (!rec.success && rec.error_code.empty()) rec.error_code = "unknown";
}

}  // namespace

driver_result run_benchmark(bench_backend& backend, const std::vector<bench_request>& requests,
                            driver_options opts) {
  const size_t n = std::min(requests.size(), opts.arrivals.size());
  progress_state prog;
  prog.total = n;

  // Warm-up: not timed, not recorded; failures are reported, not fatal.
  auto ctx = opts.request;
  const auto warm_t0 = clock::now();
  ctx.now = [warm_t0] { return std::chrono::duration<double>(clock::now() - warm_t0).count(); };
  for (size_t i = 0; i < opts.num_warmups && !requests.empty(); ++i) {
    request_record rec;
    run_one(backend, requests[i % requests.size()], ctx, rec);
    if (!rec.success)
      std::fprintf(stderr, "warm-up request %zu failed: %s %s\n", i, rec.error_code.c_str(),
                   rec.error_message.c_str());
  }

  const auto t0 = clock::now();
  ctx.now = [t0] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  ctx.tokens_seen = &prog.tokens;

  std::mutex done_mu;
  std::condition_variable done_cv;
  bool finished = false;
  std::thread reporter;
  if (opts.progress) {
    const bool tty = isatty(STDERR_FILENO) != 0;
    reporter = std::thread([&, tty] {
      const auto period = std::chrono::seconds(tty ? 1 : 10);
      std::unique_lock lock(done_mu);
      while (!done_cv.wait_for(lock, period, [&] { return finished; }))
        print_progress(prog, ctx.now(), tty, false);
    });
  }

  driver_result result;
  result.records.resize(n);
  std::vector<char> went(n, 0);
  slots free_slots(opts.max_concurrency);
  // A multi-turn conversation's later turns follow its previous one on the
  // same worker, `think_s` after it ended; only first turns (after < 0)
  // take the arrival schedule, in order.
  std::vector<long> next_turn(n, -1);
  for (size_t i = 0; i < n; ++i)
    if (requests[i].after >= 0 && size_t(requests[i].after) < n)
      next_turn[size_t(requests[i].after)] = long(i);
  // Runs request i, whose slot is held, and releases the slot.
  auto send = [&](size_t i) {
    went[i] = 1;
    auto& rec = result.records[i];
    rec.turn = requests[i].turn;
    rec.index = i;
    run_one(backend, requests[i], ctx, rec);
    ++(rec.success ? prog.done : prog.failed);
    free_slots.release();
  };
  std::vector<std::thread> workers;
  size_t root = 0;
  for (size_t i = 0; i < n; ++i) {
    if (requests[i].after >= 0) continue;
    const double at = opts.arrivals[root++];
    if (opts.duration_s > 0 && at > opts.duration_s) break;
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(at)));
    // The slot is taken here, in arrival order, before the thread exists.
    free_slots.acquire();
    ++prog.sent;
    workers.emplace_back([&, i] {
      send(i);
      for (long k = next_turn[i]; k >= 0; k = next_turn[size_t(k)]) {
        const double think = requests[size_t(k)].think_s;
        if (opts.duration_s > 0 && ctx.now() + think > opts.duration_s) break;
        std::this_thread::sleep_for(std::chrono::duration<double>(think));
        free_slots.acquire();
        ++prog.sent;
        send(size_t(k));
      }
    });
  }
  for (auto& w : workers) w.join();
  result.duration_s = ctx.now();
  // The requests that went, in dataset order.
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!went[i]) continue;
    if (kept != i) result.records[kept] = std::move(result.records[i]);
    ++kept;
  }
  result.records.resize(kept);

  if (opts.progress) {
    {
      std::lock_guard lock(done_mu);
      finished = true;
    }
    done_cv.notify_all();
    reporter.join();
    print_progress(prog, result.duration_s, isatty(STDERR_FILENO) != 0, true);
  }
  return result;
}

}  // namespace troupe::bench
