#include "runtime/device/cl_programs.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "runtime/device/cl_binary_cache.hpp"
#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/kernel_sources.hpp"

namespace troupe::cl {

namespace {

// The file whose program is every file: layer.cl runs the others' bodies.
const std::string k_whole = "layer";

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The program's build log on `device`.
std::string build_log(cl_program p, cl_device_id device) {
  size_t n = 0;
  clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
  std::string log(n, '\0');
  clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

// A kernel of matmul_panels.cl (F32, Q4_1 or Q8_0 weights in panels).
bool panel_kernel(const std::string& k) {
  return k.find("_f32p_") != std::string::npos || k.find("_q4_1p_") != std::string::npos ||
         k.find("_q8_0p_") != std::string::npos;
}

// The family of a matmul.cl kernel: the name less "matmul_", the kind of
// product and the token tile ("matmul_glu_xq_q4_1_t4": xq_q4_1); empty
// where the name is not so made.
std::string matmul_variant(const std::string& k) {
  if (!starts_with(k, "matmul_") || panel_kernel(k)) return {};
  std::string rest = k.substr(7);
  for (const char* family : {"id_glu_", "id_", "glu_", "qkv_"})
    if (starts_with(rest, family)) {
      rest = rest.substr(std::string(family).size());
      break;
    }
  const size_t tile = rest.rfind('_');
  if (tile == std::string::npos || tile == 0) return {};
  const std::string ts = rest.substr(tile + 1);
  if (ts != "t1" && ts != "t4" && ts != "tiled") return {};
  rest.resize(tile);
  for (char c : rest)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return {};
  return rest;
}

}  // namespace

std::string kernel_file_for(const std::string& k) {
  // Most specific first: the panel kernels are matmul_*f32p_* too.
  static const std::pair<const char*, const char*> rules[] = {
      {"layer_", "layer"},           {"step_", "layer"},
      {"embed_", "embed"},           {"attention", "attention"},
      {"kv_rows_copy", "attention"}, {"argmax_rows", "draw"},
      {"sample_rows", "draw"},       {"moe_", "moe"},
      {"rmsnorm", "norm"},           {"softcap_values", "norm"},
      {"scale_values", "norm"},      {"qk_norm_rope", "norm_rope"},
      {"penalize_rows", "penalty"},  {"quantize_", "quantize"},
      {"round_q8_k", "quantize"},    {"vis_", "vision"}};
  for (const auto& [prefix, file] : rules)
    if (starts_with(k, prefix)) return file;
  if (starts_with(k, "matmul_")) return panel_kernel(k) ? "matmul_panels" : "matmul";
  return {};
}

std::string program_key_for(const std::string& k) {
  const std::string file = kernel_file_for(k);
  if (file != "matmul") return file;
  // Never all of matmul.cl off the CPU: that build is the one NVIDIA's
  // compiler did not finish.
  const std::string variant = matmul_variant(k);
  return variant.empty() ? std::string() : file + ":" + variant;
}

std::vector<std::string> program_files(const std::string& file) {
  std::vector<std::string> out;
  for (const auto& src : embedded_kernel_sources()) {
    const bool needed = src.name == "common" || src.name == file || file == k_whole ||
                        (file == "matmul_panels" && src.name == "matmul");  // its macros
    if (needed) out.push_back(src.name);
  }
  return out;
}

program_set::program_set(cl_context ctx, std::vector<cl_device_id> devices, bool whole)
    : ctx_(ctx), devices_(std::move(devices)), whole_(whole) {}

program_set::~program_set() {
  for (auto& [file, p] : built_) clReleaseProgram(p);
}

void program_set::set_options(const std::string& options) {
  if (options_set_) return;
  options_ = options;
  options_set_ = true;
}

cl_program program_set::program(const std::string& key) {
  const std::string k = whole_ || key.empty() ? k_whole : key;
  if (auto it = built_.find(k); it != built_.end()) return it->second;
  cl_program p = build(k);
  built_.emplace(k, p);
  return p;
}

cl_kernel program_set::create(const std::string& name) {
  auto try_create = [&](cl_program p) -> cl_kernel {
    cl_int rc = CL_SUCCESS;
    cl_kernel k = clCreateKernel(p, name.c_str(), &rc);
    if (rc == CL_INVALID_KERNEL_NAME) return nullptr;
    check(rc, ("clCreateKernel(" + name + ")").c_str());
    return k;
  };
  // Off the CPU no search over the files: one wrong guess could be a
  // build of minutes.  A kernel the rules miss fails here, and
  // KernelPrograms holds every file's kernels to the rules.
  const std::string key = whole_ ? k_whole : program_key_for(name);
  if (key.empty())
    throw cl_error("no program is known to define OpenCL kernel '" + name +
                   "' (kernel_file_for's rules, runtime/device/cl_programs.cpp)");
  if (cl_kernel k = try_create(program(key))) return k;
  throw cl_error("no OpenCL kernel '" + name + "' in kernels/" + key.substr(0, key.find(':')) +
                 ".cl");
}

cl_program program_set::build(const std::string& key) {
  // "matmul:VARIANT": matmul.cl with that family alone (kernels/matmul.cl).
  const size_t colon = key.find(':');
  const std::string file = key.substr(0, colon);
  std::string options = options_;
  if (!whole_ && colon != std::string::npos)
    options += " -DTROUPE_MM_ONE -DTROUPE_MM_" + key.substr(colon + 1);
  else if (!whole_ && file == "matmul_panels")
    options += " -DTROUPE_MM_ONE";  // matmul.cl's macros, none of its kernels
  const std::string what = colon == std::string::npos ? "" : " (" + key.substr(colon + 1) + ")";
  std::vector<std::string> texts;
  for (const auto& name : program_files(file))
    for (const auto& src : embedded_kernel_sources())
      if (src.name == name) texts.push_back(src.text);
  const auto t0 = std::chrono::steady_clock::now();
  // One device: its binary may be on disk already (a CPU device builds the
  // whole program in seconds, and PoCL keeps its own cache).
  const bool cacheable = !whole_ && devices_.size() == 1;
  const std::string dir = cacheable ? kernel_cache_dir() : std::string();
  const std::string cache_key = cacheable ? program_cache_key(devices_[0], options, texts) : "";
  if (cacheable) {
    const auto bin = load_program_binary(dir, cache_key);
    if (!bin.empty()) {
      const unsigned char* data = bin.data();
      const size_t size = bin.size();
      cl_int status = CL_SUCCESS, rc = CL_SUCCESS;
      cl_program p =
          clCreateProgramWithBinary(ctx_, 1, devices_.data(), &size, &data, &status, &rc);
      if (rc == CL_SUCCESS && status == CL_SUCCESS &&
          clBuildProgram(p, 1, devices_.data(), options.c_str(), nullptr, nullptr) == CL_SUCCESS) {
        ++from_disk_;
        return p;
      }
      if (p) clReleaseProgram(p);  // stale or foreign: built from source below
    }
  }
  std::vector<const char*> ptrs;
  std::vector<size_t> lengths;
  for (const auto& t : texts) {
    ptrs.push_back(t.c_str());
    lengths.push_back(t.size());
  }
  cl_int rc = CL_SUCCESS;
  cl_program p = clCreateProgramWithSource(ctx_, static_cast<cl_uint>(ptrs.size()), ptrs.data(),
                                           lengths.data(), &rc);
  check(rc, "clCreateProgramWithSource");
  if (!whole_) spdlog::info("building kernels/{}.cl{}", file, what);
  rc = clBuildProgram(p, static_cast<cl_uint>(devices_.size()), devices_.data(), options.c_str(),
                      nullptr, nullptr);
  if (rc != CL_SUCCESS) {
    std::string log;
    for (cl_device_id d : devices_) log += build_log(p, d);  // the failing one's is not empty
    clReleaseProgram(p);
    throw cl_error("building OpenCL kernels (" + file + what + ") failed: " + error_name(rc) +
                   "\n" + log);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!whole_) spdlog::info("built kernels/{}.cl{} in {:.1f} s", file, what, s);
  if (cacheable) store_program_binary(dir, cache_key, p);
  return p;
}

}  // namespace troupe::cl
