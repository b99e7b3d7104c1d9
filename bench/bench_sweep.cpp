#include "bench/bench_sweep.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

namespace troupe::bench {

namespace {

bool positive_finite(double x) {
  return x > 0 && std::isfinite(x);
}

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

void sweep_spec::check() const {
  if (!(target > 0 && target <= 1))
    throw std::invalid_argument("--goodput-target must be in (0, 1] (got " + num(target) + ")");
  if (!positive_finite(start)) throw std::invalid_argument("--sweep-start must be a positive rate");
  if (max != 0 && !positive_finite(max))
    throw std::invalid_argument("--sweep-max must be a positive rate (or 0: no cap)");
  if (max != 0 && max < start)
    throw std::invalid_argument("--sweep-max (" + num(max) + ") is below --sweep-start (" +
                                num(start) + ")");
  if (max_probes < 1) throw std::invalid_argument("--sweep-steps must be at least 1");
  if (!positive_finite(precision)) throw std::invalid_argument("--sweep-precision must be > 0");
}

void check_sweep(const sweep_spec& spec, const slo& goals) {
  if (!goals.any())
    throw std::invalid_argument(
        "--sweep needs --goodput (ttft:MS tpot:MS e2el:MS): the SLOs its target counts against");
  spec.check();
}

bool meets_target(size_t good, size_t sent, double target) {
  // Compared as counts so that 9 of 10 meets 0.9 despite rounding.
  return sent > 0 && static_cast<double>(good) >= target * static_cast<double>(sent) - 1e-9;
}

std::optional<double> sweep_answer(const std::vector<sweep_probe>& probes) {
  std::optional<double> best;
  for (const auto& p : probes)
    if (p.pass && (!best || p.rate > *best)) best = p.rate;
  return best;
}

std::optional<double> next_sweep_rate(const std::vector<sweep_probe>& probes,
                                      const sweep_spec& spec) {
  if (probes.empty()) return spec.start;
  if (probes.size() >= spec.max_probes) return std::nullopt;
  const auto lo = sweep_answer(probes);
  if (!lo) {
    // Nothing passed yet: halve below the lowest fail.
    double lowest = probes.front().rate;
    for (const auto& p : probes) lowest = std::min(lowest, p.rate);
    return lowest / 2;
  }
  std::optional<double> hi;  // the lowest fail above the highest pass
  for (const auto& p : probes)
    if (!p.pass && p.rate > *lo && (!hi || p.rate < *hi)) hi = p.rate;
  if (!hi) {
    if (spec.max != 0 && *lo >= spec.max) return std::nullopt;
    const double up = *lo * 2;
    return spec.max != 0 ? std::min(up, spec.max) : up;
  }
  if (*hi / *lo - 1 < spec.precision) return std::nullopt;
  return std::sqrt(*lo * *hi);
}

std::vector<sweep_probe> run_sweep(const sweep_spec& spec,
                                   const std::function<sweep_probe(double rate)>& probe) {
  std::vector<sweep_probe> probes;
  while (auto rate = next_sweep_rate(probes, spec)) {
    auto p = probe(*rate);
    p.rate = *rate;
    probes.push_back(p);
  }
  return probes;
}

}  // namespace troupe::bench
