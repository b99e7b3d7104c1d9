#include "runtime/device/cl_runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/device/cl_info.hpp"
#include "runtime/device/cl_programs.hpp"

namespace troupe::cl {

const char* error_name(cl_int code) {
  switch (code) {
#define TROUPE_CL_CASE(x) \
  case x:                 \
    return #x;
    TROUPE_CL_CASE(CL_SUCCESS)
    TROUPE_CL_CASE(CL_DEVICE_NOT_FOUND)
    TROUPE_CL_CASE(CL_DEVICE_NOT_AVAILABLE)
    TROUPE_CL_CASE(CL_COMPILER_NOT_AVAILABLE)
    TROUPE_CL_CASE(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    TROUPE_CL_CASE(CL_OUT_OF_RESOURCES)
    TROUPE_CL_CASE(CL_OUT_OF_HOST_MEMORY)
    TROUPE_CL_CASE(CL_BUILD_PROGRAM_FAILURE)
    TROUPE_CL_CASE(CL_INVALID_VALUE)
    TROUPE_CL_CASE(CL_INVALID_PLATFORM)
    TROUPE_CL_CASE(CL_INVALID_DEVICE)
    TROUPE_CL_CASE(CL_INVALID_CONTEXT)
    TROUPE_CL_CASE(CL_INVALID_COMMAND_QUEUE)
    TROUPE_CL_CASE(CL_INVALID_MEM_OBJECT)
    TROUPE_CL_CASE(CL_INVALID_BUFFER_SIZE)
    TROUPE_CL_CASE(CL_INVALID_PROGRAM)
    TROUPE_CL_CASE(CL_INVALID_PROGRAM_EXECUTABLE)
    TROUPE_CL_CASE(CL_INVALID_KERNEL_NAME)
    TROUPE_CL_CASE(CL_INVALID_KERNEL)
    TROUPE_CL_CASE(CL_INVALID_ARG_INDEX)
    TROUPE_CL_CASE(CL_INVALID_ARG_VALUE)
    TROUPE_CL_CASE(CL_INVALID_ARG_SIZE)
    TROUPE_CL_CASE(CL_INVALID_KERNEL_ARGS)
    TROUPE_CL_CASE(CL_INVALID_WORK_DIMENSION)
    TROUPE_CL_CASE(CL_INVALID_WORK_GROUP_SIZE)
    TROUPE_CL_CASE(CL_INVALID_GLOBAL_WORK_SIZE)
    TROUPE_CL_CASE(CL_INVALID_GLOBAL_OFFSET)
    TROUPE_CL_CASE(CL_PLATFORM_NOT_FOUND_KHR)
#undef TROUPE_CL_CASE
    default:
      return "CL_UNKNOWN_ERROR";
  }
}

void check(cl_int code, const char* what) {
  if (code != CL_SUCCESS)
    throw cl_error(std::string(what) + " failed: " + error_name(code) + " (" +
                   std::to_string(code) + ")");
}

namespace {

std::vector<cl_platform_id> platforms() {
  cl_uint n = 0;
  cl_int rc = clGetPlatformIDs(0, nullptr, &n);
  if (rc == CL_PLATFORM_NOT_FOUND_KHR || n == 0)
    throw cl_error(
        "no OpenCL platform found; install one (Debian: apt-get install pocl-opencl-icd, "
        "or run `bash tools/setup.sh deps`)");
  check(rc, "clGetPlatformIDs");
  std::vector<cl_platform_id> ps(n);
  check(clGetPlatformIDs(n, ps.data(), nullptr), "clGetPlatformIDs");
  return ps;
}

std::vector<cl_device_id> devices_of(cl_platform_id p) {
  cl_uint n = 0;
  if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::vector<cl_device_id> ds(n);
  check(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n, ds.data(), nullptr), "clGetDeviceIDs");
  return ds;
}

// `device` split equally into sub-devices of `cores` compute units; of
// them [first, first + count) are kept and the rest released.  `n` is how
// many the split made; when that is fewer than first + count, none is kept
// (empty).
std::vector<cl_device_id> sub_devices(cl_device_id device, int cores, int first, int count,
                                      cl_uint& n) {
  const cl_device_partition_property props[] = {
      CL_DEVICE_PARTITION_EQUALLY, static_cast<cl_device_partition_property>(cores), 0};
  n = 0;
  check(clCreateSubDevices(device, props, 0, nullptr, &n), "clCreateSubDevices");
  if (first < 0 || n < static_cast<cl_uint>(first + count)) return {};
  std::vector<cl_device_id> all(n), kept;
  check(clCreateSubDevices(device, props, n, all.data(), nullptr), "clCreateSubDevices");
  for (cl_uint i = 0; i < n; ++i) {
    if (i >= static_cast<cl_uint>(first) && i < static_cast<cl_uint>(first + count))
      kept.push_back(all[i]);
    else
      clReleaseDevice(all[i]);
  }
  return kept;
}

}  // namespace

buffer& buffer::operator=(buffer&& o) noexcept {
  if (this != &o) {
    if (mem_) clReleaseMemObject(mem_);
    mem_ = o.mem_;
    bytes_ = o.bytes_;
    o.mem_ = nullptr;
  }
  return *this;
}

buffer::~buffer() {
  if (mem_) clReleaseMemObject(mem_);
}

kernel& kernel::operator=(kernel&& o) noexcept {
  if (this != &o) {
    if (k_) clReleaseKernel(k_);
    k_ = o.k_;
    o.k_ = nullptr;
  }
  return *this;
}

kernel::~kernel() {
  if (k_) clReleaseKernel(k_);
}

int partition_units(const device_choice& choice) {
  auto ps = platforms();
  if (choice.platform < 0 || choice.platform >= static_cast<int>(ps.size()))
    throw cl_error("OpenCL platform " + std::to_string(choice.platform) + " does not exist (" +
                   std::to_string(ps.size()) + " available)");
  auto ds = devices_of(ps[choice.platform]);
  if (choice.device < 0 || choice.device >= static_cast<int>(ds.size()))
    throw cl_error("OpenCL device " + std::to_string(choice.device) +
                   " does not exist on platform " + std::to_string(choice.platform));
  const cl_device_id d = ds[choice.device];
  size_t bytes = 0;
  if (clGetDeviceInfo(d, CL_DEVICE_PARTITION_PROPERTIES, 0, nullptr, &bytes) != CL_SUCCESS)
    return 0;
  std::vector<cl_device_partition_property> props(bytes / sizeof(cl_device_partition_property));
  if (props.empty() || clGetDeviceInfo(d, CL_DEVICE_PARTITION_PROPERTIES, bytes, props.data(),
                                       nullptr) != CL_SUCCESS)
    return 0;
  if (std::find(props.begin(), props.end(), CL_DEVICE_PARTITION_EQUALLY) == props.end()) return 0;
  if (choice.cores > 0) return choice.cores;
  cl_uint cu = 1;
  clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cu), &cu, nullptr);
  return static_cast<int>(cu);
}

