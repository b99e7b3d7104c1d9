// The programs built from kernels/*.cl: each file builds alone (with
// common.cl and what it needs) as a GPU build does, every kernel
// it defines is found by kernel_file_for's rules, and a built program's
// binary kept on disk builds the same kernel again.
#include <gtest/gtest.h>

#include <CL/cl.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/device/cl_binary_cache.hpp"
#include "runtime/device/cl_programs.hpp"
#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/kernel_sources.hpp"

namespace troupe {
namespace {

// Sets an environment variable for a scope, whatever happens in it.
struct env_guard {
  std::string name, saved;
  bool had;
  env_guard(const char* n, const std::string& value) : name(n) {
    const char* old = std::getenv(n);
    had = old != nullptr;
    if (had) saved = old;
    ::setenv(n, value.c_str(), 1);
  }
  ~env_guard() {
    if (had)
      ::setenv(name.c_str(), saved.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

// A bare context on the first device, without troupe's own wrapper: the
// program set is what is under test.
struct bare_device {
  cl_device_id device = nullptr;
  cl_context ctx = nullptr;
  cl_command_queue queue = nullptr;
  bare_device() {
    cl_platform_id platform = nullptr;
    if (clGetPlatformIDs(1, &platform, nullptr) != CL_SUCCESS) return;
    if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, nullptr) != CL_SUCCESS) return;
    cl_int rc = CL_SUCCESS;
    ctx = clCreateContext(nullptr, 1, &device, nullptr, nullptr, &rc);
    if (rc != CL_SUCCESS) ctx = nullptr;
    if (ctx) queue = clCreateCommandQueueWithProperties(ctx, device, nullptr, &rc);
  }
  ~bare_device() {
    if (queue) clReleaseCommandQueue(queue);
    if (ctx) clReleaseContext(ctx);
  }
};

// The options of a device that fuses no layers (a GPU's), as llama_forward
// makes them.
const char* k_gpu_options = "-cl-std=CL1.2 -cl-mad-enable -DTROUPE_TILE=4";

std::vector<std::string> kernel_names(cl_program p) {
  size_t n = 0;
  clGetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, 0, nullptr, &n);
  std::string all(n, '\0');
  clGetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, n, all.data(), nullptr);
  while (!all.empty() && all.back() == '\0') all.pop_back();
  std::vector<std::string> out;
  std::stringstream ss(all);
  for (std::string name; std::getline(ss, name, ';');)
    if (!name.empty()) out.push_back(name);
  return out;
}

// matmul.cl's families, as its kernels' names spell them.
const char* k_matmul_variants[] = {"f32",     "f16",     "q4_0",   "q4_1",    "q8_0",
                                   "ku6",     "q5_1",    "q5_0",   "bf16",    "xq_q4_0",
                                   "xq_q4_1", "xq_q8_0", "xq_ku6", "xq_q5_1", "xq_q5_0"};

TEST(KernelPrograms, EveryFileBuildsAloneAndTheRulesFindEachOfItsKernels) {
  bare_device d;
  if (!d.ctx) GTEST_SKIP() << "no OpenCL device";
  cl_device_type type = 0;
  clGetDeviceInfo(d.device, CL_DEVICE_TYPE, sizeof type, &type, nullptr);
  // PoCL takes a while over each matmul family without the fused layers'
  // options (a CPU device never builds them so): there one family; on a
  // GPU every one.
  const bool cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  env_guard no_cache("TROUPE_KERNEL_CACHE", "off");  // build each, keep none
  for (const char* kv : {"", " -DTROUPE_KV_F16"}) {
    cl::program_set set(d.ctx, {d.device}, /*whole=*/false);
    set.set_options(std::string(k_gpu_options) + kv);
    std::vector<std::string> keys;
    for (const auto& src : embedded_kernel_sources())
      if (src.name != "common" && src.name != "layer" && src.name != "matmul")
        keys.push_back(src.name);  // layer: CPU only, in the whole program
    for (const char* v : k_matmul_variants)
      if (!cpu || std::string(v) == "xq_q4_1") keys.push_back(std::string("matmul:") + v);
    size_t total = 0;
    for (const auto& key : keys) {
      SCOPED_TRACE(key + kv);
      const auto names = kernel_names(set.program(key));
      for (const auto& name : names) EXPECT_EQ(cl::program_key_for(name), key) << name;
      if (key.rfind("matmul:", 0) == 0)
        EXPECT_EQ(names.size(), 15u);  // 5 kinds of product x 3 token tiles
      else
        EXPECT_GT(names.size(), 0u);
      total += names.size();
    }
    EXPECT_GT(total, cpu ? 40u : 250u);
  }
}

// On a CPU only one family's guard is built: the others' are checked as text.
TEST(KernelPrograms, EveryMatmulFamilyHasItsGuard) {
  std::string matmul;
  for (const auto& src : embedded_kernel_sources())
    if (src.name == "matmul") matmul = src.text;
  size_t families = 0;
  for (size_t at = 0; (at = matmul.find("\nTROUPE_MATMUL_FAMILY", at)) != std::string::npos; ++at)
    ++families;
  EXPECT_EQ(families, std::size(k_matmul_variants));
  for (const char* v : k_matmul_variants)
    EXPECT_NE(matmul.find(std::string("defined(TROUPE_MM_") + v + ")"), std::string::npos) << v;
}

TEST(KernelPrograms, ProgramFilesAreCommonWhatAFileNeedsAndTheFile) {
  EXPECT_EQ(cl::program_files("norm"), (std::vector<std::string>{"common", "norm"}));
  EXPECT_EQ(cl::program_files("matmul_panels"),
            (std::vector<std::string>{"common", "matmul", "matmul_panels"}));
  const auto whole = cl::program_files("layer");
  EXPECT_EQ(whole.size(), embedded_kernel_sources().size());
  EXPECT_EQ(whole.front(), "common");
  EXPECT_EQ(whole.back(), "layer");
  EXPECT_EQ(cl::kernel_file_for("matmul_glu_f32p_t4"), "matmul_panels");
  EXPECT_EQ(cl::kernel_file_for("matmul_qkv_xq_q4_1_t1"), "matmul");
  EXPECT_EQ(cl::kernel_file_for("no_such"), "");
  EXPECT_EQ(cl::program_key_for("matmul_id_glu_xq_q4_1_tiled"), "matmul:xq_q4_1");
  EXPECT_EQ(cl::program_key_for("matmul_q5_0_t4"), "matmul:q5_0");
  EXPECT_EQ(cl::program_key_for("matmul_qkv_f32p_t1"), "matmul_panels");
  EXPECT_EQ(cl::program_key_for("rmsnorm_q8"), "norm");
  EXPECT_EQ(cl::program_key_for("matmul_q4_1"), "");  // never all of matmul.cl
  EXPECT_EQ(cl::program_key_for("matmul_q4_1_t9"), "");
}

// Runs scale_values (x *= s) over 64 values with a kernel of `set`.
std::vector<float> scale_by_two(bare_device& d, cl::program_set& set) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 20.5f;
  cl_int rc = CL_SUCCESS;
  cl_mem b = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                            x.size() * sizeof(float), x.data(), &rc);
  EXPECT_EQ(rc, CL_SUCCESS);
  cl_kernel k = set.create("scale_values");
  const float s = 2.0f;
  const int n = static_cast<int>(x.size());
  clSetKernelArg(k, 0, sizeof b, &b);
  clSetKernelArg(k, 1, sizeof s, &s);
  clSetKernelArg(k, 2, sizeof n, &n);
  const size_t global = x.size();
  EXPECT_EQ(clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<float> y(x.size());
  clEnqueueReadBuffer(d.queue, b, CL_TRUE, 0, y.size() * sizeof(float), y.data(), 0, nullptr,
                      nullptr);
  clReleaseKernel(k);
  clReleaseMemObject(b);
  return y;
}

