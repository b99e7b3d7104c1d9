#include "runtime/model/model_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/common/user_text.hpp"
#include "runtime/model/gguf_reader.hpp"
#include "runtime/model/llama2c_reader.hpp"

namespace troupe {

namespace {

// The first bytes of a file, for error messages: printable text or hex.
std::string describe_magic(const uint8_t* p, size_t n) {
  bool printable = n > 0;
  for (size_t i = 0; i < n; ++i) printable = printable && p[i] >= 0x20 && p[i] < 0x7F;
  if (printable) {
    std::string quoted(1, '\'');
    quoted.append(reinterpret_cast<const char*>(p), n);
    return quoted += '\'';
  }
  std::string hex = "0x";
  for (size_t i = 0; i < n; ++i) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02X", p[i]);
    hex += buf;
  }
  return n ? hex : "(empty)";
}

}  // namespace

void throw_model_error(const std::string& path, const std::string& problem) {
  // A name no file system takes (over PATH_MAX) is shown clipped: a 50 MB
  // model name in a config file was echoed whole into the error.
  std::string line = (path.size() > 4096 ? quoted_value(path, 200) : path) + ": " + problem;
  for (char& ch : line)
    if (ch == '\n' || ch == '\r') ch = ' ';
  throw model_error(line);
}

mapped_file::mapped_file(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_model_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_model_error(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_model_error(path, "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw_model_error(path, std::string("cannot mmap: ") + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

mapped_file::~mapped_file() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

std::string sample_fingerprint(const uint8_t* data, size_t size, size_t header_bytes) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  auto mix = [&h](const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  };
  header_bytes = std::min(header_bytes, size);
  mix(data, header_bytes);
  const size_t rest = size - header_bytes;
  constexpr size_t k_samples = 64, k_sample_bytes = 256;
  for (size_t s = 0; s < k_samples && rest > 0; ++s) {
    const size_t off = header_bytes + rest / k_samples * s;
    mix(data + off, std::min(k_sample_bytes, size - off));
  }
  const uint64_t size64 = size;
  mix(reinterpret_cast<const uint8_t*>(&size64), sizeof size64);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

int64_t tensor_view::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < shape.size(); ++i) r *= shape[i];
  return r;
}

const tensor_view* model_file::find_tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const tensor_view& model_file::tensor(const std::string& name) const {
  const auto* t = find_tensor(name);
  if (!t) throw_model_error(path_, "missing tensor '" + name + "'");
  return *t;
}

std::shared_ptr<model_file> model_file::open(const std::string& path,
                                             const std::string& tokenizer_path) {
  uint8_t head[llama2c_header::bytes] = {};
  size_t size = 0;
  {
    const mapped_file probe(path);
    size = probe.size();
    // An empty file maps to nullptr, which memcpy must not get even for 0 bytes.
    if (size > 0) std::memcpy(head, probe.data(), std::min(size, sizeof head));
  }
  if (size >= 4 && std::memcmp(head, "GGUF", 4) == 0) return gguf_file::open(path);

  const std::string not_gguf =
      "not a GGUF file (magic " + describe_magic(head, std::min<size_t>(size, 4)) + ")";
  if (size < llama2c_header::bytes)
    throw_model_error(path, not_gguf + " and too short (" + std::to_string(size) +
                                " bytes) for a llama2.c checkpoint");
  const auto header = llama2c_header::from_bytes(head);
  const auto expected = header.expected_file_size();
  if (!expected)
    throw_model_error(path, not_gguf + " and not a llama2.c checkpoint (implausible header: " +
                                header.describe() + ")");
  if (*expected != size)
    throw_model_error(path, not_gguf + " and not a llama2.c checkpoint: its header (" +
                                header.describe() + ") implies " + std::to_string(*expected) +
                                " bytes but the file has " + std::to_string(size));
  return llama2c_file::open(path, tokenizer_path);
}

}  // namespace troupe
