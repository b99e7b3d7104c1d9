// The integer-dot-product path (kernels/quantize.cl, the Q kernels of
// kernels/matmul.cl, rmsnorm_q8) against a plain C++ reference: activations
// quantized per block of 32 as llama.cpp's q8_1 (scale and scaled sum
// rounded to half), and the products of 4- and 8-bit weights with them.
// Both dot-product builds run where they can: the portable one everywhere,
// the VNNI inline assembly where the device is PoCL on an x86 CPU with it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/device_weights.hpp"
#include "runtime/device/llama_forward.hpp"
#include "runtime/model/tensor_type.hpp"
#include "tests/unit/kernel_reference.hpp"
#include "tests/unit/kernel_test_io.hpp"

namespace troupe {
namespace {

namespace ref = kernel_ref;

// Q5_0 runs packed (its low nibbles, fifth bits and scale apart) with
// Q8_0's products, IQ4_NL as Q8_0 (device_weights): the reference below
// reads their own blocks, so the packing and the widening are checked too.
// Q4_K runs as Q4_1 (eight blocks per super-block), where rows allow it;
// Q5_1 as Q4_1 with five-bit quants, packed as the file packs them.
constexpr tensor_type k_quant_types[] = {tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0,
                                         tensor_type::q5_0, tensor_type::q5_1, tensor_type::iq4_nl,
                                         tensor_type::q4_k};

using kernel_test::shared_context;

// [0]: the portable build; [1]: the host's own integer dot products, as the
// engine builds them: TROUPE_VNNI (vpdpbusd) on an AVX-512 VNNI host,
// TROUPE_AVX2 (vpmaddubsw) on an AVX2 one (none elsewhere).
shared_context& context_for(bool native) {
  static shared_context shared[2];
  return kernel_test::make_once(
      shared[native ? 1 : 0],
      [native](cl::context& c) -> std::optional<std::string> {
        const std::string base = "-cl-std=CL1.2 -cl-mad-enable -DTROUPE_TILE=4";
        if (!native) return base;
        if (c.x86_vnni()) return base + " -DTROUPE_VNNI";
        if (c.x86_avx2()) return base + " -DTROUPE_AVX2";
        return std::nullopt;
      },
      "no AVX-512 VNNI or AVX2 on a PoCL CPU device here");
}

class KernelInt8 : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!context_for(GetParam()).ctx)
      GTEST_SKIP() << (GetParam() ? "native build: " : "") << context_for(GetParam()).no_device;
  }
  static cl::context& ctx() { return *context_for(GetParam()).ctx; }
};

using kernel_test::download;
using kernel_test::random_floats;
using kernel_test::suffix;
using kernel_test::upload;
using kernel_test::view_of;

// Quantized activations as the kernels leave them.
struct q8_rows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> s;  // pairs: (half-rounded scaled sum, scale * sum)
};

q8_rows download_q8(cl::context& c, const cl::buffer& q, const cl::buffer& d, const cl::buffer& s,
                    int rows, int K) {
  const size_t n = static_cast<size_t>(rows) * K;
  return {download<int8_t>(c, q, n), download<float>(c, d, n / 32), download<float>(c, s, n / 16)};
}

// Checks one row's blocks against the quantization of `want` (the exact
// values the kernel was to quantize).
void check_q8_row(const q8_rows& got, int row, int K, const std::vector<double>& want,
                  double value_tol) {
  for (int b = 0; b < K / 32; ++b) {
    SCOPED_TRACE("row " + std::to_string(row) + " block " + std::to_string(b));
    const size_t blk = static_cast<size_t>(row) * (K / 32) + b;
    double amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(want[b * 32 + i]));
    const double d = amax / 127.0;
    EXPECT_NEAR(got.d[blk], ref::round_half(static_cast<float>(d)), ref::half_step(d) * 0.51);
    long sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = got.q[blk * 32 + i];
      sum += q;
      const double exact = d > 0 ? want[b * 32 + i] / d : 0.0;
      ASSERT_LE(std::fabs(q - exact), 0.5 + value_tol) << "value " << i;
    }
    EXPECT_EQ(got.s[2 * blk + 1], got.d[blk] * static_cast<float>(sum));
    EXPECT_NEAR(got.s[2 * blk], d * sum,
                ref::half_step(d * sum) * 0.51 + 1e-6 * std::fabs(d * sum));
  }
}

TEST_P(KernelInt8, QuantizeBlocksAsLlamaCppQ8_1) {
  auto& c = ctx();
  std::mt19937 rng(77);
  const int K = 96, R = 3;
  auto x = random_floats(static_cast<size_t>(R) * K, -3.0f, 3.0f, rng);
  for (int i = 0; i < 32; ++i) x[K + 32 + i] = 0.0f;  // an all-zero block: scale 0, quants 0
  const auto xb = upload(c, x);
  const auto qb = c.alloc(x.size()), db = c.alloc(x.size() / 32 * 4),
             sb = c.alloc(x.size() / 16 * 4);
  auto k = c.make_kernel("quantize_q8");
  k.args(xb, K, qb, db, sb);
  c.launch(k, {static_cast<size_t>(K / 32), static_cast<size_t>(R)});
  const auto got = download_q8(c, qb, db, sb, R, K);
  for (int r = 0; r < R; ++r)
    check_q8_row(got, r, K, std::vector<double>(x.begin() + r * K, x.begin() + (r + 1) * K), 1e-4);
}

