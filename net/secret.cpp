#include "net/secret.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace troupe {

std::string make_secret() {
  std::random_device rd;  // /dev/urandom on Linux
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i) {
    const unsigned b = rd() & 0xffu;
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

std::string read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("secret file " + path + ": cannot be read (does it exist?)");
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    throw std::runtime_error("secret file " + path +
                             ": group or others may read it; chmod 600 it first");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("secret file " + path + ": cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  const auto first = s.find_first_not_of(" \t\r\n");
  const auto last = s.find_last_not_of(" \t\r\n");
  if (first == std::string::npos) throw std::runtime_error("secret file " + path + ": empty");
  s = s.substr(first, last - first + 1);
  if (s.size() > 4096) throw std::runtime_error("secret file " + path + ": over 4096 bytes");
  return s;
}

void write_secret_file(const std::string& path, const std::string& secret) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path() && !fs::exists(p.parent_path())) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw std::runtime_error("secret file " + path + ": cannot make its folder");
    fs::permissions(p.parent_path(), fs::perms::owner_all, ec);
  }
  const mode_t old = ::umask(077);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << secret << "\n";
    if (!out) {
      ::umask(old);
      throw std::runtime_error("secret file " + path + ": cannot be written");
    }
  }
  ::umask(old);
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write, ec);
}

std::string run_dir() {
  if (const char* d = std::getenv("TROUPE_RUN_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/troupe";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/troupe/run";
  return "/tmp/troupe-run-" + std::to_string(::getuid());
}

std::string run_secret_path(const std::string& kind, int port) {
  return run_dir() + "/" + kind + "-" + std::to_string(port) + ".secret";
}

namespace {

// The TCP ports some socket of this machine's network namespace listens
// on, from /proc/net/tcp{,6} (state 0A is LISTEN).
std::vector<int> listening_ports() {
  std::vector<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string slot, local, remote, state;
      if (!(row >> slot >> local >> remote >> state) || state != "0A") continue;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      ports.push_back(static_cast<int>(std::strtol(local.c_str() + colon + 1, nullptr, 16)));
    }
  }
  return ports;
}

}  // namespace

int remove_stale_run_secrets() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(run_dir(), ec);
  if (ec) return 0;
  const auto live = listening_ports();
  int removed = 0;
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    // admin-PORT.secret and admin-read-PORT.secret, as run_secret_path names them.
    for (const std::string kind : {"admin-read-", "admin-"}) {
      if (name.rfind(kind, 0) != 0 || name.size() <= kind.size() + 7 ||
          name.compare(name.size() - 7, 7, ".secret") != 0)
        continue;
      const std::string digits = name.substr(kind.size(), name.size() - kind.size() - 7);
      if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 5) break;
      const int port = std::atoi(digits.c_str());
      if (std::find(live.begin(), live.end(), port) == live.end() && fs::remove(entry.path(), ec))
        ++removed;
      break;
    }
  }
  return removed;
}

std::string read_or_make_secret_file(const std::string& path) {
  if (::access(path.c_str(), F_OK) == 0) return read_secret_file(path);
  // Written aside, then linked into place: link() fails when the file
  // appeared meanwhile, so processes starting together agree on one secret.
  const std::string tmp = path + ".new-" + std::to_string(::getpid());
  write_secret_file(tmp, make_secret());
  const int rc = ::link(tmp.c_str(), path.c_str());
  ::unlink(tmp.c_str());
  if (rc != 0 && errno != EEXIST)
    throw std::runtime_error("secret file " + path + ": cannot be made");
  return read_secret_file(path);
}

bool secrets_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace troupe
