#pragma once
// A small HTTP/1.1 server for GET endpoints (Prometheus /metrics) whose
// cost to the process is bounded whatever its peers do: one thread, at most
// `max_connections` sockets (a new connection past that closes the oldest),
// an idle deadline per connection, requests of at most 8 KiB, and an fd
// shortage (EMFILE) sheds the waiting connection instead of failing the
// process.  Every response closes its connection.  It binds without
// SO_REUSEPORT, so a port already in use is refused at start.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace troupe {

struct http_response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct http_get_options {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: one the OS picks
  int max_connections = 32;
  std::chrono::milliseconds idle_timeout{2000};  // to send a whole request
};

class http_get_server {
 public:
  // handler(path) answers GET path (query string included); it runs on the
  // server's thread.  Throws std::runtime_error naming host:port when the
  // port cannot be bound.
  http_get_server(http_get_options opts, std::function<http_response(const std::string&)> handler);
  ~http_get_server();  // stops the thread, closes every socket
  http_get_server(const http_get_server&) = delete;
  http_get_server& operator=(const http_get_server&) = delete;

  int port() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
