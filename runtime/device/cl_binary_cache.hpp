#pragma once
// Built OpenCL programs kept on disk by their binaries, so that a driver
// whose compiler is slow (NVIDIA's took minutes over troupe's kernels)
// builds each program once.  The key covers everything a binary depends
// on: the device, its driver, the build options and the source text.
#include <CL/cl.h>

#include <string>
#include <vector>

namespace troupe::cl {

// The folder: $TROUPE_KERNEL_CACHE, else $XDG_CACHE_HOME/troupe/kernels,
// else ~/.cache/troupe/kernels; empty (no cache) where none can be named
// or TROUPE_KERNEL_CACHE is "off".
std::string kernel_cache_dir();

// A hex digest of the device's name, vendor and driver version, the
// options and the sources.
std::string program_cache_key(cl_device_id device, const std::string& options,
                              const std::vector<std::string>& sources);

// The binary stored under key, or empty.
std::vector<unsigned char> load_program_binary(const std::string& dir, const std::string& key);
// Stores a built program's binary (one device) under key; a failure to
// write is ignored (the cache is an optimisation).
void store_program_binary(const std::string& dir, const std::string& key, cl_program program);

}  // namespace troupe::cl
