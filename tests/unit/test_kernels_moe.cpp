// The mixture-of-experts kernels (kernels/moe.cl, matmul.cl's grouped
// matmul_id_*) against plain C++: routing (softmax, top-k with ties to the
// lower id, weights renormalised, assignments grouped by slot with
// replicated experts taken in turn, load counts), the combination, and the
// grouped expert products, which must equal the dense kernels' (themselves
// tested against the reference in test_kernels*.cpp) row for row, bit for
// bit, for every weight type, both activation formats and every tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/device_weights.hpp"
#include "runtime/model/tensor_type.hpp"
#include "tests/unit/kernel_reference.hpp"
#include "tests/unit/kernel_test_io.hpp"

namespace troupe {
namespace {

namespace ref = kernel_ref;
using kernel_test::download;
using kernel_test::random_floats;
using kernel_test::suffix;
using kernel_test::upload;

// Built as the engine builds it (VNNI where the engine would use it), with
// TROUPE_TILE 4.
kernel_test::shared_context& moe_context() {
  static kernel_test::shared_context s;
  return kernel_test::make_once(s, [](cl::context& c) {
    return std::optional<std::string>(
        std::string("-cl-std=CL1.2 -cl-mad-enable -DTROUPE_TILE=4 -DTROUPE_KV_F16") +
        (c.x86_vnni() ? " -DTROUPE_VNNI" : "") + (c.x86_avx2() ? " -DTROUPE_AVX2" : ""));
  });
}

class KernelMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!moe_context().ctx) GTEST_SKIP() << "no OpenCL device: " << moe_context().no_device;
  }
  static cl::context& ctx() { return *moe_context().ctx; }
};

// Each expert's slots: expert e in slots rep_slot[rep_off[e] .. rep_off[e+1]).
struct replica_table {
  std::vector<int32_t> rep_off{0}, rep_slot;
  explicit replica_table(const std::vector<int>& slot_experts, int E) {
    for (int e = 0; e < E; ++e) {
      for (size_t s = 0; s < slot_experts.size(); ++s)
        if (slot_experts[s] == e) rep_slot.push_back(static_cast<int32_t>(s));
      rep_off.push_back(static_cast<int32_t>(rep_slot.size()));
    }
  }
};

struct routed {
  std::vector<float> weights;
  std::vector<int32_t> slot_off, slot_rows, counts;
};

