#include "bench/memory_bandwidth.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe {

namespace {

// Sums one share with four independent chains, so the loop is bound by
// the loads rather than by one adder's latency; the sum is kept (and
// returned) so the compiler cannot drop the reads.
uint64_t stream_sum(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a ^ b ^ c ^ d;
}

// The memory this process may take now: the least of the RAM, what the
// kernel counts available (MemAvailable), and the cgroup's limit (a
// container or CI job); 0 where none could be read.
size_t usable_memory() {
  size_t best = 0;
  auto take = [&best](size_t v) {
    if (v > 0 && (best == 0 || v < best)) best = v;
  };
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) take(static_cast<size_t>(pages) * static_cast<size_t>(page));
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    size_t kib = 0;
    if (key == "MemAvailable:" && meminfo >> kib) {
      take(kib * 1024);
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");  // "max" where unlimited
  size_t limit = 0;
  if (cgroup >> limit) take(limit);
  return best;
}

}  // namespace

double read_bandwidth(const bandwidth_options& o) {
  if (o.threads < 1 || o.threads > 256) throw std::invalid_argument("threads must be in [1, 256]");
  if (o.bytes < (size_t(1) << 20)) throw std::invalid_argument("the buffer must be at least 1 MiB");
  if (o.passes < 1 || o.passes > 1000) throw std::invalid_argument("passes must be in [1, 1000]");
  // Overcommitted memory would hand out a buffer past what is free and the
  // first pass would end in the OOM killer, not an error.
  const size_t usable = usable_memory();
  if (usable > 0 && o.bytes > usable / 2)
    throw std::invalid_argument("the buffer (" + std::to_string(o.bytes >> 20) +
                                " MiB) must be at most half of the memory available now (" +
                                std::to_string(usable >> 20) + " MiB)");
  const size_t words = o.bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);
  // Each thread touches its own share first, so the pages are mapped
  // (and, on a NUMA host, placed) before any pass is timed.
  const size_t share = words / static_cast<size_t>(o.threads);
  auto run_all = [&](auto body) {
    std::vector<std::thread> ts;
    for (int t = 0; t < o.threads; ++t)
      ts.emplace_back(body, static_cast<size_t>(t) * share,
                      t + 1 == o.threads ? words : static_cast<size_t>(t + 1) * share);
    for (auto& t : ts) t.join();
  };
  run_all([&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  });
  std::atomic<uint64_t> sink{0};  // the sums land in an atomic: the reads cannot be dropped
  double best = 0;
  for (int pass = 0; pass < o.passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    run_all([&](size_t lo, size_t hi) { sink ^= stream_sum(buf.get() + lo, hi - lo); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / s);
  }
  return best;
}

}  // namespace troupe
