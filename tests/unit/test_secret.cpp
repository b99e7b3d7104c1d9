// The endpoint secrets a server leaves in its run folder: a server killed
// -9 (or crashed) cannot remove its own, so the next `troupe serve` sweeps
// those whose port nothing listens on (issue 31) and keeps live ones.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "net/secret.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// A loopback socket: listening (its port is live) or only bound (its port
// is taken, but nothing listens: a dead server's).
struct loopback_socket {
  int fd = -1;
  int port = 0;
  explicit loopback_socket(bool listen) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        (listen && ::listen(fd, 1) != 0) ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "no loopback socket";
    port = ntohs(a.sin_port);
  }
  ~loopback_socket() { ::close(fd); }
};

TEST(RunSecrets, StaleEndpointSecretsAreSweptAndLiveOnesKept) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_secrets_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ::setenv("TROUPE_RUN_DIR", dir.c_str(), 1);
  loopback_socket live(true), dead(false);
  const std::string live_control = run_secret_path("admin", live.port);
  const std::string live_read = run_secret_path("admin-read", live.port);
  const std::string dead_control = run_secret_path("admin", dead.port);
  const std::string dead_read = run_secret_path("admin-read", dead.port);
  for (const auto& p : {live_control, live_read, dead_control, dead_read})
    write_secret_file(p, make_secret());
  // Files that are not endpoint secrets stay whatever their names hold.
  const fs::path cluster = dir / "cluster.secret", odd = dir / "admin-12x.secret";
  write_secret_file(cluster.string(), make_secret());
  write_secret_file(odd.string(), make_secret());

  EXPECT_EQ(remove_stale_run_secrets(), 2);
  EXPECT_FALSE(fs::exists(dead_control));
  EXPECT_FALSE(fs::exists(dead_read));
  EXPECT_TRUE(fs::exists(live_control));
  EXPECT_TRUE(fs::exists(live_read));
  EXPECT_TRUE(fs::exists(cluster));
  EXPECT_TRUE(fs::exists(odd));
  EXPECT_EQ(remove_stale_run_secrets(), 0);
  ::unsetenv("TROUPE_RUN_DIR");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe
