#include "runtime/device/cl_binary_cache.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "runtime/device/cl_info.hpp"

namespace troupe::cl {

namespace {

// FNV-1a, 64 bits, twice with different offsets: a cache key, not a
// security boundary (the folder is the user's own).
struct fnv128 {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  void add(const std::string& s) {
    for (unsigned char c : s) {
      a = (a ^ c) * 0x100000001b3ull;
      b = (b ^ c) * 0x100000001b3ull;
    }
    a = (a ^ 0xff) * 0x100000001b3ull;  // a field's end, so "ab"+"c" != "a"+"bc"
    b = (b ^ 0xfe) * 0x100000001b3ull;
  }
};

std::string path_for(const std::string& dir, const std::string& key) {
  return dir + "/" + key + ".bin";
}

}  // namespace

std::string kernel_cache_dir() {
  if (const char* v = std::getenv("TROUPE_KERNEL_CACHE"); v && *v)
    return std::string(v) == "off" ? std::string() : std::string(v);
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v && *v)
    return std::string(v) + "/troupe/kernels";
  if (const char* v = std::getenv("HOME"); v && *v)
    return std::string(v) + "/.cache/troupe/kernels";
  return {};
}

std::string program_cache_key(cl_device_id device, const std::string& options,
                              const std::vector<std::string>& sources) {
  fnv128 h;
  h.add(info_string(clGetDeviceInfo, device, CL_DEVICE_NAME));
  h.add(info_string(clGetDeviceInfo, device, CL_DEVICE_VENDOR));
  h.add(info_string(clGetDeviceInfo, device, CL_DRIVER_VERSION));
  h.add(info_string(clGetDeviceInfo, device, CL_DEVICE_VERSION));
  cl_platform_id platform = nullptr;  // two ICDs may name a device alike (PoCL's CUDA device)
  if (clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, nullptr) ==
      CL_SUCCESS)
    h.add(info_string(clGetPlatformInfo, platform, CL_PLATFORM_VERSION));
  h.add(options);
  for (const auto& s : sources) h.add(s);
  char out[33];
  std::snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(h.a),
                static_cast<unsigned long long>(h.b));
  return out;
}

std::vector<unsigned char> load_program_binary(const std::string& dir, const std::string& key) {
  if (dir.empty()) return {};
  std::ifstream in(path_for(dir, key), std::ios::binary);
  if (!in) return {};
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void store_program_binary(const std::string& dir, const std::string& key, cl_program program) {
  if (dir.empty()) return;
  size_t size = 0;
  if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr) !=
          CL_SUCCESS ||
      size == 0)
    return;
  std::vector<unsigned char> bytes(size);
  unsigned char* p = bytes.data();
  if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof p, &p, nullptr) != CL_SUCCESS) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // Written beside and renamed into place: a reader never sees half a file.
  // Process and a counter: two contexts of one process (pipeline stages
  // on like devices) may store the same key at once.
  static std::atomic<unsigned> serial{0};
  const std::string tmp = path_for(dir, key) + "." + std::to_string(::getpid()) + "." +
                          std::to_string(serial++) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
    out.close();  // a full disk shows here, not in the destructor
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path_for(dir, key), ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace troupe::cl