TEST(KernelPrograms, ABuiltProgramIsKeptOnDiskAndBuildsTheSameKernelAgain) {
  bare_device d;
  if (!d.ctx) GTEST_SKIP() << "no OpenCL device";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-kernel-cache-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  struct remove_dir {
    std::filesystem::path p;
    ~remove_dir() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } cleanup{dir};
  env_guard cache("TROUPE_KERNEL_CACHE", dir.string());
  std::vector<float> first, second;
  {
    cl::program_set set(d.ctx, {d.device}, false);
    set.set_options(k_gpu_options);
    first = scale_by_two(d, set);
    EXPECT_EQ(set.from_disk(), 0);
  }
  size_t files = 0;
  ASSERT_TRUE(std::filesystem::is_directory(dir));
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  ASSERT_EQ(files, 1u);  // norm.cl's program, and nothing half-written beside it
  {
    cl::program_set set(d.ctx, {d.device}, false);
    set.set_options(k_gpu_options);
    second = scale_by_two(d, set);
    EXPECT_EQ(set.from_disk(), 1);
  }
  {  // Other options: another key, built from source.
    cl::program_set set(d.ctx, {d.device}, false);
    set.set_options(std::string(k_gpu_options) + " -DTROUPE_KV_F16");
    scale_by_two(d, set);
    EXPECT_EQ(set.from_disk(), 0);
  }
  ASSERT_TRUE(std::filesystem::is_directory(dir));
  // A cache file that is not a binary: built from source again.
  for (const auto& e : std::filesystem::directory_iterator(dir))
    std::filesystem::resize_file(e.path(), 7);
  std::vector<float> third;
  {
    cl::program_set set(d.ctx, {d.device}, false);
    set.set_options(k_gpu_options);
    third = scale_by_two(d, set);
    EXPECT_EQ(set.from_disk(), 0);
  }
  ASSERT_EQ(first.size(), 64u);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i], 2.0f * (static_cast<float>(i) - 20.5f));
    EXPECT_EQ(second[i], first[i]);
    EXPECT_EQ(third[i], first[i]);
  }
}

}  // namespace
}  // namespace troupe
