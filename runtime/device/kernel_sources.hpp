#pragma once
// The OpenCL C sources of kernels/*.cl, embedded at build time.
#include <string>
#include <vector>

namespace troupe {

struct kernel_source {
  std::string name;  // file name without .cl
  std::string text;
};

const std::vector<kernel_source>& embedded_kernel_sources();

}  // namespace troupe
