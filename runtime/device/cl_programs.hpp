#pragma once
// The OpenCL programs a context builds from the embedded kernels/*.cl, and
// which of them defines a kernel.
//
// Two ways to build.  Whole: every file in one program, built at the first
// kernel asked for; a CPU device (PoCL) does this, since its fused layers
// (layer.cl) run every other file's bodies and PoCL builds the lot in
// seconds.  Per file: a program of common.cl, what the file needs and the
// file, built the first time one of its kernels is asked for, so a device
// builds only the files its model uses (of matmul.cl, only the weight
// types' families it uses).  NVIDIA's compiler did not finish
// the whole 180 KB program in five minutes (docs/bench_engine.md, GPU),
// and a built program is kept on disk by its binary (CL_PROGRAM_BINARIES),
// so each driver pays for a file once.
#include <CL/cl.h>

#include <map>
#include <string>
#include <vector>

namespace troupe::cl {

// The kernel file (kernels/NAME.cl, NAME here) that defines `kernel`, by
// its name's prefix; empty where no rule names it.  A test holds every
// file's kernels to this.
std::string kernel_file_for(const std::string& kernel);

// The program that defines `kernel` off the CPU: its file, or for
// matmul.cl's families "matmul:VARIANT" (q4_1, xq_q4_1, ...), a program of
// that family alone; empty where no rule names it.
std::string program_key_for(const std::string& kernel);

// The embedded files a file's own program is built from, in embedded
// order: common, the files whose macros or bodies it uses, the file.
std::vector<std::string> program_files(const std::string& file);

class program_set {
 public:
  // devices: the context's (its sub-devices too); each program is built for all.
  program_set(cl_context ctx, std::vector<cl_device_id> devices, bool whole);
  ~program_set();
  program_set(const program_set&) = delete;
  program_set& operator=(const program_set&) = delete;

  // The options every program is built with; the first call's stand.
  void set_options(const std::string& options);
  bool has_options() const { return options_set_; }
  // A new kernel; builds the program that defines it first where needed.
  // Throws cl_error naming the kernel where no file defines it.  Not
  // thread-safe: one owner (the context's) at a time.
  cl_kernel create(const std::string& name);
  // Builds one program (a file's, or a key of program_key_for; the whole
  // one for "" or in whole mode) and returns it; the set keeps it.
  cl_program program(const std::string& key);
  // How many of the programs built came from binaries on disk.
  int from_disk() const { return from_disk_; }

 private:
  cl_program build(const std::string& key);

  cl_context ctx_;
  std::vector<cl_device_id> devices_;
  bool whole_;
  bool options_set_ = false;
  std::string options_;
  std::map<std::string, cl_program> built_;
  int from_disk_ = 0;
};

}  // namespace troupe::cl
