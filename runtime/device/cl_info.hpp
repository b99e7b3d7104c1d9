#pragma once
// A string property of an OpenCL device or platform, as a std::string
// (clGetDeviceInfo / clGetPlatformInfo report a size, then the bytes with
// their terminating NUL); empty when the driver does not answer.  Shared
// by the runtime (names, extensions) and the binary cache (its key).
#include <CL/cl.h>

#include <string>

namespace troupe::cl {

template <class Get, class Handle, class Param>
std::string info_string(Get get, Handle h, Param what) {
  size_t n = 0;
  if (get(h, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  if (get(h, what, n, s.data(), nullptr) != CL_SUCCESS) return {};
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

}  // namespace troupe::cl