TEST_P(KernelInt8, RmsnormQ8QuantizesTheNormalizedRows) {
  auto& c = ctx();
  std::mt19937 rng(78);
  const int D = 128, R = 4;
  const float eps = 1e-5f;
  const auto x = random_floats(static_cast<size_t>(R) * D, -2.0f, 2.0f, rng);
  const auto w = random_floats(D, 0.5f, 1.5f, rng);
  const std::vector<int32_t> rows = {3, 0, 0, 1};
  const auto xb = upload(c, x), wb = upload(c, w), rb = upload(c, rows);
  auto k = c.make_kernel("rmsnorm_q8");
  for (const int gather : {0, 1}) {
    SCOPED_TRACE("gather " + std::to_string(gather));
    const size_t n = static_cast<size_t>(R) * D;
    const auto qb = c.alloc(n), db = c.alloc(n / 32 * 4), sb = c.alloc(n / 16 * 4);
    k.args(xb, wb, qb, db, sb, rb, gather, D, eps);
    c.launch(k, {static_cast<size_t>(R)});
    const auto got = download_q8(c, qb, db, sb, R, D);
    for (int r = 0; r < R; ++r) {
      const float* xr = &x[static_cast<size_t>(gather ? rows[r] : r) * D];
      double ss = 0;
      for (int i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const double scale = 1.0 / std::sqrt(ss / D + eps);
      std::vector<double> want(D);
      for (int i = 0; i < D; ++i) want[i] = xr[i] * scale * w[i];
      check_q8_row(got, r, D, want, 1e-3);  // the float norm is off by a few ulps
    }
  }
}

// Block b of row r of a GGUF matrix as the Q kernels read it: values u
// (unsigned for the 4-bit types, signed for q8_0), scale, and the
// coefficients of the offset terms (see common.cl).
struct ublock {
  int u[32];
  double d, ms, mq;
};

ublock unpack(tensor_type t, const std::vector<uint8_t>& bytes, int K, int r, int b) {
  const size_t at =
      row_bytes(t, K) * r + (t == tensor_type::q4_k ? 0 : traits_of(t).block_bytes * b);
  auto half_at = [&](size_t o) {
    uint16_t h;
    std::memcpy(&h, &bytes[at + o], 2);
    return static_cast<double>(half_to_float(h));
  };
  ublock u{};
  if (t == tensor_type::q4_k) {  // sub-block b % 8 of super-block b / 8, as Q4_1
    float d[8], m[8];
    uint8_t qs[8][16];
    split_q4_k_to_q4_1(&bytes[row_bytes(t, K) * r], b / 8, d, m, qs);
    for (int i = 0; i < 16; ++i) {
      u.u[i] = qs[b % 8][i] & 0xF;
      u.u[16 + i] = qs[b % 8][i] >> 4;
    }
    u.d = d[b % 8];
    u.ms = m[b % 8];
    return u;
  }
  if (t == tensor_type::q5_1) {  // llama.cpp: Q4_1's formula, u up to 31
    float d, m;
    uint8_t q[32];
    split_q5_1(&bytes[row_bytes(t, K) * r], b, d, m, q);
    for (int i = 0; i < 32; ++i) u.u[i] = q[i];
    u.d = d;
    u.ms = m;
    return u;
  }
  u.d = half_at(0);
  if (widens_to_q8_0(t)) {  // llama.cpp: Q8_0 activations, d * dx * sum(q * qx)
    uint16_t h = 0;
    int8_t q[32];
    widen_block_to_q8_0(t, &bytes[row_bytes(t, K) * r], b, h, q);
    for (int i = 0; i < 32; ++i) u.u[i] = q[i];
    return u;
  }
  if (t == tensor_type::q8_0) {  // signed, no offset term
    for (int i = 0; i < 32; ++i) u.u[i] = static_cast<int8_t>(bytes[at + 2 + i]);
    return u;
  }
  const size_t qs = t == tensor_type::q4_1 ? 4 : 2;
  for (int i = 0; i < 16; ++i) {
    u.u[i] = bytes[at + qs + i] & 0xF;
    u.u[16 + i] = bytes[at + qs + i] >> 4;
  }
  if (t == tensor_type::q4_1)
    u.ms = half_at(2);
  else
    u.mq = -8 * u.d;
  return u;
}

// Row n of W times row t of the quantized activations, by llama.cpp's
// formula, in double; and the magnitude that bounds a float evaluation.
ref::dot_result q8_dot(tensor_type type, const std::vector<uint8_t>& bytes, int K, int n,
                       const q8_rows& x, int t) {
  ref::dot_result r{0, 0};
  for (int b = 0; b < K / 32; ++b) {
    const ublock w = unpack(type, bytes, K, n, b);
    const size_t blk = static_cast<size_t>(t) * (K / 32) + b;
    long isum = 0, iabs = 0;
    for (int i = 0; i < 32; ++i) {
      isum += static_cast<long>(w.u[i]) * x.q[blk * 32 + i];
      iabs += std::labs(static_cast<long>(w.u[i]) * x.q[blk * 32 + i]);
    }
    const double dd = w.d * x.d[blk];
    const double off = w.ms * x.s[2 * blk] + w.mq * x.s[2 * blk + 1];
    r.dot += dd * isum + off;
    r.mag += std::fabs(dd) * iabs + std::fabs(off);
  }
  return r;
}

struct launch_shape {
  int tile, rows_per_item;
};
constexpr launch_shape k_launches[] = {{1, 1}, {1, 3}, {4, 1}, {4, 3}};

std::string kernel_suffix(const launch_shape& ls) {
  return ls.tile == 1 ? "_t1" : ls.rows_per_item == 1 ? "_t4" : "_tiled";
}

void launch_matmul(cl::context& c, const cl::kernel& k, int units, const launch_shape& ls, int T) {
  const size_t items = static_cast<size_t>((units + ls.rows_per_item - 1) / ls.rows_per_item);
  const size_t groups = static_cast<size_t>(ls.tile == 1 ? T : (T + 3) / 4);
  c.launch(k, {items, groups}, {16, 1});
}

// x quantized on the device: the buffers the Q kernels read, and their
// contents for the reference.
struct quantized_input {
  cl::buffer q, d, s;
  q8_rows host;
};

// q8_k_halves: as Q8_K with sums per 16 values (KU6 weights' input),
// else per 32 as q8_1.
quantized_input quantize_on_device(cl::context& c, const std::vector<float>& x, int T, int K,
                                   bool q8_k_halves = false) {
  quantized_input in;
  const auto xb = upload(c, x);
  in.q = c.alloc(x.size());
  in.d = c.alloc(x.size() / 32 * 4);
  in.s = c.alloc(x.size() / 16 * 4);
  auto k = c.make_kernel(q8_k_halves ? "quantize_q8_k" : "quantize_q8");
  if (q8_k_halves)
    k.args(xb, K, in.q, in.d, in.s, 1);
  else
    k.args(xb, K, in.q, in.d, in.s);
  c.launch(k, {static_cast<size_t>(K / (q8_k_halves ? 256 : 32)), static_cast<size_t>(T)});
  in.host = download_q8(c, in.q, in.d, in.s, T, K);
  return in;
}

TEST_P(KernelInt8, MatmulEveryQuantTypeTileAndShapeMatchesIntegerDot) {
  auto& c = ctx();
  std::mt19937 rng(2024);
  for (const auto& [K, N] :
       {std::pair{32, 5}, std::pair{96, 7}, std::pair{256, 37}, std::pair{1024, 19}}) {
    for (const tensor_type type : k_quant_types) {
      if (K % static_cast<int>(traits_of(type).block_elems) != 0) continue;
      SCOPED_TRACE("type " + suffix(type) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
      const auto bytes = ref::random_matrix(type, K, N, rng);
      const tensor_view v{"w", type, {K, N}, bytes.data(), bytes.size()};
      const auto dm = upload_matrix(c, {&v});
      for (const launch_shape ls : k_launches) {
        auto k = c.make_kernel("matmul_xq_" + suffix(dm.type) + kernel_suffix(ls));
        for (const int T : {1, 4, 7}) {
          for (const int acc : {0, 1}) {
            SCOPED_TRACE("tile " + std::to_string(ls.tile) + " rows_per_item " +
                         std::to_string(ls.rows_per_item) + " T=" + std::to_string(T) +
                         " accumulate=" + std::to_string(acc));
            const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
            const auto in = quantize_on_device(c, x, T, K);
            const int ldy = N + 2;
            const auto y0 = random_floats(static_cast<size_t>(T) * ldy, -1.0f, 1.0f, rng);
            const auto yb = upload(c, y0);
            k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, yb, K, N, T, ldy, acc, ls.rows_per_item);
            launch_matmul(c, k, N, ls, T);
            const auto y = download<float>(c, yb, y0.size());
            int bad = 0;
            for (int t = 0; t < T; ++t)
              for (int n = 0; n < ldy; ++n) {
                const size_t i = static_cast<size_t>(t) * ldy + n;
                if (n >= N) {
                  bad += y[i] != y0[i];
                  continue;
                }
                const auto d = q8_dot(type, bytes, K, n, in.host, t);
                const double want = acc ? y0[i] + d.dot : d.dot;
                if (std::fabs(y[i] - want) > ref::dot_tol(d.mag) + 1e-6 && ++bad <= 4)
                  ADD_FAILURE() << "y[" << t << "][" << n << "] = " << y[i] << ", want " << want;
              }
            EXPECT_EQ(bad, 0);
          }
        }
      }
    }
  }
}

TEST_P(KernelInt8, MatmulGluGatesUpBySiluOfGate) {
  auto& c = ctx();
  std::mt19937 rng(2025);
  const int K = 256, F = 21;
  for (const tensor_type type : k_quant_types) {
    SCOPED_TRACE("type " + suffix(type));
    const auto bytes = ref::random_matrix(type, K, 2 * F, rng);
    const tensor_view v{"w", type, {K, 2 * F}, bytes.data(), bytes.size()};
    const auto dm = upload_matrix(c, {&v});
    for (const launch_shape ls : k_launches) {
      auto k = c.make_kernel("matmul_glu_xq_" + suffix(dm.type) + kernel_suffix(ls));
      const int T = 5;
      const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
      const auto in = quantize_on_device(c, x, T, K);
      const auto hb = c.alloc(static_cast<size_t>(T) * F * 4);
      k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, hb, K, F, T, ls.rows_per_item, hb, hb, hb, 0, hb);
      launch_matmul(c, k, F, ls, T);
      const auto h = download<float>(c, hb, static_cast<size_t>(T) * F);
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < F; ++n) {
          const auto g = q8_dot(type, bytes, K, n, in.host, t);
          const auto u = q8_dot(type, bytes, K, F + n, in.host, t);
          EXPECT_NEAR(h[static_cast<size_t>(t) * F + n], ref::silu(g.dot) * u.dot,
                      ref::glu_tol(g.dot, ref::dot_tol(g.mag), u.dot, ref::dot_tol(u.mag)))
              << "h[" << t << "][" << n << "] tile " << ls.tile;
        }
    }
  }
}