context::context(device_choice choice, int shards) {
  auto ps = platforms();
  if (choice.platform < 0 || choice.platform >= static_cast<int>(ps.size()))
    throw cl_error("OpenCL platform " + std::to_string(choice.platform) + " does not exist (" +
                   std::to_string(ps.size()) + " available)");
  platform_ = ps[choice.platform];
  auto ds = devices_of(platform_);
  if (choice.device < 0 || choice.device >= static_cast<int>(ds.size()))
    throw cl_error("OpenCL device " + std::to_string(choice.device) +
                   " does not exist on platform " + std::to_string(choice.platform) + " (" +
                   std::to_string(ds.size()) + " available)");
  device_ = ds[choice.device];
  device_name_ = info_string(clGetDeviceInfo, device_, CL_DEVICE_NAME);
  if (choice.cores > 0) {
    cl_uint n = 0;
    const auto slice = sub_devices(device_, choice.cores, choice.slice, 1, n);
    if (slice.empty())
      throw cl_error("device '" + device_name_ + "' splits into " + std::to_string(n) +
                     " slices of " + std::to_string(choice.cores) + " compute units; slice " +
                     std::to_string(choice.slice) + " does not exist");
    device_ = slice_device_ = slice[0];
    device_name_ += " (slice " + std::to_string(choice.slice) + ", " +
                    std::to_string(choice.cores) +
                    (choice.cores == 1 ? " compute unit)" : " compute units)");
  }
  cl_ulong mem = 0;
  clGetDeviceInfo(device_, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(mem), &mem, nullptr);
  global_mem_ = static_cast<size_t>(mem);
  clGetDeviceInfo(device_, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(mem), &mem, nullptr);
  max_alloc_ = static_cast<size_t>(mem);
  cl_uint align_bits = 1024;
  clGetDeviceInfo(device_, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(align_bits), &align_bits, nullptr);
  base_align_ = std::max<size_t>(align_bits / 8, 1);
  cl_uint cu = 1;
  clGetDeviceInfo(device_, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cu), &cu, nullptr);
  compute_units_ = static_cast<int>(cu);
  cl_device_type type = 0;
  clGetDeviceInfo(device_, CL_DEVICE_TYPE, sizeof(type), &type, nullptr);
  cpu_ = (type & CL_DEVICE_TYPE_CPU) != 0;
