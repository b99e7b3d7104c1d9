#pragma once
// Elapsed wall time in milliseconds, as the actors report it (traces, step
// timings, device idle gaps).
#include <chrono>

namespace troupe {

inline double ms_between(std::chrono::steady_clock::time_point a,
                         std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double ms_since(std::chrono::steady_clock::time_point t) {
  return ms_between(t, std::chrono::steady_clock::now());
}

}  // namespace troupe