// With quant_out (work-items of whole blocks), h is also written quantized:
// the quantization of the float h it wrote.
TEST_P(KernelInt8, MatmulGluWritesHQuantized) {
  auto& c = ctx();
  std::mt19937 rng(2026);
  const int K = 128, F = 96, T = 5;
  for (const tensor_type type : k_quant_types) {
    if (type == tensor_type::q4_k) continue;  // rows of 128: no whole super-block
    SCOPED_TRACE("type " + suffix(type));
    const auto bytes = ref::random_matrix(type, K, 2 * F, rng);
    const tensor_view v{"w", type, {K, 2 * F}, bytes.data(), bytes.size()};
    const auto dm = upload_matrix(c, {&v});
    for (const char* tile : {"_t1", "_t4", "_tiled"}) {
      auto k = c.make_kernel(std::string("matmul_glu_xq_") + suffix(dm.type) + tile);
      const int tt = std::string(tile) == "_t1" ? 1 : 4;
      const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
      const auto in = quantize_on_device(c, x, T, K);
      const size_t n = static_cast<size_t>(T) * F;
      const auto hb = c.alloc(n * 4), oq = c.alloc(n), od = c.alloc(n / 32 * 4),
                 os = c.alloc(n / 16 * 4);
      k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, hb, K, F, T, 32, oq, od, os, 1, hb);
      c.launch(k, {static_cast<size_t>(F / 32), static_cast<size_t>((T + tt - 1) / tt)});
      const auto h = download<float>(c, hb, n);
      const auto got = download_q8(c, oq, od, os, T, F);
      for (int t = 0; t < T; ++t)
        check_q8_row(got, t, F, std::vector<double>(h.begin() + t * F, h.begin() + (t + 1) * F),
                     1e-4);
    }
  }
}