#if defined(__x86_64__)
  const bool pocl_cpu = (type & CL_DEVICE_TYPE_CPU) &&
                        info_string(clGetPlatformInfo, platform_, CL_PLATFORM_NAME)
                                .find("Portable Computing Language") != std::string::npos;
  x86_avx512_ = pocl_cpu && __builtin_cpu_supports("avx512f");
  x86_vnni_ =
      x86_avx512_ && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  x86_avx2_ = pocl_cpu && !x86_avx512_ && __builtin_cpu_supports("avx2") &&
              __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  cl_int rc = CL_SUCCESS;
  std::vector<cl_device_id> devices{device_};
  if (shards >= 2) {
    cl_uint n = 0;
    sub_devices_ = sub_devices(device_, 1, 0, shards, n);
    if (sub_devices_.empty())
      throw cl_error("device '" + device_name_ + "' splits into " + std::to_string(n) +
                     " sub-devices of one compute unit, fewer than the " + std::to_string(shards) +
                     " expert devices asked for");
    devices.insert(devices.end(), sub_devices_.begin(), sub_devices_.end());
  }
  ctx_ = clCreateContext(nullptr, static_cast<cl_uint>(devices.size()), devices.data(), nullptr,
                         nullptr, &rc);
  check(rc, "clCreateContext");
  programs_ = std::make_unique<program_set>(ctx_, devices, cpu_);
  queue_ = clCreateCommandQueueWithProperties(ctx_, device_, nullptr, &rc);
  check(rc, "clCreateCommandQueueWithProperties");
  const cl_queue_properties timed[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  for (cl_device_id d : sub_devices_) {
    shard_queues_.push_back(clCreateCommandQueueWithProperties(ctx_, d, timed, &rc));
    check(rc, "clCreateCommandQueueWithProperties(sub-device)");
  }
  forked_.assign(shard_queues_.size(), 0);
  shard_events_.resize(shard_queues_.size());
  shard_busy_.assign(shard_queues_.size(), 0.0);
  profiling_ = std::getenv("TROUPE_PROFILE") != nullptr;
  if (info_string(clGetDeviceInfo, device_, CL_DEVICE_EXTENSIONS).find("cl_khr_command_buffer") !=
      std::string::npos) {
    auto fn = [&](const char* name) {
      return clGetExtensionFunctionAddressForPlatform(platform_, name);
    };
    command_buffer_api api;
    api.create = reinterpret_cast<clCreateCommandBufferKHR_fn>(fn("clCreateCommandBufferKHR"));
    api.ndrange = reinterpret_cast<clCommandNDRangeKernelKHR_fn>(fn("clCommandNDRangeKernelKHR"));
    api.finalize =
        reinterpret_cast<clFinalizeCommandBufferKHR_fn>(fn("clFinalizeCommandBufferKHR"));
    api.enqueue = reinterpret_cast<clEnqueueCommandBufferKHR_fn>(fn("clEnqueueCommandBufferKHR"));
    api.release = reinterpret_cast<clReleaseCommandBufferKHR_fn>(fn("clReleaseCommandBufferKHR"));
    if (api.create && api.ndrange && api.finalize && api.enqueue && api.release) cb_ = api;
  }
}

