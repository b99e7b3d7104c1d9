#pragma once
// Plain sockets for the integration tests: a TCP connection to loopback,
// raw bytes, an HTTP GET, and one sample of a Prometheus text page.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace troupe::testing {

// 127.0.0.1:port (0: any port) as a socket address.
inline sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// A socket listening on 127.0.0.1 on a port the OS picks, for tests that
// need a port somebody holds; {-1, 0} when that fails.
struct held_port {
  int fd = -1;
  int port = 0;
};
inline held_port listen_local() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd, 1) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return {};
  }
  return {fd, ntohs(a.sin_port)};
}

// A TCP connection to 127.0.0.1:port, or -1.
inline int connect_local(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline void send_all(int fd, const std::string& bytes) {
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// A recv() on `fd` gives up after `timeout`.
inline void set_receive_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// Sends `request` to 127.0.0.1:port: the whole response, or what came of
// it within `timeout`.  Throws when nothing listens on the port.
inline std::string http_exchange(int port, const std::string& request,
                                 std::chrono::milliseconds timeout) {
  const int fd = connect_local(port);
  if (fd < 0) throw std::runtime_error("cannot connect to port " + std::to_string(port));
  set_receive_timeout(fd, timeout);
  send_all(fd, request);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// GET path on 127.0.0.1:port.
inline std::string http_get(int port, const std::string& path,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return http_exchange(
      port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout);
}

// POST `body` (JSON) to path on 127.0.0.1:port.
inline std::string http_post(int port, const std::string& path, const std::string& body,
                             std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return http_exchange(port,
                       "POST " + path +
                           " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                           "Content-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body,
                       timeout);
}

// The status code of an HTTP response ("HTTP/1.1 413 ..."), or 0.
inline int http_status(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::atoi(response.c_str() + 9);
}

// The body of an HTTP response (after the blank line).
inline std::string http_body(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The value of one sample line "name{labels} value" (labels as written), or -1.
inline double sample(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

}  // namespace troupe::testing