// Q4_1 and Q8_0 in panels (Q4_1P, Q8_0P; kernels/matmul_panels.cl): the
// plain and gated products against llama.cpp's formula in double, launched
// as the engine launches them (work-items of whole panels), h also
// quantized, and every launch's values bit for bit the first one's: a
// row's sum is one chain over its blocks whatever the tile, as the
// engine's recomputations need.
struct qpanel_launch {
  int tile, rows_per_item;
  const char* kernel;
};
constexpr qpanel_launch k_qpanel_launches[] = {
    {1, 32, "_t1"}, {1, 16, "_t1"}, {4, 32, "_t4"}, {4, 32, "_tiled"}, {4, 16, "_tiled"}};

// The panel types and the file types they hold.
constexpr std::pair<tensor_type, tensor_type> k_panel_types[] = {
    {tensor_type::q4_1, tensor_type::q4_1p}, {tensor_type::q8_0, tensor_type::q8_0p}};

TEST_P(KernelInt8, QuantizedPanelsMatchTheIntegerDotAndEveryTileAlike) {
  auto& c = ctx();
  std::mt19937 rng(2031);
  for (const auto& [type, panel_type] : k_panel_types)
    for (const auto& [K, N] :
         {std::pair{32, 32}, std::pair{64, 640}, std::pair{96, 48}, std::pair{576, 96}}) {
      SCOPED_TRACE("type " + suffix(type) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
      const auto bytes = ref::random_matrix(type, K, N, rng);
      const size_t rb = row_bytes(type, K);
      const tensor_view a{"a", type, {K, 16}, bytes.data(), rb * 16};
      const tensor_view b{"b", type, {K, N - 16}, bytes.data() + rb * 16, rb * (N - 16)};
      const auto dm = upload_matrix(c, {&a, &b}, true);  // two parts, as Wq, Wk, Wv go up
      ASSERT_EQ(dm.type, panel_type);
      for (const int T : {1, 3, 4, 7, 9}) {
        for (const int acc : {0, 1}) {
          const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
          const auto in = quantize_on_device(c, x, T, K);
          const int ldy = N + 3;  // columns N..ldy-1 must stay untouched
          const auto y0 = random_floats(static_cast<size_t>(T) * ldy, -1.0f, 1.0f, rng);
          std::vector<float> first;
          for (const qpanel_launch pl : k_qpanel_launches) {
            SCOPED_TRACE(std::string(pl.kernel) + " rows_per_item " +
                         std::to_string(pl.rows_per_item) + " T=" + std::to_string(T) +
                         " accumulate=" + std::to_string(acc));
            auto k = c.make_kernel("matmul_xq_" + suffix(panel_type) + pl.kernel);
            const auto yb = upload(c, y0);
            k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, yb, K, N, T, ldy, acc, pl.rows_per_item);
            c.launch(k,
                     {static_cast<size_t>((N + pl.rows_per_item - 1) / pl.rows_per_item),
                      static_cast<size_t>((T + pl.tile - 1) / pl.tile)},
                     {1, 1});
            const auto y = download<float>(c, yb, y0.size());
            int bad = 0;
            for (int t = 0; t < T; ++t)
              for (int n = 0; n < ldy; ++n) {
                const size_t i = static_cast<size_t>(t) * ldy + n;
                if (n >= N) {
                  bad += y[i] != y0[i];
                  continue;
                }
                const auto d = q8_dot(type, bytes, K, n, in.host, t);
                const double want = acc ? y0[i] + d.dot : d.dot;
                if (std::fabs(y[i] - want) > ref::dot_tol(d.mag) + 1e-6 && ++bad <= 4)
                  ADD_FAILURE() << "y[" << t << "][" << n << "] = " << y[i] << ", want " << want;
              }
            EXPECT_EQ(bad, 0);
            if (first.empty())
              first = y;
            else
              EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
                  << "not the first launch's values bit for bit";
          }
        }
      }
    }
}

