// Every OpenCL kernel of kernels/*.cl against a plain C++ reference
// (tests/unit/kernel_reference.hpp) on random inputs; rope_store_kv and
// attention in both KV cache modes (F32, and half with TROUPE_KV_F16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/cl_runtime.hpp"
#include "runtime/device_weights.hpp"
#include "runtime/model_file.hpp"
#include "runtime/tensor_type.hpp"
#include "tests/unit/kernel_reference.hpp"

namespace troupe {
namespace {

namespace ref = kernel_ref;

constexpr tensor_type k_types[] = {tensor_type::f32, tensor_type::f16, tensor_type::q4_0,
                                   tensor_type::q4_1, tensor_type::q8_0};

// One context per KV mode, its program built once for the whole run.
struct shared_context {
  std::unique_ptr<cl::context> ctx;
  std::string no_device;  // why no context could be made
};

shared_context& context_for(bool kv_f16) {
  static shared_context shared[2];
  auto& s = shared[kv_f16 ? 1 : 0];
  if (s.ctx || !s.no_device.empty()) return s;
  std::unique_ptr<cl::context> ctx;
  try {
    ctx = std::make_unique<cl::context>();
  } catch (const cl::cl_error& e) {
    s.no_device = e.what();
    return s;
  }
  // A build failure throws out of the test that asked: a failure, not a skip.
  ctx->build(std::string("-cl-std=CL1.2 -cl-mad-enable") + (kv_f16 ? " -DTROUPE_KV_F16" : ""));
  s.ctx = std::move(ctx);
  return s;
}

class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!context_for(false).ctx)
      GTEST_SKIP() << "no OpenCL device: " << context_for(false).no_device;
  }
  static cl::context& ctx(bool kv_f16 = false) { return *context_for(kv_f16).ctx; }
};
using KernelMatmul = KernelTest;
using KernelEmbed = KernelTest;
using KernelNorm = KernelTest;
using KernelRope = KernelTest;
using KernelAttention = KernelTest;

template <class T>
cl::buffer upload(cl::context& c, const std::vector<T>& v) {
  return c.alloc(v.size() * sizeof(T), v.data());
}

template <class T>
std::vector<T> download(cl::context& c, const cl::buffer& b, size_t n) {
  std::vector<T> v(n);
  c.read(b, v.data(), n * sizeof(T));
  return v;
}

