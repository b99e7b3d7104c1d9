#pragma once
// Helpers of the kernel tests (test_kernels*.cpp): buffers to and from the
// device, random inputs, and kernel-name suffixes.
#include <cctype>
#include <random>
#include <string>
#include <vector>

#include "runtime/cl_runtime.hpp"
#include "runtime/tensor_type.hpp"

namespace troupe::kernel_test {

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

}  // namespace troupe::kernel_test