TEST_P(KernelInt8, QuantizedPanelsGateUpWriteHQuantizedAndEveryTileAlike) {
  auto& c = ctx();
  std::mt19937 rng(2032);
  const int K = 96, F = 64;
  for (const auto& [type, panel_type] : k_panel_types)
    for (const int T : {1, 5, 9}) {
      SCOPED_TRACE("type " + suffix(type));
      const auto bytes = ref::random_matrix(type, K, 2 * F, rng);
      const tensor_view v{"w", type, {K, 2 * F}, bytes.data(), bytes.size()};
      const auto dm = upload_matrix(c, {&v}, true);
      ASSERT_EQ(dm.type, panel_type);
      const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
      const auto in = quantize_on_device(c, x, T, K);
      const size_t n = static_cast<size_t>(T) * F;
      std::vector<float> first;
      for (const qpanel_launch pl : k_qpanel_launches) {
        if (pl.rows_per_item % 32 != 0) continue;  // quant_out: whole blocks an item
        SCOPED_TRACE(std::string(pl.kernel) + " T=" + std::to_string(T));
        auto k = c.make_kernel("matmul_glu_xq_" + suffix(panel_type) + pl.kernel);
        const auto hb = c.alloc(n * 4), oq = c.alloc(n), od = c.alloc(n / 32 * 4),
                   os = c.alloc(n / 16 * 4);
        k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, hb, K, F, T, pl.rows_per_item, oq, od, os, 1,
               hb);
        c.launch(k,
                 {static_cast<size_t>(F / pl.rows_per_item),
                  static_cast<size_t>((T + pl.tile - 1) / pl.tile)},
                 {1, 1});
        const auto h = download<float>(c, hb, n);
        for (int t = 0; t < T; ++t)
          for (int r = 0; r < F; ++r) {
            const auto g = q8_dot(type, bytes, K, r, in.host, t);
            const auto u = q8_dot(type, bytes, K, F + r, in.host, t);
            EXPECT_NEAR(h[static_cast<size_t>(t) * F + r], ref::silu(g.dot) * u.dot,
                        ref::glu_tol(g.dot, ref::dot_tol(g.mag), u.dot, ref::dot_tol(u.mag)))
                << "h[" << t << "][" << r << "]";
          }
        const auto got = download_q8(c, oq, od, os, T, F);
        for (int t = 0; t < T; ++t)
          check_q8_row(got, t, F, std::vector<double>(h.begin() + t * F, h.begin() + (t + 1) * F),
                       1e-4);
        if (first.empty())
          first = h;
        else
          EXPECT_EQ(0, std::memcmp(first.data(), h.data(), h.size() * sizeof(float)))
              << "not the first launch's values bit for bit";
      }
    }
}

// The quantized panels' QKV kernels (no rotation): q rows bit for bit the
// plain product's of the same panels, and those llama.cpp's formula.
TEST_P(KernelInt8, QuantizedPanelsQkvRowsAreThePlainProducts) {
  auto& c = ctx();
  std::mt19937 rng(5);
  const int K = 64, hd = 64, n_head = 6, n_kv = 2, width = (n_head + 2 * n_kv) * hd, T = 1;
  for (const tensor_type type : {tensor_type::q4_1, tensor_type::q8_0}) {
    const auto bytes = ref::random_matrix(type, K, width, rng);
    const size_t rb = row_bytes(type, K);
    const tensor_view v{"w", type, {K, width}, bytes.data(), bytes.size()};
    const tensor_view wq{"q", type, {K, n_head * hd}, bytes.data(), rb * n_head * hd};
    const tensor_view wk{
        "k", type, {K, n_kv * hd}, bytes.data() + rb * n_head * hd, rb * n_kv * hd};
    const tensor_view wv{
        "v", type, {K, n_kv * hd}, bytes.data() + rb * (n_head + n_kv) * hd, rb * n_kv * hd};
    const auto dm = upload_qkv(c, wq, wk, wv, true, true);
    const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
    const auto in = quantize_on_device(c, x, T, K);
    const auto yb = c.alloc(static_cast<size_t>(width) * 4);
    auto km = c.make_kernel("matmul_xq_" + suffix(dm.type) + "_t1");
    km.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, yb, K, width, T, width, 0, 32);
    c.launch(km, {static_cast<size_t>(width / 32), 1}, {1, 1});
    const auto y = download<float>(c, yb, width);
    const int page_size = 8, n_pages = 4, layer = 0;
    std::vector<int> pos{5}, rs{0}, pt{0, 1, 2, 3}, off{0};
    const auto posb = upload(c, pos), rsb = upload(c, rs), ptb = upload(c, pt),
               offb = upload(c, off);
    const auto kcb = c.alloc(static_cast<size_t>(n_pages) * n_kv * page_size * hd * 4);
    const auto vcb = c.alloc(static_cast<size_t>(n_pages) * n_kv * page_size * hd * 4);
    const auto qkvb = c.alloc(static_cast<size_t>(width) * 4);
    std::vector<float> rope(hd, 0.0f);
    const auto ropeb = upload(c, rope);
    auto kq = c.make_kernel("matmul_qkv_xq_" + suffix(dm.type) + "_t1");
    kq.args_from(kq.args_from(0, dm.q, dm.d, dm.m, in.q, in.d, in.s), qkvb, K, T, posb, rsb, ptb,
                 offb, kcb, vcb, n_head, n_kv, hd, 0, ropeb, 0, page_size, layer, n_pages, 16,
                 ropeb, 0);
    c.launch(kq, {static_cast<size_t>(32), 1}, {16, 1});
    const auto q = download<float>(c, qkvb, width);
    int bad = 0;
    for (int i = 0; i < n_head * hd; ++i) bad += q[i] != y[i];
    EXPECT_EQ(bad, 0) << suffix(type) << " q0 " << q[0] << " y0 " << y[0];
    for (int n : {0, 1, 17, 300, 639}) {
      const auto d = q8_dot(type, bytes, K, n, in.host, 0);
      EXPECT_NEAR(y[n], d.dot, ref::dot_tol(d.mag) + 1e-6) << suffix(type) << " row " << n;
    }
  }
}

