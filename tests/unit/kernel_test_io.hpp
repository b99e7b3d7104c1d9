#pragma once
// Helpers of the kernel tests (test_kernels*.cpp): buffers to and from the
// device, random inputs, and kernel-name suffixes.
#include <cctype>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/model/model_file.hpp"
#include "runtime/model/tensor_type.hpp"

namespace troupe::kernel_test {

// A context of a kernel test file, made and built once for the whole run,
// or why none could be made (the tests then skip).
struct shared_context {
  std::unique_ptr<cl::context> ctx;
  std::string no_device;
};

// Makes `s` once: a context on the first device, its program built with
// the options `options(context)` gives; where they are nullopt the device
// does not suit (no_device says `refusal`).  A build failure throws out of
// the test that asked: a failure, not a skip.
template <class Options>
shared_context& make_once(shared_context& s, Options options, const char* refusal = "") {
  if (s.ctx || !s.no_device.empty()) return s;
  std::unique_ptr<cl::context> ctx;
  try {
    ctx = std::make_unique<cl::context>();
  } catch (const cl::cl_error& e) {
    s.no_device = e.what();
    return s;
  }
  const std::optional<std::string> opts = options(*ctx);
  if (!opts) {
    s.no_device = refusal;
    return s;
  }
  ctx->build(*opts);
  s.ctx = std::move(ctx);
  return s;
}

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

inline std::vector<float> random_floats(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// "q4_0" for Q4_0: the suffix of the kernel names.
inline std::string suffix(tensor_type t) {
  std::string s(traits_of(t).name);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// An N-row matrix of K-value rows of type t in the file's bytes `data`.
inline tensor_view view_of(tensor_type t, int K, int N, const uint8_t* data) {
  return tensor_view{"w", t, {K, N}, data, row_bytes(t, K) * static_cast<size_t>(N)};
}

}  // namespace troupe::kernel_test
