#pragma once
// Recursive least squares with forgetting over K features: the online fit
// behind the router's step-time models (prefill_model in placement.hpp,
// step_time_model in ttft_predictor.hpp), which learn from every step the
// instances report.
#include <cmath>
#include <cstdint>

namespace troupe {

template <int K>
class rls {
 public:
  explicit rls(double forgetting) : lambda_(forgetting) {
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < K; ++j) p_[i][j] = i == j ? k_start : 0;
  }

  void observe(const double (&x)[K], double y) {
    double px[K] = {};
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < K; ++j) px[i] += p_[i][j] * x[j];
    double denom = lambda_;
    for (int i = 0; i < K; ++i) denom += x[i] * px[i];
    double gain[K];
    for (int i = 0; i < K; ++i) gain[i] = px[i] / denom;
    double err = y;
    for (int i = 0; i < K; ++i) err -= theta_[i] * x[i];
    for (int i = 0; i < K; ++i) theta_[i] += gain[i] * err;
    // P is symmetric: P - gain (P x)', over the forgetting factor.
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < K; ++j) p_[i][j] = (p_[i][j] - gain[i] * px[j]) / lambda_;
    // Forgetting with inputs that do not vary (a steady load repeats the
    // same step shapes) makes P grow without bound until the update is all
    // rounding error (RLS "windup"; millions of steps in the simulator blew
    // predictions up).  Capping P's trace at its starting size keeps the
    // gain bounded.
    double trace = 0;
    for (int i = 0; i < K; ++i) trace += p_[i][i];
    if (trace > K * k_start || !std::isfinite(trace)) {
      const bool finite = std::isfinite(trace);
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < K; ++j)
          p_[i][j] = finite ? p_[i][j] * (K * k_start / trace) : (i == j ? k_start : 0);
    }
    ++samples_;
  }

  double predict(const double (&x)[K]) const {
    double y = 0;
    for (int i = 0; i < K; ++i) y += theta_[i] * x[i];
    return y;
  }

  const double* coefficients() const { return theta_; }
  uint64_t samples() const { return samples_; }

 private:
  static constexpr double k_start = 1e6;  // the starting covariance: no prior to speak of
  double lambda_;
  double theta_[K] = {};
  double p_[K][K];
  uint64_t samples_ = 0;
};

}  // namespace troupe