command_buffer& command_buffer::operator=(command_buffer&& o) noexcept {
  if (this != &o) {
    this->~command_buffer();
    cb_ = o.cb_;
    release_ = o.release_;
    kernels_ = std::move(o.kernels_);
    o.cb_ = nullptr;
    o.kernels_.clear();
  }
  return *this;
}

command_buffer::~command_buffer() {
  if (cb_) release_(cb_);
  cb_ = nullptr;
  for (cl_kernel k : kernels_) clReleaseKernel(k);
  kernels_.clear();
}

void context::begin_recording() {
  if (!command_buffers()) throw cl_error("this device records no command buffers");
  if (recording_.get()) throw cl_error("begin_recording: a recording is open");
  cl_int rc = CL_SUCCESS;
  recording_ = command_buffer(cb_.create(1, &queue_, nullptr, &rc), cb_.release);
  check(rc, "clCreateCommandBufferKHR");
  has_sync_ = false;
}

command_buffer context::end_recording() {
  command_buffer out = std::move(recording_);
  if (!out.get()) throw cl_error("end_recording: no recording is open");
  check(cb_.finalize(out.get()), "clFinalizeCommandBufferKHR");
  return out;
}

void context::replay(const command_buffer& cb) {
  check(cb_.enqueue(0, nullptr, cb.get(), 0, nullptr, nullptr), "clEnqueueCommandBufferKHR");
}

context::~context() {
  for (const auto& [name, v] : profile_)
    std::fprintf(stderr, "[profile] %-22s %8ld launches %10.3f ms total %8.1f us each\n",
                 name.c_str(), v.second, v.first * 1e3, v.first * 1e6 / v.second);
  if (queue_) {
    clFinish(queue_);
    clReleaseCommandQueue(queue_);
  }
  for (cl_command_queue q : shard_queues_) {
    clFinish(q);
    clReleaseCommandQueue(q);
  }
  for (auto& evs : shard_events_)
    for (cl_event e : evs) clReleaseEvent(e);
  if (fork_event_) clReleaseEvent(fork_event_);
  programs_.reset();
  for (cl_device_id d : sub_devices_) clReleaseDevice(d);
  if (ctx_) clReleaseContext(ctx_);
  if (slice_device_) clReleaseDevice(slice_device_);
}

buffer context::alloc(size_t bytes, const void* init) {
  cl_int rc = CL_SUCCESS;
  size_t n = bytes == 0 ? 4 : bytes;  // zero-sized buffers are invalid in OpenCL
  cl_mem_flags flags = CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0);
  cl_mem m = clCreateBuffer(ctx_, flags, n, const_cast<void*>(init), &rc);
  check(rc, "clCreateBuffer");
  return buffer(m, bytes);
}

buffer context::sub_buffer(const buffer& parent, size_t offset, size_t bytes) {
  cl_buffer_region region{offset, bytes == 0 ? 4 : bytes};
  cl_int rc = CL_SUCCESS;
  cl_mem m = clCreateSubBuffer(parent.get(), CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                               &region, &rc);
  check(rc, "clCreateSubBuffer");
  return buffer(m, bytes);
}

void context::copy(const buffer& src, const buffer& dst, size_t bytes, size_t dst_offset) {
  if (bytes == 0) return;
  check(
      clEnqueueCopyBuffer(queue_, src.get(), dst.get(), 0, dst_offset, bytes, 0, nullptr, nullptr),
      "clEnqueueCopyBuffer");
}

namespace {

// `rows` blocks contiguous in the buffer from `offset`: a 2-D region whose
// rows are `block` bytes (the host side gives its own row pitch).
struct rows_region {
  size_t buffer_origin[3];
  size_t host_origin[3] = {0, 0, 0};
  size_t region[3];
  rows_region(size_t block, size_t rows, size_t offset)
      : buffer_origin{offset, 0, 0}, region{block, rows, 1} {}
};

}  // namespace