// A Q5_1 QKV whose V is Q8_0 (or Q5_0, held as Q8_0), as a Q5_K_M file's
// layers have it where attn_v fell back from Q6_K to Q8_0: held as Q5_1
// (upload_qkv), the QKV kernel's q rows and K and V cache values are, bit
// for bit, what each part alone gives through its own type's matmul; with
// a Q5_1 V (V rows read with signed products) too.  The same for a Q5_0
// QKV (a Q4_K_M file's), whose V (Q8_0 or Q5_0) is held as Q8_0 beside
// packed Q5_0 q and k rows: each part's sums, Q5_0's alone from its packed
// matmul.  No rotation (rope_dims 0), so the values are the sums.
TEST_P(KernelInt8, QkvWithQ8_0VBesideQ5_1OrQ5_0QKGivesEachPartsOwnSums) {
  auto& c = ctx();
  std::mt19937 rng(2031);
  const int hd = 32, n_kv = 1, n_head = 2, T = 5, page_size = 8;
  const int width = (n_head + 2 * n_kv) * hd;
  const ref::kv_geometry geo{1, 1, n_kv, page_size, hd};
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4}, row_seq(T, 0), pt = {0}, pt_off = {0, 1};
  const auto posb = upload(c, pos), rsb = upload(c, row_seq), ptb = upload(c, pt),
             offb = upload(c, pt_off);
  const auto unused = upload(c, std::vector<float>(2 * width, 0.0f));
  // K = 96: an odd number of blocks (each row's last block alone).
  for (const int K : {96, 256}) {
    const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
    const auto xb = upload(c, x);
    const auto in = quantize_on_device(c, x, T, K);
    // Quantized inputs (integer products) or float ones (engine.int8_dot
    // off: each value d q + m, read signed).
    for (const bool xq : {true, false}) {
      const std::string pre = xq ? "xq_" : "";
      // Each part alone through the plain matmul of its own device type.
      auto alone = [&](const tensor_view& v) {
        const auto dm = upload_matrix(c, {&v});
        const int rows = static_cast<int>(dm.rows);
        auto k = c.make_kernel("matmul_" + pre + suffix(dm.type) + "_t1");
        const auto yb = c.alloc(static_cast<size_t>(T) * rows * sizeof(float));
        if (xq)
          k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, yb, K, rows, T, rows, 0, 1);
        else
          k.args(dm.q, dm.d, dm.m, xb, yb, K, rows, T, rows, 0, 1);
        launch_matmul(c, k, rows, {1, 1}, T);
        return download<float>(c, yb, static_cast<size_t>(T) * rows);
      };
      for (const tensor_type qt : {tensor_type::q5_1, tensor_type::q5_0})
        for (const tensor_type vt : {tensor_type::q8_0, tensor_type::q5_0, tensor_type::q5_1}) {
          if (qt == tensor_type::q5_0 && vt == tensor_type::q5_1) continue;
          SCOPED_TRACE("K " + std::to_string(K) + (xq ? " integer" : " float") + " qk type " +
                       suffix(qt) + " v type " + suffix(vt));
          const auto qb = ref::random_matrix(qt, K, n_head * hd, rng);
          const auto kb = ref::random_matrix(qt, K, n_kv * hd, rng);
          const auto vb = ref::random_matrix(vt, K, n_kv * hd, rng);
          const tensor_view wq = view_of(qt, K, n_head * hd, qb.data());
          const tensor_view wk = view_of(qt, K, n_kv * hd, kb.data());
          const tensor_view wv = view_of(vt, K, n_kv * hd, vb.data());
          const auto dm = upload_qkv(c, wq, wk, wv, true);
          ASSERT_EQ(dm.type, qt);
          // A plain QKV product (QK-norm models): Q5_0 beside Q8_0 values
          // as Q8_0, Q5_1 beside them as F32.
          EXPECT_EQ(upload_qkv(c, wq, wk, wv, false).type,
                    vt == qt                  ? (qt == tensor_type::q5_0 ? tensor_type::q8_0 : qt)
                    : qt == tensor_type::q5_0 ? tensor_type::q8_0
                                              : tensor_type::f32);
          const auto want_q = alone(wq), want_k = alone(wk), want_v = alone(wv);
          for (const launch_shape ls : k_launches) {
            SCOPED_TRACE("tile " + std::to_string(ls.tile) + " rows_per_item " +
                         std::to_string(ls.rows_per_item));
            auto k = c.make_kernel("matmul_qkv_" + pre + suffix(qt) + kernel_suffix(ls));
            const auto qkvb = c.alloc(static_cast<size_t>(T) * width * sizeof(float));
            const auto kcb = upload(c, std::vector<float>(geo.elems(), 0.0f));
            const auto vcb = upload(c, std::vector<float>(geo.elems(), 0.0f));
            const cl_uint next = xq ? k.args_from(0, dm.q, dm.d, dm.m, in.q, in.d, in.s)
                                    : k.args_from(0, dm.q, dm.d, dm.m, xb);
            k.args_from(next, qkvb, K, T, posb, rsb, ptb, offb, kcb, vcb, n_head, n_kv, hd, 0,
                        unused, 0, page_size, 0, 1, ls.rows_per_item, unused, 0);
            launch_matmul(c, k, width / 2, ls, T);
            const auto qkv = download<float>(c, qkvb, static_cast<size_t>(T) * width);
            const auto kc = download<float>(c, kcb, geo.elems());
            const auto vc = download<float>(c, vcb, geo.elems());
            int bad = 0;
            for (int t = 0; t < T; ++t)
              for (int d = 0; d < hd; ++d) {
                for (int h = 0; h < n_head; ++h)
                  bad += qkv[static_cast<size_t>(t) * width + h * hd + d] !=
                         want_q[static_cast<size_t>(t) * n_head * hd + h * hd + d];
                bad += kc[geo.k_offset(0, 0, 0, t, d)] != want_k[static_cast<size_t>(t) * hd + d];
                bad += vc[geo.v_offset(0, 0, 0, t, d)] != want_v[static_cast<size_t>(t) * hd + d];
              }
            EXPECT_EQ(bad, 0) << "of " << T * width << " values";
          }
        }
    }
  }
}

