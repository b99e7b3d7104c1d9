#include "net/http_get_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <thread>
#include <vector>

namespace troupe {

namespace {

using clock_type = std::chrono::steady_clock;

struct connection {
  int fd = -1;
  clock_type::time_point deadline;
  std::string in;   // the request so far
  std::string out;  // the response still to write
  size_t sent = 0;
};

const char* reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Error";
  }
}

std::string render(const http_response& r) {
  return "HTTP/1.1 " + std::to_string(r.status) + " " + reason(r.status) +
         "\r\nContent-Type: " + r.content_type +
         "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" +
         r.body;
}

}  // namespace

struct http_get_server::impl {
  http_get_options opts;
  std::function<http_response(const std::string&)> handler;
  int listen_fd = -1;
  int spare_fd = -1;  // given up to accept-and-close when the fd table is full
  int wake[2] = {-1, -1};
  int port = 0;
  std::atomic<bool> stop{false};
  std::deque<connection> conns;  // oldest first
  std::thread thread;

  void close_conn(size_t i) {
    ::close(conns[i].fd);
    conns.erase(conns.begin() + static_cast<long>(i));
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          // Out of fds: free the spare to take the peer off the backlog and
          // hang up on it, so it does not spin the poll loop.
          if (spare_fd >= 0) {
            ::close(spare_fd);
            const int shed = ::accept(listen_fd, nullptr, nullptr);
            if (shed >= 0) ::close(shed);
            spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          }
        }
        return;
      }
      if (static_cast<int>(conns.size()) >= opts.max_connections) close_conn(0);
      conns.push_back({fd, clock_type::now() + opts.idle_timeout, {}, {}, 0});
    }
  }

  // The head ends at an empty line; a bare LF ends a line as CRLF does
  // (RFC 9112 2.2 lets a server accept it, and printf-made requests use it).
  static bool head_complete(const std::string& in) {
    return in.find("\r\n\r\n") != std::string::npos || in.find("\n\n") != std::string::npos ||
           in.find("\n\r\n") != std::string::npos;
  }

  // Reads what has come; answers once the request head is complete.
  bool on_readable(connection& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.size() > 8192) {
        c.out = render({431, "text/plain; charset=utf-8", "request too large\n"});
        return true;
      }
      if (head_complete(c.in)) break;
    }
    std::string line = c.in.substr(0, c.in.find('\n'));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 == std::string::npos || sp2 == sp1)
      c.out = render({400, "text/plain; charset=utf-8", "bad request line\n"});
    else if (line.compare(0, sp1, "GET") != 0 && line.compare(0, sp1, "HEAD") != 0)
      c.out = render({405, "text/plain; charset=utf-8", "only GET and HEAD\n"});
    else {
      try {
        c.out = render(handler(line.substr(sp1 + 1, sp2 - sp1 - 1)));
      } catch (const std::exception& e) {
        c.out = render({500, "text/plain; charset=utf-8", std::string(e.what()) + "\n"});
      }
      // HEAD: the same head (Content-Length included), no body.
      if (line.compare(0, sp1, "HEAD") == 0) c.out.resize(c.out.find("\r\n\r\n") + 4);
    }
    c.in.clear();
    return true;
  }

  bool on_writable(connection& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
      c.sent += static_cast<size_t>(n);
    }
    return false;  // all sent: close
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stop) {
      fds.clear();
      fds.push_back({listen_fd, POLLIN, 0});
      fds.push_back({wake[0], POLLIN, 0});
      for (const auto& c : conns)
        fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      ::poll(fds.data(), fds.size(), 200);
      if (stop) break;
      const auto now = clock_type::now();
      // Connections first (indices match fds[2..]), newest to oldest so
      // erasing keeps the earlier indices valid.
      for (size_t i = conns.size(); i-- > 0;) {
        auto& c = conns[i];
        const short ev = fds[i + 2].revents;
        bool keep = true;
        if (ev & (POLLERR | POLLHUP | POLLNVAL))
          keep = c.out.empty() ? (ev & POLLIN) && on_readable(c) : on_writable(c);
        else if (ev & POLLIN)
          keep = on_readable(c);
        else if (ev & POLLOUT)
          keep = on_writable(c);
        if (keep && !c.out.empty() && c.sent == 0) keep = on_writable(c);
        if (keep && now > c.deadline) keep = false;
        if (!keep) close_conn(i);
      }
      if (fds[0].revents & POLLIN) accept_all();
      if (fds[1].revents & POLLIN) {
        char b[64];
        (void)!::read(wake[0], b, sizeof b);
      }
    }
  }
};

http_get_server::http_get_server(http_get_options opts,
                                 std::function<http_response(const std::string&)> handler)
    : impl_(std::make_unique<impl>()) {
  auto& p = *impl_;
  p.opts = std::move(opts);
  p.handler = std::move(handler);
  const std::string where = p.opts.host + ":" + std::to_string(p.opts.port);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(p.opts.port));
  if (::inet_pton(AF_INET, p.opts.host.c_str(), &a.sin_addr) != 1)
    throw std::runtime_error("cannot listen on " + where + ": not an IPv4 address");
  p.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int yes = 1;
  // SO_REUSEADDR only (restarts while old connections linger); never
  // SO_REUSEPORT, which would let two servers share the port.
  ::setsockopt(p.listen_fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (::bind(p.listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(p.listen_fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(p.listen_fd);
    throw std::runtime_error("cannot listen on " + where + ": " + why);
  }
  socklen_t len = sizeof a;
  ::getsockname(p.listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  p.port = ntohs(a.sin_port);
  p.spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (::pipe2(p.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(p.listen_fd);
    throw std::runtime_error("cannot listen on " + where + ": no pipe");
  }
  p.thread = std::thread([&p] { p.run(); });
}

http_get_server::~http_get_server() {
  auto& p = *impl_;
  p.stop = true;
  (void)!::write(p.wake[1], "x", 1);
  if (p.thread.joinable()) p.thread.join();
  for (auto& c : p.conns) ::close(c.fd);
  for (int fd : {p.listen_fd, p.spare_fd, p.wake[0], p.wake[1]})
    if (fd >= 0) ::close(fd);
}

int http_get_server::port() const {
  return impl_->port;
}

}  // namespace troupe
