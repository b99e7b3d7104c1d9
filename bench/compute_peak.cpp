#include "bench/compute_peak.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace troupe {

namespace {

// Sixteen independent chains: an FMA's latency (4 cycles) times two FMA
// ports needs at least eight in flight, and more hide the loop's own
// instructions.  acc = acc * m + a with m just under 1 stays finite and
// normal forever; the sums come back so the compiler keeps the work.
constexpr int k_chains = 16;
constexpr long k_block = 4096;  // iterations between clock reads

__attribute__((target("avx512f"))) double fma_block_avx512(long blocks, float seed) {
  __m512 acc[k_chains];
  for (int c = 0; c < k_chains; ++c) acc[c] = _mm512_set1_ps(seed + static_cast<float>(c));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < blocks * k_block; ++i)
    for (int c = 0; c < k_chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
  __m512 s = acc[0];
  for (int c = 1; c < k_chains; ++c) s = _mm512_add_ps(s, acc[c]);
  // (Not _mm512_reduce_add_ps: GCC 12's warns of an uninitialised operand.)
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  double r = 0;
  for (float v : out) r += v;
  return r;
}

__attribute__((target("avx2,fma"))) double fma_block_avx2(long blocks, float seed) {
  __m256 acc[k_chains];
  for (int c = 0; c < k_chains; ++c) acc[c] = _mm256_set1_ps(seed + static_cast<float>(c));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < blocks * k_block; ++i)
    for (int c = 0; c < k_chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int c = 1; c < k_chains; ++c) s = _mm256_add_ps(s, acc[c]);
  _mm256_store_ps(out, s);
  double r = 0;
  for (float v : out) r += v;
  return r;
}

// No FMA: a multiply and an add, two operations as an FMA's.
double fma_block_sse2(long blocks, float seed) {
  __m128 acc[k_chains];
  for (int c = 0; c < k_chains; ++c) acc[c] = _mm_set1_ps(seed + static_cast<float>(c));
  const __m128 m = _mm_set1_ps(0.999999f), a = _mm_set1_ps(1e-6f);
  for (long i = 0; i < blocks * k_block; ++i)
    for (int c = 0; c < k_chains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], m), a);
  alignas(16) float out[4];
  __m128 s = acc[0];
  for (int c = 1; c < k_chains; ++c) s = _mm_add_ps(s, acc[c]);
  _mm_store_ps(out, s);
  return static_cast<double>(out[0]) + out[1] + out[2] + out[3];
}

// Where each pass's sums go, so the compiler keeps the work.
volatile double g_sink = 0;

struct kernel {
  double (*run)(long, float);
  int lanes;
  const char* isa;
};

kernel widest_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {fma_block_avx512, 16, "avx512f"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {fma_block_avx2, 8, "avx2+fma"};
  return {fma_block_sse2, 4, "sse2"};
}

}  // namespace

compute_peak f32_fma_peak(const compute_options& o) {
  if (o.threads < 1 || o.threads > 256) throw std::invalid_argument("threads must be in [1, 256]");
  if (!(o.seconds >= 0.01 && o.seconds <= 60))
    throw std::invalid_argument("seconds must be in [0.01, 60]");
  if (o.passes < 1 || o.passes > 1000) throw std::invalid_argument("passes must be in [1, 1000]");
  const kernel k = widest_kernel();
  using clock = std::chrono::steady_clock;
  const double flops_per_block = 2.0 * k.lanes * k_chains * static_cast<double>(k_block);
  double best = 0;
  for (int pass = 0; pass < o.passes; ++pass) {
    // Every thread runs whole blocks until the pass's time is up; the
    // pass's rate is all their blocks over the longest thread's time.
    std::vector<long> done(static_cast<size_t>(o.threads), 0);
    std::vector<double> took(static_cast<size_t>(o.threads), 0), sums(took);
    std::vector<std::thread> workers;
    for (int t = 0; t < o.threads; ++t)
      workers.emplace_back([&, t] {
        const auto start = clock::now();
        const auto end = start + std::chrono::duration<double>(o.seconds);
        double s = 0;
        long n = 0;
        do {
          s += k.run(1, static_cast<float>(t + 1));
          ++n;
        } while (clock::now() < end);
        done[static_cast<size_t>(t)] = n;
        took[static_cast<size_t>(t)] = std::chrono::duration<double>(clock::now() - start).count();
        sums[static_cast<size_t>(t)] = s;
      });
    for (auto& w : workers) w.join();
    long blocks = 0;
    for (long n : done) blocks += n;
    const double wall = *std::max_element(took.begin(), took.end());
    best = std::max(best, static_cast<double>(blocks) * flops_per_block / wall);
    for (double s : sums) g_sink = g_sink + s;
  }
  return {best, k.isa};
}

}  // namespace troupe
