// The cluster's TLS identity folders: written private, removed at exit, and
// a killed process's folder swept by the next process that writes one.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "net/cluster_tls.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// TMPDIR pointed at a fresh folder for the test's life.
class ScopedTmpdir {
 public:
  ScopedTmpdir() {
    std::string templ = (fs::temp_directory_path() / "troupe-tls-test-XXXXXX").string();
    dir_ = ::mkdtemp(templ.data());
    const char* old = std::getenv("TMPDIR");
    had_old_ = old != nullptr;
    if (old) old_ = old;
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (had_old_)
      ::setenv("TMPDIR", old_.c_str(), 1);
    else
      ::unsetenv("TMPDIR");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  std::string old_;
  bool had_old_ = false;
};

// The pid of a child that has exited and been reaped: no process has it
// (until the kernel reuses it, which takes a full turn of the pid space).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(ClusterTls, IdentityIsPrivateAndNamedAfterThePid) {
  ScopedTmpdir tmp;
  const auto id = write_cluster_identity("s3cret");
  const std::string name = fs::path(id.dir).filename().string();
  EXPECT_EQ(name.rfind("troupe-cluster-" + std::to_string(::getpid()) + "-", 0), 0u) << name;
  struct stat st {};
  ASSERT_EQ(::stat(id.key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "the key is readable by others";
  remove_cluster_identity(id);
  EXPECT_FALSE(fs::exists(id.dir));
}

TEST(ClusterTls, AKilledProcesssFolderIsSweptAndLiveOnesAreKept) {
  ScopedTmpdir tmp;
  const fs::path stale = tmp.dir() / ("troupe-cluster-" + std::to_string(dead_pid()) + "-abcdef");
  const fs::path live = tmp.dir() / ("troupe-cluster-" + std::to_string(::getppid()) + "-ghijkl");
  const fs::path old_style = tmp.dir() / "troupe-cluster-Ab12Cd";
  const fs::path other = tmp.dir() / "somebody-else-123-x";
  for (const auto& d : {stale, live, old_style, other}) {
    fs::create_directory(d);
    std::FILE* f = std::fopen((d / "cert.pem").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  const auto id = write_cluster_identity("s3cret");
  EXPECT_FALSE(fs::exists(stale)) << "a dead process's folder stayed";
  EXPECT_TRUE(fs::exists(live)) << "a running process's folder was removed";
  EXPECT_TRUE(fs::exists(old_style)) << "a folder without a pid was removed";
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(id.cert));
  remove_cluster_identity(id);
}

}  // namespace
}  // namespace troupe
