#include "tools/troupe/http_connection_guard.hpp"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <unordered_map>

namespace troupe::cli {

namespace {

// How often connections evhttp has ended are let go (and accepting
// resumes, so at the cap a slot is taken again within this), and reads
// past their deadline ended.
constexpr timeval k_sweep_period{0, 20000};

// An answer written on the socket itself (evhttp may be reading a request
// on the connection, not writing one): OpenAI's error body.
std::string raw_answer(int status, const char* reason, const std::string& message,
                       const char* code) {
  const std::string body = R"({"error":{"message":")" + message +
                           R"(","type":"server_error","param":null,"code":")" + code + R"("}})";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A refused connection's lingering close (as web servers do): after its
// 503 or 408 the socket's sending side is shut (the client reads the
// answer, then end of file) and what the client still sends is read and
// dropped for up to k_linger, or until it closes.  Closing at once, with
// its unread bytes, would send a reset that overtakes the answer: the
// client would see a broken connection, not a status.  Bounded: at most
// k_max_lingering sockets, k_linger_bytes dropped each (a client that
// sends faster is cut off with a reset as before).
constexpr std::chrono::seconds k_linger{2};
constexpr size_t k_linger_bytes = size_t(64) << 20;
constexpr size_t k_max_lingering = 256;

}  // namespace

struct http_connection_guard::impl {
  using clock = std::chrono::steady_clock;
  struct conn {
    impl* guard = nullptr;
    bufferevent* bev = nullptr;
    evbuffer_cb_entry* watch_in = nullptr;
    evbuffer_cb_entry* watch_out = nullptr;
    size_t unfinished = 0;            // bytes read since the connection's last whole request
    clock::time_point reading_since;  // when its unfinished request's first byte came
    // A request of it is being answered: no deadline runs (a pipelined
    // next request waits in its buffer) and nothing is written on the
    // socket but by evhttp.
    bool answering = false;
    bool ended = false;            // refused, timed out or closed idle: evhttp is freeing it
    clock::time_point idle_since;  // since it was made or last answered, with nothing read
  };

  // A socket of a refused connection, read and dropped until it closes
  // (its own descriptor, the key in `lingerers`: evhttp closes the
  // connection's).
  struct lingering {
    impl* guard = nullptr;
    event* ev = nullptr;
    clock::time_point until;
    size_t dropped = 0;
  };

  event_base* base = nullptr;
  http_connection_limits limits;
  evconnlistener* listener = nullptr;
  bool paused = false;
  event* sweep_event = nullptr;
  size_t unfinished = 0;
  size_t refused = 0;
  size_t idle_closed = 0;
  // Each connection's buffer, held by one reference of the guard's own: the
  // buffer outlives evhttp's free of it, which clears its callbacks; that
  // is how the guard learns a connection has ended (libevent 2.1 tells no
  // one else).
  std::unordered_map<bufferevent*, std::unique_ptr<conn>> conns;
  std::unordered_map<evutil_socket_t, std::unique_ptr<lingering>> lingerers;

  static bufferevent* make(event_base* base, void* arg) {
    auto* self = static_cast<impl*>(arg);
    self->sweep();
    // As evhttp makes it without a maker (it sets the socket afterwards).
    bufferevent* bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) return nullptr;
    bufferevent_incref(bev);
    auto c = std::make_unique<conn>();
    c->guard = self;
    c->bev = bev;
    c->watch_in = evbuffer_add_cb(bufferevent_get_input(bev), on_input, c.get());
    c->watch_out = evbuffer_add_cb(bufferevent_get_output(bev), on_output, c.get());
    c->idle_since = clock::now();
    self->conns.emplace(bev, std::move(c));
    // At the cap, a connection idle for a second or more (a keep-alive
    // one between requests, or one that never sent a byte) makes room, as
    // a web server closes idle keep-alive connections when it runs out;
    // only when none is idle does accepting pause.
    if (self->conns.size() >= self->limits.max_connections && !self->close_longest_idle() &&
        self->listener && !self->paused) {
      evconnlistener_disable(self->listener);
      self->paused = true;
    }
    return bev;
  }

  static void on_input(evbuffer*, const evbuffer_cb_info* info, void* arg) {
    auto* c = static_cast<conn*>(arg);
    if (info->n_added == 0 || c->ended || !held_by_evhttp(c->bev)) return;
    impl& g = *c->guard;
    if (c->unfinished == 0) c->reading_since = clock::now();
    c->unfinished += info->n_added;
    g.unfinished += info->n_added;
    // Past the budget: the connections holding the most go first (a small
    // request is not refused while stalled bodies hold the budget).
    while (g.unfinished > g.limits.max_unfinished_bytes) {
      conn* most = c;
      for (auto& [bev, other] : g.conns)
        if (!other->ended && other->unfinished > most->unfinished) most = other.get();
      g.refuse(*most, raw_answer(503, "Service Unavailable",
                                 "the server holds too many unfinished requests; send again",
                                 "server_busy"));
      if (most == c) break;
    }
  }

  bool close_longest_idle() {
    conn* oldest = nullptr;
    for (auto& [bev, c] : conns)
      if (!c->ended && !c->answering && c->unfinished == 0 && held_by_evhttp(bev) &&
          (!oldest || c->idle_since < oldest->idle_since))
        oldest = c.get();
    if (!oldest || clock::now() - oldest->idle_since < std::chrono::seconds(1)) return false;
    ++idle_closed;
    end(*oldest);
    return true;
  }

  // Whether evhttp still holds the connection (it clears the callbacks
  // when it frees one; its error callback is set for as long as it holds it).
  static bool held_by_evhttp(bufferevent* bev) {
    bufferevent_data_cb r = nullptr, w = nullptr;
    bufferevent_event_cb e = nullptr;
    void* arg = nullptr;
    bufferevent_getcb(bev, &r, &w, &e, &arg);
    return e != nullptr;
  }

  // evhttp has written the whole answer of a request (a callback of the
  // request, set when the front's handler starts).
  static void on_answered(evhttp_request*, void* arg) {
    auto* c = static_cast<conn*>(arg);
    c->answering = false;
    // A pipelined request waited behind the answer: its time starts now.
    if (c->unfinished > 0) c->reading_since = clock::now();
    c->idle_since = clock::now();
  }

  // An answer is being written: the request it answers is no longer being
  // read, whoever answers it (the front, or evhttp itself: a 501 to
  // CONNECT, a 400 to a bad line); what the connection's buffer still
  // holds is the next request's start.
  static void on_output(evbuffer*, const evbuffer_cb_info* info, void* arg) {
    auto* c = static_cast<conn*>(arg);
    if (info->n_added == 0) return;
    c->guard->settle(*c);
  }

  void settle(conn& c) {
    const size_t next = evbuffer_get_length(bufferevent_get_input(c.bev));
    const size_t left = c.ended ? 0 : std::min(next, c.unfinished);
    unfinished -= c.unfinished - left;
    c.unfinished = left;
    if (left > 0) c.reading_since = clock::now();
  }

  // Ends a connection (its read went past the budget, or its request took
  // too long to arrive): `answer` where nothing else is being written on
  // it, then an error event for evhttp, deferred (this may run inside the
  // connection's read), on which it frees the connection as if the client
  // had failed.  (A shutdown of the socket is not enough: Linux goes on
  // delivering data queued before it, and nothing wakes the loop for it.)
  void refuse(conn& c, const std::string& answer) {
    ++refused;
    unfinished -= c.unfinished;
    c.unfinished = 0;
    const evutil_socket_t fd = bufferevent_getfd(c.bev);
    if (fd >= 0 && !c.answering && evbuffer_get_length(bufferevent_get_output(c.bev)) == 0) {
      (void)::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      linger(fd);
    }
    end(c);
  }

  // See k_linger.  The socket stays open on a descriptor of its own when
  // evhttp closes the connection's.
  void linger(evutil_socket_t fd) {
    if (lingerers.size() >= k_max_lingering) return;
    const evutil_socket_t own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return;
    ::shutdown(own, SHUT_WR);  // after the answer: the client reads it, then end of file
    auto l = std::make_unique<lingering>();
    l->guard = this;
    l->until = clock::now() + k_linger;
    l->ev = event_new(base, own, EV_READ | EV_PERSIST, on_linger, l.get());
    const timeval wait{long(k_linger.count()), 0};
    if (!l->ev || event_add(l->ev, &wait) != 0) {
      if (l->ev) event_free(l->ev);
      ::close(own);
      return;
    }
    lingerers.emplace(own, std::move(l));
  }

  static void on_linger(evutil_socket_t fd, short what, void* arg) {
    auto* l = static_cast<lingering*>(arg);
    bool done = (what & EV_TIMEOUT) != 0 || clock::now() >= l->until;
    char drop[16384];
    while (!done) {
      const ssize_t n = ::recv(fd, drop, sizeof drop, MSG_DONTWAIT);
      if (n > 0) {
        l->dropped += size_t(n);
        done = l->dropped > k_linger_bytes;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        break;
      } else {
        done = true;  // the client closed, or the socket failed
      }
    }
    if (done) return l->guard->stop_lingering(fd);
    // A persistent event's timeout restarts at each callback: it is set
    // again to what is left of the linger, so a client that sends now and
    // then is still cut off at `until`.
    const auto left = std::max<std::chrono::microseconds>(
        std::chrono::microseconds(1),
        std::chrono::duration_cast<std::chrono::microseconds>(l->until - clock::now()));
    const timeval wait{long(left.count() / 1000000), long(left.count() % 1000000)};
    event_add(l->ev, &wait);
  }

  void stop_lingering(evutil_socket_t fd) {
    auto it = lingerers.find(fd);
    if (it == lingerers.end()) return;
    event_free(it->second->ev);
    ::close(fd);
    lingerers.erase(it);
  }

  // Has evhttp free the connection, as if its client had failed.
  void end(conn& c) {
    c.ended = true;
    bufferevent_disable(c.bev, EV_READ);
    bufferevent_trigger_event(c.bev, BEV_EVENT_READING | BEV_EVENT_ERROR, BEV_TRIG_DEFER_CALLBACKS);
  }

  // Lets go of the connections evhttp has freed (their callbacks cleared:
  // evhttp's error callback is set for as long as it holds one), and ends
  // those whose request has been arriving for longer than the deadline (a
  // byte now and then keeps evhttp's idle timeout from ever firing).
  void sweep() {
    const auto now = clock::now();
    for (auto it = conns.begin(); it != conns.end();) {
      conn& c = *it->second;
      if (held_by_evhttp(it->first)) {
        if (!c.ended && !c.answering && c.unfinished > 0 &&
            now - c.reading_since > limits.read_deadline)
          refuse(c, raw_answer(408, "Request Timeout",
                               "the request did not arrive whole in " +
                                   std::to_string(limits.read_deadline.count()) + " s",
                               "request_timeout"));
        ++it;
        continue;
      }
      release(c);
      it = conns.erase(it);
    }
    // Paused at the cap: an idle connection makes room (the next sweep
    // resumes accepting once evhttp has let it go).
    if (paused) close_longest_idle();
    if (paused && conns.size() < limits.max_connections) {
      evconnlistener_enable(listener);
      paused = false;
    }
  }

  void release(conn& c) {
    unfinished -= c.unfinished;
    evbuffer_remove_cb_entry(bufferevent_get_input(c.bev), c.watch_in);
    evbuffer_remove_cb_entry(bufferevent_get_output(c.bev), c.watch_out);
    bufferevent_decref(c.bev);
  }
};