void context::read_rows(const buffer& b, void* dst, size_t block, size_t rows, size_t offset,
                        size_t host_pitch, size_t buffer_pitch) {
  if (block == 0 || rows == 0) return;
  const rows_region r(block, rows, offset);
  check(clEnqueueReadBufferRect(queue_, b.get(), CL_FALSE, r.buffer_origin, r.host_origin, r.region,
                                buffer_pitch ? buffer_pitch : block, 0, host_pitch, 0, dst, 0,
                                nullptr, nullptr),
        "clEnqueueReadBufferRect");
}

void context::write_rows(const buffer& b, const void* src, size_t block, size_t rows, size_t offset,
                         size_t host_pitch, size_t buffer_pitch) {
  if (block == 0 || rows == 0) return;
  const rows_region r(block, rows, offset);
  check(clEnqueueWriteBufferRect(queue_, b.get(), CL_FALSE, r.buffer_origin, r.host_origin,
                                 r.region, buffer_pitch ? buffer_pitch : block, 0, host_pitch, 0,
                                 src, 0, nullptr, nullptr),
        "clEnqueueWriteBufferRect");
}

void context::write(const buffer& b, const void* src, size_t bytes, size_t offset, bool blocking) {
  if (bytes == 0) return;
  check(clEnqueueWriteBuffer(queue_, b.get(), blocking ? CL_TRUE : CL_FALSE, offset, bytes, src, 0,
                             nullptr, nullptr),
        "clEnqueueWriteBuffer");
}

