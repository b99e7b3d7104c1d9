#pragma once
// The machine's memory read bandwidth, the ceiling of single-stream decode:
// a decode step streams every weight once, so a model whose weights take
// B bytes a token cannot decode faster than bandwidth / B tokens a second
// (issue 38's roofline).  `troupe bench bandwidth` reports both, and the
// engine benchmark's share of that bound is in docs/bench_engine.md.
#include <cstddef>

namespace troupe {

struct bandwidth_options {
  int threads = 2;                 // readers, each streaming its own share of the buffer
  size_t bytes = size_t(1) << 30;  // the buffer, far past every cache
  int passes = 5;                  // the best pass is the figure (the machine is shared)
};

// Bytes a second, read by `threads` threads streaming the buffer at once,
// the fastest of the passes.  Throws std::invalid_argument on options out of
// range (threads 1-256, bytes from 1 MiB to half the memory available now:
// the least of the RAM, MemAvailable and the cgroup's limit; passes 1-1000).
double read_bandwidth(const bandwidth_options& o);

}  // namespace troupe
