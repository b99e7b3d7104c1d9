#include "bench/compute_peak.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_X86 1
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace troupe {

namespace {

// Independent chains of acc = acc * m + a, m just under 1, so the values
// stay finite and normal forever.  An FMA's latency (4 cycles) times two
// FMA ports needs at least eight chains in flight: sixteen with AVX-512's
// 32 registers, twelve with AVX2's 16 (sixteen would spill one, and its
// store and reload would slow its chain).  Each block returns its sum, so
// the compiler keeps the work.
constexpr long k_iterations = 4096;  // per block, between clock reads

#ifdef TROUPE_X86
constexpr int k_chains_avx512 = 16;
__attribute__((target("avx512f"))) double fma_block_avx512(float seed) {
  __m512 acc[k_chains_avx512];
  for (int c = 0; c < k_chains_avx512; ++c) acc[c] = _mm512_set1_ps(seed + static_cast<float>(c));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < k_iterations; ++i)
    for (int c = 0; c < k_chains_avx512; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
  __m512 s = acc[0];
  for (int c = 1; c < k_chains_avx512; ++c) s = _mm512_add_ps(s, acc[c]);
  // (Not _mm512_reduce_add_ps: GCC 12's warns of an uninitialised operand.)
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  double r = 0;
  for (float v : out) r += v;
  return r;
}

constexpr int k_chains_avx2 = 12;
__attribute__((target("avx2,fma"))) double fma_block_avx2(float seed) {
  __m256 acc[k_chains_avx2];
  for (int c = 0; c < k_chains_avx2; ++c) acc[c] = _mm256_set1_ps(seed + static_cast<float>(c));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < k_iterations; ++i)
    for (int c = 0; c < k_chains_avx2; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
  __m256 s = acc[0];
  for (int c = 1; c < k_chains_avx2; ++c) s = _mm256_add_ps(s, acc[c]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  double r = 0;
  for (float v : out) r += v;
  return r;
}
#endif

// Anywhere else (and on x86 without AVX2 and FMA): a multiply and an add
// on four-lane vectors as the compiler makes them, two operations as an
// FMA's two.
constexpr int k_chains_generic = 12;
using float4_t = float __attribute__((vector_size(16)));
double mul_add_block_generic(float seed) {
  float4_t acc[k_chains_generic];
  for (int c = 0; c < k_chains_generic; ++c) {
    const float v = seed + static_cast<float>(c);
    acc[c] = float4_t{v, v, v, v};
  }
  const float4_t m = {0.999999f, 0.999999f, 0.999999f, 0.999999f};
  const float4_t a = {1e-6f, 1e-6f, 1e-6f, 1e-6f};
  for (long i = 0; i < k_iterations; ++i)
    for (int c = 0; c < k_chains_generic; ++c) acc[c] = acc[c] * m + a;
  double r = 0;
  for (int c = 0; c < k_chains_generic; ++c) r += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  return r;
}

// Where each pass's sums go, so the compiler keeps the work.
volatile double g_sink = 0;

struct kernel {
  double (*run)(float);
  int lanes, chains;
  const char* isa;
};

kernel widest_kernel() {
#ifdef TROUPE_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {fma_block_avx512, 16, k_chains_avx512, "avx512f"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {fma_block_avx2, 8, k_chains_avx2, "avx2+fma"};
#endif
  return {mul_add_block_generic, 4, k_chains_generic, "generic"};
}

}  // namespace

compute_peak f32_fma_peak(const compute_options& o) {
  if (o.threads < 1 || o.threads > 256) throw std::invalid_argument("threads must be in [1, 256]");
  if (!(o.seconds >= 0.01 && o.seconds <= 60))
    throw std::invalid_argument("seconds must be in [0.01, 60]");
  if (o.passes < 1 || o.passes > 1000) throw std::invalid_argument("passes must be in [1, 1000]");
  const kernel k = widest_kernel();
  using clock = std::chrono::steady_clock;
  const double flops_per_block = 2.0 * k.lanes * k.chains * static_cast<double>(k_iterations);
  double best = 0;
  for (int pass = 0; pass < o.passes; ++pass) {
    // The threads start together (each waits for all to be up) and run
    // whole blocks until the pass's time is up; the rate is all their
    // blocks over the time from the common start to the last one's end.
    const size_t n = static_cast<size_t>(o.threads);
    std::vector<long> done(n, 0);
    std::vector<double> sums(n, 0);
    std::vector<clock::time_point> ends(n);
    std::atomic<int> up{0};
    std::atomic<bool> go{false};
    clock::time_point start;
    std::vector<std::thread> workers;
    for (size_t t = 0; t < n; ++t)
      workers.emplace_back([&, t] {
        up.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        const auto end = start + std::chrono::duration_cast<clock::duration>(
                                     std::chrono::duration<double>(o.seconds));
        double s = 0;
        long blocks = 0;
        do {
          s += k.run(static_cast<float>(t + 1));
          ++blocks;
        } while (clock::now() < end);
        ends[t] = clock::now();
        done[t] = blocks;
        sums[t] = s;
      });
    while (up.load() < o.threads) std::this_thread::yield();
    start = clock::now();
    go.store(true, std::memory_order_release);
    for (auto& w : workers) w.join();
    long blocks = 0;
    for (long b : done) blocks += b;
    const double wall =
        std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - start).count();
    best = std::max(best, static_cast<double>(blocks) * flops_per_block / wall);
    for (double s : sums) g_sink = g_sink + s;
  }
  return {best, k.isa};
}

}  // namespace troupe