event& event::operator=(event&& o) noexcept {
  if (this != &o) {
    if (e_) clReleaseEvent(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

event::~event() {
  if (e_) clReleaseEvent(e_);
}

void event::wait() const {
  check(clWaitForEvents(1, &e_), "clWaitForEvents");
  cl_int status = CL_COMPLETE;
  check(clGetEventInfo(e_, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr),
        "clGetEventInfo");
  check(status < 0 ? status : CL_SUCCESS, "command");
}

namespace {

void CL_CALLBACK run_completion(cl_event, cl_int status, void* user) {
  std::unique_ptr<std::function<void(bool)>> fn(static_cast<std::function<void(bool)>*>(user));
  (*fn)(status == CL_COMPLETE);
}

}  // namespace

void event::on_complete(std::function<void(bool ok)> fn) const {
  auto* user = new std::function<void(bool)>(std::move(fn));
  const cl_int err = clSetEventCallback(e_, CL_COMPLETE, run_completion, user);
  if (err != CL_SUCCESS) delete user;
  check(err, "clSetEventCallback");
}

event context::read_async(const buffer& b, void* dst, size_t bytes, size_t offset) {
  cl_event e = nullptr;
  check(clEnqueueReadBuffer(queue_, b.get(), CL_FALSE, offset, bytes, dst, 0, nullptr, &e),
        "clEnqueueReadBuffer");
  event out(e);
  check(clFlush(queue_), "clFlush");
  return out;
}

event context::marker() {
  cl_event e = nullptr;
  check(clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &e), "clEnqueueMarkerWithWaitList");
  event out(e);
  check(clFlush(queue_), "clFlush");
  return out;
}

void context::read(const buffer& b, void* dst, size_t bytes, size_t offset) {
  if (bytes == 0) return;
  check(clEnqueueReadBuffer(queue_, b.get(), CL_TRUE, offset, bytes, dst, 0, nullptr, nullptr),
        "clEnqueueReadBuffer");
}

void context::build(const std::string& options) {
  programs_->set_options(options);
}

kernel context::make_kernel(const std::string& name) {
  if (!programs_->has_options()) throw cl_error("make_kernel(" + name + ") before build()");
  return kernel(programs_->create(name));
}

void context::launch(const kernel& k, std::vector<size_t> global, std::vector<size_t> local) {
  if (!local.empty())
    for (size_t i = 0; i < global.size(); ++i)  // round up to whole work-groups
      global[i] = (global[i] + local[i] - 1) / local[i] * local[i];
  if (recording_.get()) {
    // Each command after the one before, as the in-order queue runs them.
    cl_sync_point_khr sync = 0;
    cl_int rc = CL_SUCCESS;
    cl_kernel clone = clCloneKernel(k.get(), &rc);  // its arguments as they are now
    check(rc, "clCloneKernel");
    recording_.keep(clone);
    check(
        cb_.ndrange(recording_.get(), nullptr, nullptr, clone, static_cast<cl_uint>(global.size()),
                    nullptr, global.data(), local.empty() ? nullptr : local.data(),
                    has_sync_ ? 1 : 0, has_sync_ ? &last_sync_ : nullptr, &sync, nullptr),
        "clCommandNDRangeKernelKHR");
    last_sync_ = sync;
    has_sync_ = true;
    return;
  }
  std::chrono::steady_clock::time_point t0;
  if (profiling_) {
    finish();
    t0 = std::chrono::steady_clock::now();
  }
  check(clEnqueueNDRangeKernel(queue_, k.get(), static_cast<cl_uint>(global.size()), nullptr,
                               global.data(), local.empty() ? nullptr : local.data(), 0, nullptr,
                               nullptr),
        "clEnqueueNDRangeKernel");
  if (profiling_) {
    finish();
    char name[128] = {0};
    clGetKernelInfo(k.get(), CL_KERNEL_FUNCTION_NAME, sizeof(name) - 1, name, nullptr);
    auto& slot = profile_[name];
    slot.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    slot.second += 1;
  }
}

void context::finish() {
  check(clFinish(queue_), "clFinish");
}

void context::fork() {
  if (fork_event_) clReleaseEvent(fork_event_);
  fork_event_ = nullptr;
  check(clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &fork_event_), "clEnqueueMarker(fork)");
  std::fill(forked_.begin(), forked_.end(), 0);
}

void context::launch_on(int shard, const kernel& k, std::vector<size_t> global,
                        std::vector<size_t> local) {
  if (shard < 0 || shard >= shards())
    throw cl_error("launch_on: no shard " + std::to_string(shard));
  if (!local.empty())
    for (size_t i = 0; i < global.size(); ++i)
      global[i] = (global[i] + local[i] - 1) / local[i] * local[i];
  const bool first = !forked_[shard] && fork_event_;
  cl_event done = nullptr;
  check(clEnqueueNDRangeKernel(shard_queues_[shard], k.get(), static_cast<cl_uint>(global.size()),
                               nullptr, global.data(), local.empty() ? nullptr : local.data(),
                               first ? 1 : 0, first ? &fork_event_ : nullptr, &done),
        "clEnqueueNDRangeKernel(shard)");
  forked_[shard] = 1;
  shard_events_[shard].push_back(done);
}

void context::join() {
  std::vector<cl_event> ends;
  for (int s = 0; s < shards(); ++s) {
    if (!forked_[s]) continue;
    cl_event e = nullptr;
    check(clEnqueueMarkerWithWaitList(shard_queues_[s], 0, nullptr, &e), "clEnqueueMarker(join)");
    ends.push_back(e);
  }
  if (!ends.empty())
    check(clEnqueueBarrierWithWaitList(queue_, static_cast<cl_uint>(ends.size()), ends.data(),
                                       nullptr),
          "clEnqueueBarrierWithWaitList(join)");
  for (cl_event e : ends) clReleaseEvent(e);
  std::fill(forked_.begin(), forked_.end(), 0);
}

const std::vector<double>& context::shard_busy_seconds() {
  for (int s = 0; s < shards(); ++s) {
    auto& evs = shard_events_[s];
    if (!evs.empty())
      check(clWaitForEvents(static_cast<cl_uint>(evs.size()), evs.data()), "clWaitForEvents");
    for (cl_event e : evs) {
      cl_ulong t0 = 0, t1 = 0;
      clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof(t0), &t0, nullptr);
      clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof(t1), &t1, nullptr);
      if (t1 > t0) shard_busy_[s] += static_cast<double>(t1 - t0) * 1e-9;
      clReleaseEvent(e);
    }
    evs.clear();
  }
  return shard_busy_;
}

}  // namespace troupe::cl