std::vector<float> random_floats(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// "q4_0" for Q4_0: the suffix of the kernel names.
std::string suffix(tensor_type t) {
  std::string s(traits_of(t).name);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

tensor_view view_of(tensor_type t, int K, int N, const uint8_t* data) {
  return tensor_view{"w", t, {K, N}, data, row_bytes(t, K) * static_cast<size_t>(N)};
}

// Reports the first few mismatches in full, then only their count.
struct checker {
  int bad = 0;
  ~checker() {
    if (bad > k_shown) ADD_FAILURE() << bad << " mismatches in all";
  }
  template <class Where>
  void near(double got, double want, double tol, Where where) {
    if (std::fabs(got - want) <= tol) return;  // NaN fails too
    if (++bad <= k_shown)
      ADD_FAILURE() << where() << ": got " << got << ", want " << want << " +- " << tol;
  }
  static constexpr int k_shown = 6;
};

TEST_F(KernelMatmul, EveryTypeTileAndShapeMatchesDequantizedDot) {
  auto& c = ctx();
  std::mt19937 rng(1234);
  struct shape {
    int K, N;
  };
  for (const shape sh : {shape{32, 5}, shape{96, 37}, shape{256, 50}, shape{1024, 19}}) {
    const int K = sh.K, N = sh.N;
    for (const tensor_type type : k_types) {
      SCOPED_TRACE("type " + suffix(type) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
      const auto bytes = ref::random_matrix(type, K, N, rng);
      const auto w = ref::dequantize(type, bytes, K, N);
      // N = 37 goes up as two stacked parts, fused the way Wq, Wk, Wv are.
      const int n1 = N == 37 ? 12 : N;
      const tensor_view a = view_of(type, K, n1, bytes.data());
      const tensor_view b = view_of(type, K, N - n1, bytes.data() + row_bytes(type, K) * n1);
      const auto dm = n1 < N ? upload_matrix(c, {&a, &b}) : upload_matrix(c, {&a});
      ASSERT_EQ(dm.rows, N);
      ASSERT_EQ(dm.cols, K);
      for (const int tile : {1, 4}) {
        auto k = c.make_kernel("matmul_" + suffix(type) + "_t" + std::to_string(tile));
        for (const int T : {1, 3, 4, 7, 33}) {
          for (const int acc : {0, 1}) {
            SCOPED_TRACE("tile " + std::to_string(tile) + " T=" + std::to_string(T) +
                         " accumulate=" + std::to_string(acc));
            const int ldy = N + 3;  // columns N..ldy-1 must stay untouched
            const auto x = random_floats(static_cast<size_t>(T) * K, -1.0f, 1.0f, rng);
            const auto y0 = random_floats(static_cast<size_t>(T) * ldy, -1.0f, 1.0f, rng);
            const auto xb = upload(c, x);
            const auto yb = upload(c, y0);
            k.args(dm.q, dm.d, dm.m, xb, yb, K, N, T, ldy, acc);
            const size_t groups = tile == 1 ? T : (T + 3) / 4;
            c.launch(k, {static_cast<size_t>(N), groups}, {16, 1});
            const auto y = download<float>(c, yb, y0.size());
            checker chk;
            for (int t = 0; t < T; ++t) {
              for (int n = 0; n < ldy; ++n) {
                const size_t i = static_cast<size_t>(t) * ldy + n;
                auto where = [&] {
                  return "y[" + std::to_string(t) + "][" + std::to_string(n) + "]";
                };
                if (n >= N) {
                  chk.near(y[i], y0[i], 0.0, where);
                  continue;
                }
                double dot = 0.0, mag = 0.0;
                for (int j = 0; j < K; ++j) {
                  const double p = static_cast<double>(w[static_cast<size_t>(n) * K + j]) *
                                   x[static_cast<size_t>(t) * K + j];
                  dot += p;
                  mag += std::fabs(p);
                }
                const double want = acc ? y0[i] + dot : dot;
                chk.near(y[i], want, 2e-5 * mag + 1e-6 + (acc ? 1e-7 : 0.0), where);
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(KernelEmbed, RowsAreTheDequantizedRowsOfTheTokens) {
  auto& c = ctx();
  std::mt19937 rng(99);
  const int K = 96, N = 41;
  const std::vector<int32_t> tokens = {0, 40, 7, 7, 13, 2, 40, 25, 1};
  const int T = static_cast<int>(tokens.size());
  const auto tb = upload(c, tokens);
  for (const tensor_type type : k_types) {
    SCOPED_TRACE("type " + suffix(type));
    const auto bytes = ref::random_matrix(type, K, N, rng);
    const auto w = ref::dequantize(type, bytes, K, N);
    const tensor_view v = view_of(type, K, N, bytes.data());
    const auto dm = upload_matrix(c, {&v});
    const auto out = c.alloc(static_cast<size_t>(T) * K * sizeof(float));
    auto k = c.make_kernel("embed_" + suffix(type));
    k.args(dm.q, dm.d, dm.m, tb, out, K);
    c.launch(k, {static_cast<size_t>(K / 32), static_cast<size_t>(T)});
    const auto got = download<float>(c, out, static_cast<size_t>(T) * K);
    checker chk;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < K; ++i)
        chk.near(got[static_cast<size_t>(t) * K + i], w[static_cast<size_t>(tokens[t]) * K + i],
                 0.0, [&] { return "row " + std::to_string(t) + " value " + std::to_string(i); });
  }
}

TEST_F(KernelNorm, RmsnormWithAndWithoutGather) {
  auto& c = ctx();
  std::mt19937 rng(5);
  const int D = 200, R = 5;
  const float eps = 1e-5f;
  auto x = random_floats(static_cast<size_t>(R) * D, -2.0f, 2.0f, rng);
  for (int i = 0; i < D; ++i) x[2 * D + i] *= 1e-3f;  // a row small enough for eps to matter
  const auto w = random_floats(D, 0.5f, 1.5f, rng);
  const std::vector<int32_t> rows = {4, 1, 1, 0, 2};
  const auto xb = upload(c, x), wb = upload(c, w), rb = upload(c, rows);
  auto k = c.make_kernel("rmsnorm");
  for (const int gather : {0, 1}) {
    SCOPED_TRACE("gather " + std::to_string(gather));
    const int n_out = gather ? static_cast<int>(rows.size()) - 1 : R;  // gather: 4 of 5 rows
    const auto yb = c.alloc(static_cast<size_t>(n_out) * D * sizeof(float));
    k.args(xb, wb, yb, rb, gather, D, eps);
    c.launch(k, {static_cast<size_t>(n_out)});
    const auto y = download<float>(c, yb, static_cast<size_t>(n_out) * D);
    checker chk;
    for (int r = 0; r < n_out; ++r) {
      const float* xr = &x[static_cast<size_t>(gather ? rows[r] : r) * D];
      double ss = 0.0;
      for (int i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const double scale = 1.0 / std::sqrt(ss / D + eps);
      for (int i = 0; i < D; ++i) {
        const double want = xr[i] * scale * w[i];
        chk.near(y[static_cast<size_t>(r) * D + i], want, 1e-5 * std::fabs(want) + 1e-7,
                 [&] { return "row " + std::to_string(r) + " value " + std::to_string(i); });
      }
    }
  }
}

TEST_F(KernelNorm, SiluMulGatesTheUpHalf) {
  auto& c = ctx();
  std::mt19937 rng(11);
  const int F = 77, T = 3;
  const auto gu = random_floats(static_cast<size_t>(T) * 2 * F, -6.0f, 6.0f, rng);
  const auto gb = upload(c, gu);
  const auto hb = c.alloc(static_cast<size_t>(T) * F * sizeof(float));
  auto k = c.make_kernel("silu_mul");
  k.args(gb, hb, F);
  c.launch(k, {static_cast<size_t>(F), static_cast<size_t>(T)});
  const auto h = download<float>(c, hb, static_cast<size_t>(T) * F);
  checker chk;
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < F; ++i) {
      const double g = gu[static_cast<size_t>(t) * 2 * F + i];
      const double u = gu[static_cast<size_t>(t) * 2 * F + F + i];
      const double want = g / (1.0 + std::exp(-g)) * u;
      chk.near(h[static_cast<size_t>(t) * F + i], want, 1e-5 * std::fabs(want) + 1e-7,
               [&] { return "row " + std::to_string(t) + " value " + std::to_string(i); });
    }
  }
}

// The cache as the kernels see it: raw elements (float or half bits) for
// upload and, widened to float, for the references.
struct host_cache {
  bool f16;
  std::vector<float> f;     // widened values
  std::vector<uint16_t> h;  // half bits (f16 only)

  host_cache(bool kv_f16, size_t n, std::mt19937& rng) : f16(kv_f16) {
    f = random_floats(n, -1.0f, 1.0f, rng);
    if (!f16) return;
    h.resize(n);
    for (size_t i = 0; i < n; ++i) {
      h[i] = float_to_half(f[i]);
      f[i] = half_to_float(h[i]);
    }
  }
  cl::buffer upload_to(cl::context& c) const { return f16 ? upload(c, h) : upload(c, f); }
  std::vector<float> download_from(cl::context& c, const cl::buffer& b) const {
    if (!f16) return download<float>(c, b, f.size());
    const auto bits = download<uint16_t>(c, b, h.size());
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = half_to_float(bits[i]);
    return out;
  }
};

void check_rope_store_kv(cl::context& c, bool kv_f16) {
  std::mt19937 rng(kv_f16 ? 71 : 70);
  auto k = c.make_kernel("rope_store_kv");
  const int n_head = 4, n_kv = 2, page_size = 8, n_layer = 3, layer = 1, n_pages = 20;
  struct config {
    int hd, rope_dims;
    bool neox;
    float base;
  };
  for (const config cf :
       {config{64, 64, false, 10000.0f}, config{64, 32, true, 1e6f}, config{64, 64, true, 10000.0f},
        config{64, 16, false, 1e6f}, config{48, 48, false, 10000.0f}, config{48, 48, true, 1e6f},
        config{48, 32, true, 10000.0f}, config{48, 16, false, 5e5f}}) {
    const int hd = cf.hd;
    SCOPED_TRACE("hd " + std::to_string(hd) + " rope_dims " + std::to_string(cf.rope_dims) +
                 (cf.neox ? " neox" : " normal") + (kv_f16 ? " KV F16" : " KV F32"));
    const auto b = ref::make_batch({0, 17, 6, 63}, {3, 1, 4, 2}, page_size, n_pages, rng);
    const ref::kv_geometry geo{n_layer, n_pages, n_kv, page_size, hd};
    const int T = b.rows(), width = (n_head + 2 * n_kv) * hd;
    const auto qkv = random_floats(static_cast<size_t>(T) * width, -1.0f, 1.0f, rng);
    const host_cache kc0(kv_f16, geo.elems(), rng), vc0(kv_f16, geo.elems(), rng);
    const auto qkvb = upload(c, qkv), posb = upload(c, b.pos), rsb = upload(c, b.row_seq);
    const auto ptb = upload(c, b.pt), offb = upload(c, b.pt_off);
    const auto kcb = kc0.upload_to(c), vcb = vc0.upload_to(c);
    k.args(qkvb, posb, rsb, ptb, offb, kcb, vcb, n_head, n_kv, hd, cf.rope_dims, cf.base,
           cf.neox ? 1 : 0, page_size, layer, n_pages);
    c.launch(k, {static_cast<size_t>(n_head + n_kv), static_cast<size_t>(T)});
    const auto got = download<float>(c, qkvb, qkv.size());
    const auto kc = kc0.download_from(c, kcb), vc = vc0.download_from(c, vcb);

    // Expected qkv and caches, with a tolerance per value (0: exact).
    std::vector<double> want(qkv.begin(), qkv.end()), tol(qkv.size(), 0.0);
    std::vector<double> kwant(kc0.f.begin(), kc0.f.end()), ktol(kc.size(), 0.0);
    std::vector<double> vwant(vc0.f.begin(), vc0.f.end());
    for (int t = 0; t < T; ++t) {
      const int p = b.pos[t];
      for (int h = 0; h < n_head + n_kv; ++h) {
        const size_t at = static_cast<size_t>(t) * width + static_cast<size_t>(h) * hd;
        double amax = 0.0;
        for (int i = 0; i < cf.rope_dims; ++i) amax = std::max(amax, std::fabs(want[at + i]));
        ref::rope(&want[at], cf.rope_dims, cf.base, cf.neox, p);
        // float theta = p * pow(base, ...) is off by up to ~p * 1e-6 radians.
        for (int i = 0; i < cf.rope_dims; ++i) tol[at + i] = (2e-6 * p + 4e-6) * 2 * amax + 1e-7;
        if (h < n_head) continue;
        const size_t o = geo.offset(layer, b.page_of(t, page_size), h - n_head, p % page_size);
        for (int i = 0; i < hd; ++i) {
          double kv = want[at + i], kt = tol[at + i], vv = qkv[at + n_kv * hd + i];
          if (kv_f16) {  // what a half store of the kernel's float gives
            if (kt == 0.0)
              kv = ref::round_half(static_cast<float>(kv));
            else
              kt += 0.5 * ref::half_step(std::fabs(kv) + kt);
            vv = ref::round_half(static_cast<float>(vv));
          }
          kwant[o + i] = kv;
          ktol[o + i] = kt;
          vwant[o + i] = vv;
        }
      }
    }
    checker chk;
    for (size_t i = 0; i < qkv.size(); ++i)
      chk.near(got[i], want[i], tol[i], [&] {
        return "qkv row " + std::to_string(i / width) + " value " + std::to_string(i % width);
      });
    for (size_t i = 0; i < kc.size(); ++i) {
      chk.near(kc[i], kwant[i], ktol[i], [&] { return "k cache element " + std::to_string(i); });
      chk.near(vc[i], vwant[i], 0.0, [&] { return "v cache element " + std::to_string(i); });
    }
  }
}

TEST_F(KernelRope, RotatesQAndKAndStoresKvF32) {
  check_rope_store_kv(ctx(false), false);
}
TEST_F(KernelRope, RotatesQAndKAndStoresKvF16) {
  check_rope_store_kv(ctx(true), true);
}

// Sequences of one decode row or a prefill chunk each, through shuffled
// page tables; GQA with three query heads per KV head.
void check_attention(cl::context& c, bool kv_f16, int hd) {
  SCOPED_TRACE("hd " + std::to_string(hd) + (kv_f16 ? " KV F16" : " KV F32"));
  std::mt19937 rng(kv_f16 ? 300 + hd : 200 + hd);
  auto k = c.make_kernel("attention");
  const int n_kv = 2, n_head = 3 * n_kv, page_size = 4, n_layer = 2, layer = 1, n_pages = 40;
  const auto b =
      ref::make_batch({0, 13, 5, 0, 22, 37, 9}, {1, 1, 5, 7, 1, 1, 3}, page_size, n_pages, rng);
  const ref::kv_geometry geo{n_layer, n_pages, n_kv, page_size, hd};
  const int T = b.rows(), width = (n_head + 2 * n_kv) * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto qkv = random_floats(static_cast<size_t>(T) * width, -4.0f, 4.0f, rng);
  const host_cache kc(kv_f16, geo.elems(), rng), vc(kv_f16, geo.elems(), rng);
  const auto qkvb = upload(c, qkv), posb = upload(c, b.pos), rsb = upload(c, b.row_seq);
  const auto ptb = upload(c, b.pt), offb = upload(c, b.pt_off);
  const auto kcb = kc.upload_to(c), vcb = vc.upload_to(c);
  const size_t n_out = static_cast<size_t>(T) * n_head * hd;
  const auto outb = c.alloc(n_out * sizeof(float));
  k.args(qkvb, kcb, vcb, outb, posb, rsb, ptb, offb, n_head, n_kv, hd, page_size, layer, n_pages,
         scale);
  c.launch(k, {static_cast<size_t>(n_head), static_cast<size_t>(T)});
  const auto out = download<float>(c, outb, n_out);

  checker chk;
  std::vector<double> exact(hd), emulated(hd), slack(hd), no_slack(hd);
  for (int t = 0; t < T; ++t) {
    const auto& pages = b.pages[b.row_seq[t]];
    for (int h = 0; h < n_head; ++h) {
      const int g = h / (n_head / n_kv);
      auto at = [&](int j) { return geo.offset(layer, pages[j / page_size], g, j % page_size); };
      auto key = [&](int j) { return &kc.f[at(j)]; };
      auto val = [&](int j) { return &vc.f[at(j)]; };
      const float* q = &qkv[static_cast<size_t>(t) * width + static_cast<size_t>(h) * hd];
      ref::attention(q, hd, b.pos[t], scale, key, val, false, exact.data(), no_slack.data());
      if (kv_f16)
        ref::attention(q, hd, b.pos[t], scale, key, val, true, emulated.data(), slack.data());
      for (int i = 0; i < hd; ++i) {
        const float got = out[(static_cast<size_t>(t) * n_head + h) * hd + i];
        auto where = [&] {
          return "row " + std::to_string(t) + " (pos " + std::to_string(b.pos[t]) + ") head " +
                 std::to_string(h) + " value " + std::to_string(i);
        };
        if (kv_f16) {
          chk.near(got, emulated[i], 2e-5 + slack[i], where);
          chk.near(got, exact[i], 1e-2, where);
        } else {
          chk.near(got, exact[i], 2e-5, where);
        }
      }
    }
  }
}

TEST_F(KernelAttention, PagedGqaDecodeAndPrefillF32) {
  for (const int hd : {48, 64}) check_attention(ctx(false), false, hd);
}

TEST_F(KernelAttention, PagedGqaDecodeAndPrefillF16EmulatesLlamaCpp) {
  for (const int hd : {48, 64}) check_attention(ctx(true), true, hd);
}

}  // namespace
}  // namespace troupe