// Q2_K, Q3_K, Q5_K and Q6_K held as KU6 (six bits a value, a scale and an
// offset per 16), and Q4_K beside Q6_K in one matrix: against Q8_K inputs
// with sums per 16 (quantize_q8_k with halves), every tile and product
// kernel gives the dot product of the file's values with the inputs'
// quantized values, as llama.cpp's K-quant x Q8_K dot products are.
TEST_P(KernelInt8, KQuantsHeldAsKu6DotQ8KInputs) {
  auto& c = ctx();
  std::mt19937 rng(2027);
  const int K = 512, N = 11, T = 5;
  struct matrix {
    std::string name;
    std::vector<float> w;  // the file's values
    device_matrix dm;
  };
  std::vector<matrix> cases;
  for (const tensor_type t :
       {tensor_type::q2_k, tensor_type::q3_k, tensor_type::q5_k, tensor_type::q6_k}) {
    const auto bytes = ref::random_matrix(t, K, 2 * N, rng);
    const tensor_view v{"w", t, {K, 2 * N}, bytes.data(), bytes.size()};
    cases.push_back({std::string(traits_of(t).name), ref::dequantize(t, bytes, K, 2 * N),
                     upload_matrix(c, {&v})});
  }
  {
    const auto a = ref::random_matrix(tensor_type::q4_k, K, N, rng);
    const auto b = ref::random_matrix(tensor_type::q6_k, K, N, rng);
    const tensor_view va{"a", tensor_type::q4_k, {K, N}, a.data(), a.size()};
    const tensor_view vb{"b", tensor_type::q6_k, {K, N}, b.data(), b.size()};
    auto w = ref::dequantize(tensor_type::q4_k, a, K, N);
    const auto wb = ref::dequantize(tensor_type::q6_k, b, K, N);
    w.insert(w.end(), wb.begin(), wb.end());
    cases.push_back({"Q4_K + Q6_K", w, upload_matrix(c, {&va, &vb})});
  }
  for (const auto& mc : cases) {
    SCOPED_TRACE(mc.name);
    ASSERT_EQ(mc.dm.type, tensor_type::ku6);
    ASSERT_TRUE(mc.dm.q8_k_acts);
    const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
    const auto in = quantize_on_device(c, x, T, K, true);
    auto want = [&](int n, int t) {  // row n of W . row t of the quantized x
      ref::dot_result r{0, 0};
      for (int i = 0; i < K; ++i) {
        const size_t xi = static_cast<size_t>(t) * K + i;
        const double p = static_cast<double>(mc.w[static_cast<size_t>(n) * K + i]) *
                         in.host.d[xi / 32] * in.host.q[xi];
        r.dot += p;
        r.mag += std::fabs(p);
      }
      // The kernel sums u x and the offsets apart: u reaches 63, twice a
      // centred quant's size.
      r.mag *= 4;
      return r;
    };
    for (const launch_shape ls : k_launches) {
      SCOPED_TRACE("tile " + std::to_string(ls.tile) + " rows_per_item " +
                   std::to_string(ls.rows_per_item));
      auto k = c.make_kernel("matmul_xq_ku6" + kernel_suffix(ls));
      const auto yb = c.alloc(static_cast<size_t>(T) * 2 * N * 4);
      k.args(mc.dm.q, mc.dm.d, mc.dm.m, in.q, in.d, in.s, yb, K, 2 * N, T, 2 * N, 0,
             ls.rows_per_item);
      launch_matmul(c, k, 2 * N, ls, T);
      const auto y = download<float>(c, yb, static_cast<size_t>(T) * 2 * N);
      int bad = 0;
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < 2 * N; ++n) {
          const auto d = want(n, t);
          const float got = y[static_cast<size_t>(t) * 2 * N + n];
          if (std::fabs(got - d.dot) > ref::dot_tol(d.mag) && ++bad <= 4)
            ADD_FAILURE() << "y[" << t << "][" << n << "] = " << got << ", want " << d.dot;
        }
      EXPECT_EQ(bad, 0);
      auto g = c.make_kernel("matmul_glu_xq_ku6" + kernel_suffix(ls));
      const auto hb = c.alloc(static_cast<size_t>(T) * N * 4);
      g.args(mc.dm.q, mc.dm.d, mc.dm.m, in.q, in.d, in.s, hb, K, N, T, ls.rows_per_item, hb, hb, hb,
             0, hb);
      launch_matmul(c, g, N, ls, T);
      const auto h = download<float>(c, hb, static_cast<size_t>(T) * N);
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < N; ++n) {
          const auto gd = want(n, t), ud = want(N + n, t);
          EXPECT_NEAR(h[static_cast<size_t>(t) * N + n], ref::silu(gd.dot) * ud.dot,
                      ref::glu_tol(gd.dot, ref::dot_tol(gd.mag), ud.dot, ref::dot_tol(ud.mag)))
              << "h[" << t << "][" << n << "]";
        }
    }
  }
}