http_connection_guard::http_connection_guard(event_base* base, evhttp* http,
                                             http_connection_limits limits)
    : impl_(std::make_unique<impl>()) {
  impl_->base = base;
  impl_->limits = limits;
  evhttp_set_bevcb(http, impl::make, impl_.get());
  impl_->sweep_event = event_new(
      base, -1, EV_PERSIST,
      [](evutil_socket_t, short, void* arg) { static_cast<impl*>(arg)->sweep(); }, impl_.get());
  event_add(impl_->sweep_event, &k_sweep_period);
}

http_connection_guard::~http_connection_guard() {
  if (impl_->sweep_event) event_free(impl_->sweep_event);
  for (auto& [bev, c] : impl_->conns) impl_->release(*c);
  for (auto& [fd, l] : impl_->lingerers) {
    event_free(l->ev);
    ::close(fd);
  }
}

void http_connection_guard::watch(evconnlistener* listener) {
  impl_->listener = listener;
}

void http_connection_guard::request_read(evhttp_request* req) {
  evhttp_connection* con = evhttp_request_get_connection(req);
  bufferevent* bev = con ? evhttp_connection_get_bufferevent(con) : nullptr;
  auto it = bev ? impl_->conns.find(bev) : impl_->conns.end();
  if (it == impl_->conns.end()) return;
  auto& c = *it->second;
  impl_->settle(c);
  c.answering = true;
  evhttp_request_set_on_complete_cb(req, impl::on_answered, &c);
}

size_t http_connection_guard::connections() const {
  return impl_->conns.size();
}

size_t http_connection_guard::unfinished_bytes() const {
  return impl_->unfinished;
}

size_t http_connection_guard::refused() const {
  return impl_->refused;
}

size_t http_connection_guard::idle_closed() const {
  return impl_->idle_closed;
}

}  // namespace troupe::cli
