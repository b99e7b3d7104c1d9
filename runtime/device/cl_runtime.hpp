#pragma once
// Thin RAII over the OpenCL C API: one context + in-order queue on a chosen
// device, program builds with readable errors, and owned buffers.  The device
// actor owns one of these; nothing here knows about models.
#include <CL/cl.h>
#include <CL/cl_ext.h>  // CL_PLATFORM_NOT_FOUND_KHR (ICD loader, no platform)

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::cl {

// Any OpenCL failure: what() names the call and the error code.
struct cl_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* error_name(cl_int code);
class program_set;
void check(cl_int code, const char* what);

struct device_choice {
  int platform = 0;  // index into clGetPlatformIDs
  int device = 0;    // index into the platform's devices
  // cores > 0: run on a sub-device of this many compute units, the
  // slice-th of the device split equally (several engines in one process,
  // each on its own cores, as if on devices of their own).
  int cores = 0;
  int slice = 0;
};

// The compute units a device (its slice where choice.cores > 0: that many)
// offers to split equally into sub-devices, without building a context; 0
// where it cannot be split so (most GPU drivers).  Throws cl_error where it
// does not exist.
int partition_units(const device_choice& choice);

class buffer {
 public:
  buffer() = default;
  buffer(cl_mem mem, size_t bytes) : mem_(mem), bytes_(bytes) {}
  buffer(buffer&& o) noexcept : mem_(o.mem_), bytes_(o.bytes_) { o.mem_ = nullptr; }
  buffer& operator=(buffer&& o) noexcept;
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer();

  cl_mem get() const { return mem_; }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return mem_ != nullptr; }

 private:
  cl_mem mem_ = nullptr;
  size_t bytes_ = 0;
};

class kernel {
 public:
  kernel() = default;
  explicit kernel(cl_kernel k) : k_(k) {}
  kernel(kernel&& o) noexcept : k_(o.k_) { o.k_ = nullptr; }
  kernel& operator=(kernel&& o) noexcept;
  kernel(const kernel&) = delete;
  kernel& operator=(const kernel&) = delete;
  ~kernel();

  cl_kernel get() const { return k_; }

  // Sets arguments in order: buffers, scalars (int, float, ...).
  template <class... Ts>
  void args(const Ts&... xs) {
    args_from(0, xs...);
  }
  // The same from argument `first` on; returns the index after the last.
  template <class... Ts>
  cl_uint args_from(cl_uint first, const Ts&... xs) {
    cl_uint i = first;
    (set(i++, xs), ...);
    return i;
  }

 private:
  void set(cl_uint i, const buffer& b) {
    cl_mem m = b.get();
    check(clSetKernelArg(k_, i, sizeof(cl_mem), &m), "clSetKernelArg(buffer)");
  }
  template <class T>
  void set(cl_uint i, const T& v) {
    check(clSetKernelArg(k_, i, sizeof(T), &v), "clSetKernelArg");
  }
  cl_kernel k_ = nullptr;
};

// An enqueued command's completion (an owned reference to its cl_event).
class event {
 public:
  event() = default;
  explicit event(cl_event e) : e_(e) {}
  event(event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  event& operator=(event&& o) noexcept;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event();

  // Waits for the command; throws cl_error where it (or one it waited
  // for) failed.
  void wait() const;
  // Calls fn(ok) once the command has ended, on a thread of the driver's:
  // fn must be quick and must not throw.
  void on_complete(std::function<void(bool ok)> fn) const;

 private:
  cl_event e_ = nullptr;
};

// A recorded sequence of kernel launches (cl_khr_command_buffer), replayed
// with one enqueue: graph mode.  Kernel arguments are captured when
// recorded, so a replay reads whatever the same buffers hold by then.  Each
// recorded launch holds its own clone of the kernel: PoCL 3.1 reads a
// recorded kernel's arguments when it runs, not when it was recorded (as
// the extension says), so one kernel object launched with different
// arguments would replay them all with the last ones.
class command_buffer {
 public:
  command_buffer() = default;
  command_buffer(cl_command_buffer_khr cb, clReleaseCommandBufferKHR_fn release)
      : cb_(cb), release_(release) {}
  command_buffer(command_buffer&& o) noexcept
      : cb_(o.cb_), release_(o.release_), kernels_(std::move(o.kernels_)) {
    o.cb_ = nullptr;
    o.kernels_.clear();
  }
  command_buffer& operator=(command_buffer&& o) noexcept;
  command_buffer(const command_buffer&) = delete;
  command_buffer& operator=(const command_buffer&) = delete;
  ~command_buffer();

  cl_command_buffer_khr get() const { return cb_; }
  // Takes ownership of a kernel the recording launches.
  void keep(cl_kernel k) { kernels_.push_back(k); }

 private:
  cl_command_buffer_khr cb_ = nullptr;
  clReleaseCommandBufferKHR_fn release_ = nullptr;
  std::vector<cl_kernel> kernels_;
};

class context {
 public:
  // Throws cl_error; with no OpenCL platform the message says how to install one.
  // With shards >= 2 the device is also partitioned into sub-devices of one
  // compute unit each (clCreateSubDevices), the first `shards` of them in
  // the same context with a queue each: expert parallelism over the
  // sub-devices, with buffers shared.  Throws where it cannot partition.
  explicit context(device_choice choice = {}, int shards = 0);
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  const std::string& device_name() const { return device_name_; }
  size_t global_mem_bytes() const { return global_mem_; }
  // The largest single buffer, and the alignment a sub-buffer's offset
  // needs (CL_DEVICE_MEM_BASE_ADDR_ALIGN, in bytes).
  size_t max_alloc_bytes() const { return max_alloc_; }
  size_t base_align_bytes() const { return base_align_; }
  int compute_units() const { return compute_units_; }
  bool cpu() const { return cpu_; }
  // A PoCL CPU device on an x86 host with AVX-512 VNNI: its kernel compiler
  // is clang for this very CPU, so kernels may use x86 builtins under a
  // target attribute (the integer matmuls' vpdpbusd).
  bool x86_vnni() const { return x86_vnni_; }
  // The same kind of device on an AVX-512 host (vcvtph2ps for halves).
  bool x86_avx512() const { return x86_avx512_; }
  // A PoCL CPU device on an AVX2 host (with FMA and F16C) without AVX-512.
  bool x86_avx2() const { return x86_avx2_; }