// A token's gated-FFN output does not depend on the tile it is computed in
// (one row, 4, or the engine's 8-token tile, where SiLU runs in float8
// vectors; in 4 in float4, alone in scalars): the same bits, built as the
// engine builds the kernels.  A preempted sequence recomputed as a prefill
// chunk relies on it, and PoCL's own vector and scalar exp round
// differently (the reason for exp_poly in common.cl).
TEST(KernelGluTiles, EveryTileGivesTheSameBits) {
  static shared_context shared;
  auto& s = kernel_test::make_once(shared, [](cl::context& c) -> std::optional<std::string> {
    return kernel_build_options(c, 8, true);
  });
  if (!s.ctx) GTEST_SKIP() << s.no_device;
  auto& c = *s.ctx;
  std::mt19937 rng(2027);
  // F = 44: the last work-item of 16 rows is cut short (12 rows: eight
  // at a time, then four alone).
  const int K = 256, F = 44, T = 13;
  for (const tensor_type type : {tensor_type::f32, tensor_type::q4_1, tensor_type::q8_0}) {
    SCOPED_TRACE("type " + suffix(type));
    const auto bytes = ref::random_matrix(type, K, 2 * F, rng);
    const tensor_view v{"w", type, {K, 2 * F}, bytes.data(), bytes.size()};
    const auto dm = upload_matrix(c, {&v});
    // Gates of both signs and a wide range, so SiLU's exp is taken far
    // from 0 too.
    auto x = random_floats(static_cast<size_t>(T) * K, -4.0f, 4.0f, rng);
    const bool q = type != tensor_type::f32;
    const auto xb = upload(c, x);
    quantized_input in;
    if (q) in = quantize_on_device(c, x, T, K);
    // One row per work-item: every SiLU alone; 16: the one-token kernel
    // takes eight rows' SiLU at a time; 12: eight at a time, then four
    // alone.
    struct launch {
      const char* tile;
      int tt, rows_per_item;
    };
    const launch launches[] = {{"_t1", 1, 1},  {"_t1", 1, 16},   {"_t1", 1, 12},   {"_t4", 4, 1},
                               {"_t4", 4, 16}, {"_tiled", 8, 1}, {"_tiled", 8, 16}};
    std::vector<float> first;
    for (const launch& l : launches) {
      SCOPED_TRACE(std::string(l.tile) + " rows_per_item " + std::to_string(l.rows_per_item));
      const std::string name =
          std::string(q ? "matmul_glu_xq_" : "matmul_glu_") + suffix(dm.type) + l.tile;
      auto k = c.make_kernel(name);
      const auto hb = c.alloc(static_cast<size_t>(T) * F * 4);
      if (q)
        k.args(dm.q, dm.d, dm.m, in.q, in.d, in.s, hb, K, F, T, l.rows_per_item, hb, hb, hb, 0, hb);
      else
        k.args(dm.q, dm.d, dm.m, xb, hb, K, F, T, l.rows_per_item, hb, hb, hb, 0, hb);
      c.launch(k, {static_cast<size_t>((F + l.rows_per_item - 1) / l.rows_per_item),
                   static_cast<size_t>((T + l.tt - 1) / l.tt)});
      const auto h = download<float>(c, hb, static_cast<size_t>(T) * F);
      if (first.empty()) {
        first = h;
        continue;
      }
      int differ = 0;
      for (size_t i = 0; i < h.size(); ++i)
        differ += std::memcmp(&first[i], &h[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "against _t1, one row per work-item";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Builds, KernelInt8, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Native" : "Portable"; });

}  // namespace
}  // namespace troupe
