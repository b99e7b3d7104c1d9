#pragma once
// What the HTTP front's connections may hold, bounded (issue 36's hostile
// probe: 700 connections each sending 7.9 MB of a body and then stalling
// held 6 GB, as the body limit holds per connection only).
//
// libevent 2.1 has no connection limit and no view of requests still being
// read, so the guard makes each connection's buffer itself (evhttp's
// bufferevent callback) and watches it:
//  - connections: at max_connections, the connection idle longest (for a
//    second or more) is closed to make room, else accepting pauses (new
//    ones wait in the kernel's backlog) until one ends;
//  - unfinished requests: the bytes read on each connection since its last
//    whole request are summed; past max_unfinished_bytes, the connections
//    holding the most are ended with a 503 (stalled bodies go before a
//    small request), so the front's memory for requests being read stays
//    near the budget whatever the clients do;
//  - slow requests: one that has not arrived whole within read_deadline
//    of its first byte ends its connection with a 408.
// A connection ended with a 503 or 408 closes lingering: its sending side
// is shut after the answer, and what the client still sends is read and
// dropped for up to 2 s (64 MiB, 256 such sockets at most), so the client
// reads the status instead of a reset.
// Everything runs on the front's event loop thread.
#include <chrono>
#include <cstddef>
#include <memory>

struct bufferevent;
struct event_base;
struct evconnlistener;
struct evhttp;
struct evhttp_request;

namespace troupe::cli {

struct http_connection_limits {
  size_t max_connections = 1024;
  size_t max_unfinished_bytes = 512u << 20;
  // A request (headers and body) must arrive whole within this from its
  // first byte, or the connection is ended with a 408 (slow clients that
  // send a byte now and then would otherwise hold a connection for ever).
  std::chrono::seconds read_deadline{60};
};

class http_connection_guard {
 public:
  // Installs itself as http's bufferevent maker; call before the front
  // binds, then watch() with the listener it bound.
  http_connection_guard(event_base* base, evhttp* http, http_connection_limits limits);
  ~http_connection_guard();
  http_connection_guard(const http_connection_guard&) = delete;
  http_connection_guard& operator=(const http_connection_guard&) = delete;

  void watch(evconnlistener* listener);
  // A whole request was read on req's connection (the front's handler
  // runs): what that connection read so far is no longer unfinished.
  void request_read(evhttp_request* req);

  size_t connections() const;
  size_t unfinished_bytes() const;
  size_t refused() const;      // connections ended with a 503 (budget) or 408 (too slow)
  size_t idle_closed() const;  // idle connections closed to make room at the cap

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::cli