  buffer alloc(size_t bytes, const void* init = nullptr);
  // A region of `parent` (offset aligned to base_align_bytes()) as a
  // buffer of its own; it shares the parent's memory.
  buffer sub_buffer(const buffer& parent, size_t offset, size_t bytes);
  // Enqueues a copy of src's first `bytes` into dst at dst_offset.
  void copy(const buffer& src, const buffer& dst, size_t bytes, size_t dst_offset);
  void write(const buffer& b, const void* src, size_t bytes, size_t offset = 0,
             bool blocking = false);
  void read(const buffer& b, void* dst, size_t bytes, size_t offset = 0);
  // Strided transfers without waiting (finish() waits): `rows` blocks of
  // `block` bytes, contiguous in the buffer from `offset`, each
  // `host_pitch` bytes apart in host memory.  One command instead of one
  // per block (KV pages: a layer's run of pages, interleaved per page on
  // the host).  buffer_pitch: the blocks' distance in the buffer where it
  // is not `block` (columns of a row-major matrix).
  void read_rows(const buffer& b, void* dst, size_t block, size_t rows, size_t offset,
                 size_t host_pitch, size_t buffer_pitch = 0);
  void write_rows(const buffer& b, const void* src, size_t block, size_t rows, size_t offset,
                  size_t host_pitch, size_t buffer_pitch = 0);
  // The same without waiting: dst must stay valid until the returned event
  // has ended.  Flushes the queue, so the device starts on what it holds.
  event read_async(const buffer& b, void* dst, size_t bytes, size_t offset = 0);
  // An event that ends when every command enqueued so far has.
  event marker();

  // Sets the options the kernels are built with (the first call's stand);
  // make_kernel then builds, the first time one of its kernels is asked
  // for, the program that defines a kernel (cl_programs.hpp: one program
  // on a CPU device, one per kernel file elsewhere).
  void build(const std::string& options);
  kernel make_kernel(const std::string& name);

  // Enqueues a 1-, 2- or 3-D range; local may be empty (driver's choice).
  // A launch whose global size changes from step to step should name a
  // local size that does not: PoCL compiles a kernel once per work-group
  // size, and its own choice follows the global size, so each new size
  // compiled a new variant (seconds for attention) in the middle of serving.
  void launch(const kernel& k, std::vector<size_t> global, std::vector<size_t> local = {});
  void finish();

  // Graph mode: whether the device records command buffers; between
  // begin_recording() and end_recording(), launch() records (in order)
  // instead of enqueuing; replay() enqueues a recording.
  bool command_buffers() const { return cb_.create != nullptr; }
  void begin_recording();
  command_buffer end_recording();
  void replay(const command_buffer& cb);

  // Sub-device queues (shards): fork() marks the point of the main queue
  // after which launch_on(shard, ...) commands may run (each shard's first
  // command waits for it); join() makes the main queue wait for every
  // shard's commands since.  Each shard's kernel time (event profiling)
  // adds up in shard_busy_seconds() once its commands are done.
  int shards() const { return static_cast<int>(shard_queues_.size()); }
  void fork();
  void launch_on(int shard, const kernel& k, std::vector<size_t> global,
                 std::vector<size_t> local = {});
  void join();
  const std::vector<double>& shard_busy_seconds();

  // With TROUPE_PROFILE set, launch() waits for each kernel and adds its
  // wall time here, by kernel name: a crude per-kernel profile.
  std::map<std::string, std::pair<double, long>>& profile() { return profile_; }
  bool profiling() const { return profiling_; }

 private:
  bool profiling_ = false;
  std::map<std::string, std::pair<double, long>> profile_;
  cl_platform_id platform_ = nullptr;
  cl_device_id device_ = nullptr;
  cl_context ctx_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::unique_ptr<program_set> programs_;
  std::string device_name_;
  size_t global_mem_ = 0;
  size_t max_alloc_ = 0;
  size_t base_align_ = 128;
  int compute_units_ = 1;
  bool cpu_ = false;
  bool x86_vnni_ = false;
  bool x86_avx512_ = false;
  bool x86_avx2_ = false;
  struct command_buffer_api {
    clCreateCommandBufferKHR_fn create = nullptr;
    clCommandNDRangeKernelKHR_fn ndrange = nullptr;
    clFinalizeCommandBufferKHR_fn finalize = nullptr;
    clEnqueueCommandBufferKHR_fn enqueue = nullptr;
    clReleaseCommandBufferKHR_fn release = nullptr;
  } cb_;
  command_buffer recording_;
  std::vector<cl_device_id> sub_devices_;
  cl_device_id slice_device_ = nullptr;  // device_ when it is a slice (device_choice::cores)
  std::vector<cl_command_queue> shard_queues_;
  cl_event fork_event_ = nullptr;
  std::vector<char> forked_;                         // per shard: waited for fork_event_
  std::vector<std::vector<cl_event>> shard_events_;  // launches not yet timed
  std::vector<double> shard_busy_;
  bool has_sync_ = false;
  cl_sync_point_khr last_sync_ = 0;
};

}  // namespace troupe::cl