// llama.cpp's gating: softmax, the K most probable (ties to the lower id),
// their probabilities over their sum (`norm`, Mixtral) or as they are
// (Qwen2-MoE); token t takes replica t mod n of an expert held n times;
// assignments grouped by slot in token order.
routed reference_route(const std::vector<float>& logits, int T, int E, int K,
                       const replica_table& rt, int S, bool norm) {
  routed r;
  r.weights.resize(static_cast<size_t>(T) * K);
  r.counts.assign(E, 0);
  std::vector<std::vector<int32_t>> by_slot(S);
  for (int t = 0; t < T; ++t) {
    const float* l = &logits[static_cast<size_t>(t) * E];
    const float mx = *std::max_element(l, l + E);
    std::vector<double> p(E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += p[e] = std::exp(static_cast<double>(l[e]) - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double wsum = 0;
    for (int k = 0; k < K; ++k) wsum += p[order[k]] / sum;
    if (!norm) wsum = 1;
    for (int k = 0; k < K; ++k) {
      const int e = order[k];
      r.weights[static_cast<size_t>(t) * K + k] = static_cast<float>(p[e] / sum / wsum);
      const int n = rt.rep_off[e + 1] - rt.rep_off[e];
      by_slot[rt.rep_slot[rt.rep_off[e] + t % n]].push_back(t * K + k);
      ++r.counts[e];
    }
  }
  r.slot_off.push_back(0);
  for (const auto& v : by_slot) {
    r.slot_rows.insert(r.slot_rows.end(), v.begin(), v.end());
    r.slot_off.push_back(static_cast<int32_t>(r.slot_rows.size()));
  }
  return r;
}

TEST_F(KernelMoe, RouteGroupsAssignmentsBySlotInTokenOrder) {
  auto& c = ctx();
  auto k = c.make_kernel("moe_route");
  std::mt19937 rng(77);
  const int E = 8, K = 2;
  // Experts 3 and 5 replicated (slots 8 and 9), so the slot count is 10.
  const std::vector<int> slot_experts{0, 1, 2, 3, 4, 5, 6, 7, 3, 5};
  const int S = static_cast<int>(slot_experts.size());
  const replica_table rt(slot_experts, E);
  for (const int T : {1, 5, 37})
    for (const bool norm : {true, false}) {
      SCOPED_TRACE("T=" + std::to_string(T) + (norm ? " renormalised" : " as the softmax gave"));
      const auto logits = random_floats(static_cast<size_t>(T) * E, -3.0f, 3.0f, rng);
      const auto want = reference_route(logits, T, E, K, rt, S, norm);
      const size_t A = static_cast<size_t>(T) * K;
      const auto lb = upload(c, logits);
      const auto ro = upload(c, rt.rep_off), rs = upload(c, rt.rep_slot);
      auto sel = c.alloc(A * 4), w = c.alloc(A * 4), off = c.alloc((S + 1) * 4),
           rows = c.alloc(A * 4);
      // Counts of two layers; this one is the second, and is counted into twice.
      const std::vector<int32_t> zeros(2 * E, 0);
      const auto counts = upload(c, zeros);
      for (int run = 0; run < 2; ++run) {
        k.args(lb, T, E, K, ro, rs, S, sel, w, off, rows, counts, E, norm ? 1 : 0);
        c.launch(k, {1});
      }
      const auto got_w = download<float>(c, w, A);
      for (size_t a = 0; a < A; ++a) EXPECT_NEAR(got_w[a], want.weights[a], 1e-6) << "a=" << a;
      EXPECT_EQ(download<int32_t>(c, off, S + 1), want.slot_off);
      EXPECT_EQ(download<int32_t>(c, rows, A), want.slot_rows);
      auto got_counts = download<int32_t>(c, counts, 2 * E);
      EXPECT_EQ(std::vector<int32_t>(got_counts.begin(), got_counts.begin() + E),
                std::vector<int32_t>(E, 0));
      for (int e = 0; e < E; ++e) EXPECT_EQ(got_counts[E + e], 2 * want.counts[e]) << "e=" << e;
    }
}

// With `shared` (Qwen2-MoE), the shared expert's output scaled by the
// sigmoid of its gate logit is added too.
TEST_F(KernelMoe, CombineAddsWeightedExpertOutputsToTheResidual) {
  auto& c = ctx();
  auto k = c.make_kernel("moe_combine");
  std::mt19937 rng(78);
  const int T = 6, D = 40;
  for (const int K : {1, 2, 3})
    for (const bool shared : {false, true}) {
      const auto x0 = random_floats(static_cast<size_t>(T) * D, -1.0f, 1.0f, rng);
      const auto y = random_floats(static_cast<size_t>(T) * K * D, -1.0f, 1.0f, rng);
      const auto w = random_floats(static_cast<size_t>(T) * K, 0.0f, 1.0f, rng);
      const auto sy = random_floats(static_cast<size_t>(T) * D, -1.0f, 1.0f, rng);
      const auto sg = random_floats(static_cast<size_t>(T), -4.0f, 4.0f, rng);
      const auto xb = upload(c, x0);
      const auto yb = upload(c, y), wb = upload(c, w), syb = upload(c, sy), sgb = upload(c, sg);
      k.args(xb, yb, wb, D, K, syb, sgb, shared ? 1 : 0);
      c.launch(k, {static_cast<size_t>(D), static_cast<size_t>(T)});
      const auto x = download<float>(c, xb, x0.size());
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < D; ++i) {
          double want = x0[static_cast<size_t>(t) * D + i];
          for (int j = 0; j < K; ++j)
            want += static_cast<double>(w[t * K + j]) * y[(static_cast<size_t>(t) * K + j) * D + i];
          if (shared)
            want +=
                sy[static_cast<size_t>(t) * D + i] / (1.0 + std::exp(-static_cast<double>(sg[t])));
          EXPECT_NEAR(x[static_cast<size_t>(t) * D + i], want, 1e-5)
              << "K=" << K << (shared ? " with the shared expert" : "");
        }
    }
}

constexpr tensor_type k_types[] = {tensor_type::f32,  tensor_type::f16,  tensor_type::q4_0,
                                   tensor_type::q4_1, tensor_type::q8_0, tensor_type::q5_1};

bool is_quantized(tensor_type t) {
  return t == tensor_type::q4_0 || t == tensor_type::q4_1 || t == tensor_type::q8_0 ||
         t == tensor_type::q5_1;
}

tensor_view rows_of(tensor_type t, int K, const std::vector<uint8_t>& bytes, int first, int n) {
  const size_t rb = row_bytes(t, K);
  return tensor_view{"w", t, {K, n}, bytes.data() + rb * first, rb * static_cast<size_t>(n)};
}

// Activations as the kernels take them: float, or quantized by quantize_q8.
struct activations {
  cl::buffer f, q, d, s;
};

activations make_activations(cl::context& c, const std::vector<float>& x, int rows, int K) {
  activations a;
  a.f = upload(c, x);
  const size_t n = static_cast<size_t>(rows) * K;
  a.q = c.alloc(n);
  a.d = c.alloc(n / 32 * 4);
  a.s = c.alloc(n / 32 * 8);
  auto k = c.make_kernel("quantize_q8");
  k.args(a.f, K, a.q, a.d, a.s);
  c.launch(k, {static_cast<size_t>(K / 32), static_cast<size_t>(rows)});
  return a;
}

cl_uint set_inputs(cl::kernel& k, const device_matrix& w, const activations& x, bool xq) {
  return xq ? k.args_from(0, w.q, w.d, w.m, x.q, x.d, x.s) : k.args_from(0, w.q, w.d, w.m, x.f);
}

TEST_F(KernelMoe, GroupedProductsEqualTheDenseKernelsRowForRow) {
  auto& c = ctx();
  std::mt19937 rng(79);
  const int D = 96, F = 64, E = 3, K = 2, T = 9;
  // Expert 1 held twice (slots 1 and 3).
  const std::vector<int> slot_experts{0, 1, 2, 1};
  const int S = static_cast<int>(slot_experts.size());
  const replica_table rt(slot_experts, E);
  // A routing from random logits (the route kernel is tested above).
  const auto logits = random_floats(static_cast<size_t>(T) * E, -2.0f, 2.0f, rng);
  const auto route = reference_route(logits, T, E, K, rt, S, true);
  const auto slot_off = upload(c, route.slot_off), slot_rows = upload(c, route.slot_rows);
  std::vector<int> slot_of(static_cast<size_t>(T) * K);
  for (int s = 0; s < S; ++s)
    for (int i = route.slot_off[s]; i < route.slot_off[s + 1]; ++i) slot_of[route.slot_rows[i]] = s;
  const int A = T * K;

  for (const tensor_type type : k_types) {
    const auto gate_up = ref::random_matrix(type, D, 2 * F * E, rng);  // expert e: 2F rows
    const auto down = ref::random_matrix(type, F, D * E, rng);         // expert e: D rows
    std::vector<tensor_view> gu_views, dn_views;
    for (int e : slot_experts) {
      gu_views.push_back(rows_of(type, D, gate_up, e * 2 * F, 2 * F));
      dn_views.push_back(rows_of(type, F, down, e * D, D));
    }
    std::vector<const tensor_view*> gu_parts, dn_parts;
    for (const auto& v : gu_views) gu_parts.push_back(&v);
    for (const auto& v : dn_views) dn_parts.push_back(&v);
    const auto gu_all = upload_matrix(c, gu_parts);
    const auto dn_all = upload_matrix(c, dn_parts);
    const auto x =
        make_activations(c, random_floats(static_cast<size_t>(T) * D, -1.0f, 1.0f, rng), T, D);
    for (const bool xq : {false, true}) {
      if (xq && !is_quantized(type)) continue;
      const std::string xn = xq ? "xq_" : "";
      for (const std::string tile : {"_t1", "_t4", "_tiled"}) {
        SCOPED_TRACE(suffix(type) + (xq ? " quantized x" : " float x") + " tile " + tile);
        const int tt = tile == "_t1" ? 1 : 4;
        const int tiles = (T + tt - 1) / tt;
        // Gate/up over the slots, h quantized too for the down products.
        auto h = c.alloc(static_cast<size_t>(A) * F * 4);
        activations hq;
        hq.q = c.alloc(static_cast<size_t>(A) * F);
        hq.d = c.alloc(static_cast<size_t>(A) * F / 32 * 4);
        hq.s = c.alloc(static_cast<size_t>(A) * F / 32 * 8);
        auto kg = c.make_kernel("matmul_id_glu_" + xn + suffix(type) + tile);
        const int rpi = 32;  // whole blocks per work-item, for the quantized output
        kg.args_from(set_inputs(kg, gu_all, x, xq), h, D, F, rpi, hq.q, hq.d, hq.s, 1, h, slot_off,
                     slot_rows, 0, tiles, K);
        c.launch(kg, {static_cast<size_t>(F / rpi), static_cast<size_t>(S * tiles)});
        hq.f = std::move(h);
        const auto h_id = download<float>(c, hq.f, static_cast<size_t>(A) * F);
        // Down over the slots, from h as float or quantized as the GLU left it.
        auto y = c.alloc(static_cast<size_t>(A) * D * 4);
        auto kd = c.make_kernel("matmul_id_" + xn + suffix(type) + tile);
        kd.args_from(set_inputs(kd, dn_all, hq, xq), y, F, D, 5, slot_off, slot_rows, 0, tiles, 1);
        c.launch(kd, {static_cast<size_t>((D + 4) / 5), static_cast<size_t>(S * tiles)});
        const auto y_id = download<float>(c, y, static_cast<size_t>(A) * D);

        // The dense kernels, one slot's expert at a time, over every row.
        for (int s = 0; s < S; ++s) {
          const tensor_view* gu_s[] = {&gu_views[s]};
          const auto w = upload_matrix(c, {gu_s[0]});
          auto hd = c.alloc(static_cast<size_t>(T) * F * 4);
          auto kgd = c.make_kernel("matmul_glu_" + xn + suffix(type) + "_t1");
          kgd.args_from(set_inputs(kgd, w, x, xq), hd, D, F, T, 1, hd, hd, hd, 0, hd);
          c.launch(kgd, {static_cast<size_t>(F), static_cast<size_t>(T)});
          const auto h_dense = download<float>(c, hd, static_cast<size_t>(T) * F);
          const auto wd = upload_matrix(c, {&dn_views[s]});
          auto yd = c.alloc(static_cast<size_t>(A) * D * 4);
          auto kdd = c.make_kernel("matmul_" + xn + suffix(type) + "_t1");
          kdd.args_from(set_inputs(kdd, wd, hq, xq), yd, F, D, A, D, 0, 1);
          c.launch(kdd, {static_cast<size_t>(D), static_cast<size_t>(A)});
          const auto y_dense = download<float>(c, yd, static_cast<size_t>(A) * D);
          int bad = 0;
          for (int a = 0; a < A; ++a) {
            if (slot_of[a] != s) continue;
            const int t = a / K;
            bad += std::memcmp(&h_id[static_cast<size_t>(a) * F],
                               &h_dense[static_cast<size_t>(t) * F], F * 4) != 0;
            bad += std::memcmp(&y_id[static_cast<size_t>(a) * D],
                               &y_dense[static_cast<size_t>(a) * D], D * 4) != 0;
          }
          EXPECT_EQ(bad, 0) << "slot " << s;
        }
      }
    }
  }
}

}  // namespace
}  // namespace troupe
