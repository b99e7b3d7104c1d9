#include "actors/gateway.hpp"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>
#include "actors/relay.hpp"

#include "actors/admin.hpp"
#include "actors/wire_checks.hpp"
#include "messages/client.pb.h"
#include "runtime/common/elapsed.hpp"

namespace troupe {

namespace {

// The socket and its context, shared with the spawn closure (which CAF
// copies), used only by the gateway's thread once it runs.
struct zmq_endpoint {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::router};
  ~zmq_endpoint() { sock.close(); }
};

using request_key = std::pair<std::string, uint64_t>;  // (client identity, request id)

struct gateway_state {
  std::shared_ptr<const serve_context> ctx;
  gateway_options opts;
  std::shared_ptr<zmq_endpoint> zmq;
  std::map<request_key, request_actor> inflight;
  std::unordered_map<caf::actor_addr, request_key> by_actor;
  std::map<request_key, std::chrono::steady_clock::time_point> since;  // arrival, for admin
  std::deque<request_trace> traces;
  // Slow readers: clients whose queue hit the high-water mark, with the
  // terminal frames (at most one per request in flight) still to deliver.
  std::map<std::string, std::deque<std::string>> stalled;
  uint64_t dropped_replies = 0;  // answers to a stalled client's messages, dropped
  uint32_t admin_port = 0;  // told to clients in Pong; 0: no admin endpoint
  bool draining = false;
  static inline const char* name = "gateway";
};

using self_ptr = gateway_actor::stateful_pointer<gateway_state>;

// The request actors in flight under client request id `id` (admin names a
// request by the id its client chose; clients choose freely, so several
// connections may use one).
std::vector<request_actor> requests_with_id(const gateway_state& st, uint64_t id) {
  std::vector<request_actor> out;
  for (const auto& [key, req] : st.inflight)
    if (key.second == id) out.push_back(req);
  return out;
}

caf::error not_in_flight(uint64_t id) {
  return caf::make_error(caf::sec::invalid_argument,
                         "no request with id " + std::to_string(id) + " is in flight");
}

// Cancels every request of one client; a reason, when given, goes to the
// client in each Finished.error (the server ended it, not the client).
void cancel_client(gateway_state& st, self_ptr self, const std::string& client,
                   const std::string& why = {}) {
  for (auto it = st.inflight.lower_bound({client, 0});
       it != st.inflight.end() && it->first.first == client; ++it) {
    if (why.empty())
      self->send(it->second, cancel_atom::value);
    else
      self->send(it->second, cancel_atom::value, why);
  }
}

enum class sent { ok, gone, full };

// One frame to a client, now or never.  A client that is gone
// (ROUTER_MANDATORY reports it) costs nobody else anything: its requests
// are cancelled.
sent try_send(self_ptr self, const std::string& client, const std::string& frame) {
  auto& st = self->state;
  try {
    // With ROUTER_MANDATORY a full queue refuses the identity frame, so a
    // frame is never half sent.
    if (!st.zmq->sock.send(zmq::buffer(client),
                           zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return sent::full;
    st.zmq->sock.send(zmq::buffer(frame), zmq::send_flags::dontwait);
    return sent::ok;
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) {
      cancel_client(st, self, client);
      return sent::gone;
    }
    return sent::full;
  }
}

// What a frame is to its client: a request's stream (chunks), the
// terminal frame of a request it accepted (owed: its Finished or Error),
// or the answer to one of its messages that started no request (a Pong, a
// refusal, an error for a bad frame or an unknown cancel).
enum class frame_due { stream, owed, reply };

// Sends one frame.  A client whose queue is full reads too slowly: its
// requests are cancelled (the reason goes with their Finished) and, from
// then until it catches up, only the frames owed for its accepted requests
// are kept for it, at most one each, so what it can make the server hold
// is bounded by the requests in flight.  Answers to its messages meanwhile
// (a client that never reads can send Pings and Cancels without end) are
// dropped, counted in the log when it catches up.
void send_to(self_ptr self, const std::string& client, const std::string& frame,
             frame_due due = frame_due::reply) {
  auto& st = self->state;
  if (auto it = st.stalled.find(client); it != st.stalled.end()) {
    if (due == frame_due::owed)
      it->second.push_back(frame);
    else if (due == frame_due::reply)
      ++st.dropped_replies;
    return;
  }
  if (try_send(self, client, frame) != sent::full) return;
  auto& backlog = st.stalled[client];
  if (due == frame_due::owed) backlog.push_back(frame);
  const std::string why = "slow reader: more than " + std::to_string(st.opts.client_backlog) +
                          " frames waited for this client (service.client_backlog)";
  spdlog::warn("gateway: client {} reads too slowly, cancelling its requests", hex_bytes(client));
  cancel_client(st, self, client, why);
}

// Retries the slow readers' terminal frames; a client whose backlog is
// delivered is served normally again.
void flush_stalled(self_ptr self) {
  auto& st = self->state;
  for (auto it = st.stalled.begin(); it != st.stalled.end();) {
    auto& q = it->second;
    while (!q.empty()) {
      const sent r = try_send(self, it->first, q.front());
      if (r == sent::full) break;
      q.pop_front();
      if (r == sent::gone) q.clear();
    }
    it = q.empty() ? st.stalled.erase(it) : std::next(it);
  }
  if (st.stalled.empty() && st.dropped_replies > 0) {
    spdlog::warn("gateway: dropped {} answers to messages of clients that were not reading",
                 st.dropped_replies);
    st.dropped_replies = 0;
  }
}

void send_error(self_ptr self, const std::string& client, wire::ErrorCode code,
                const std::string& message, uint64_t request_id = 0, bool has_request_id = false) {
  send_to(self, client, error_frame(code, message, request_id, has_request_id));
}

// A request refused before a request actor exists: counted with the
// others (troupe_requests_total{finish="rejected"}).
void count_refusal(self_ptr self, const std::string& why) {
  if (!self->state.ctx->metrics) return;
  request_trace t;
  t.finish = "rejected";
  t.error = why;
  record_request(*self->state.ctx->metrics, t);
}

void on_generate(self_ptr self, const std::string& client, wire::Generate& gen) {
  auto& st = self->state;
  const uint64_t id = gen.request_id();
  if (st.draining) {
    count_refusal(self, "shutting down");
    return send_error(self, client, wire::SHUTTING_DOWN,
                      "the server is shutting down and takes no new requests", id, true);
  }
  const request_key key{client, id};
  if (st.inflight.count(key)) {
    // No request id on this Error: one with an id is that id's terminal
    // message, and the request in flight with it goes on.
    count_refusal(self, "duplicate request id");
    return send_error(self, client, wire::DUPLICATE_REQUEST_ID,
                      "duplicate request id " + std::to_string(id) +
                          ": a request with this id is in flight on this connection; this "
                          "Generate was dropped and the one in flight goes on");
  }
  if (static_cast<int32_t>(st.inflight.size()) >= st.opts.max_inflight) {
    count_refusal(self, "overloaded");
    return send_error(self, client, wire::OVERLOADED,
                      "overloaded: " + std::to_string(st.inflight.size()) +
                          " requests in flight (limit " + std::to_string(st.opts.max_inflight) +
                          "); try again later",
                      id, true);
  }
  auto req = spawn_request(self->system(), st.ctx, self, client, std::move(gen));
  self->monitor(req);
  st.by_actor.emplace(req.address(), key);
  st.inflight.emplace(key, std::move(req));
  st.since.emplace(key, std::chrono::steady_clock::now());
}

void on_frame(self_ptr self, std::vector<zmq::message_t>& parts) {
  auto& st = self->state;
  if (parts.empty()) return;
  const std::string client = parts[0].to_string();
  if (parts.size() != 2)
    return send_error(
        self, client, wire::MALFORMED,
        "malformed message: expected one frame, got " + std::to_string(parts.size() - 1));
  const auto& frame = parts[1];
  if (frame.size() > st.opts.max_frame_bytes) {
    const auto id = peek_generate_id(frame.data(), frame.size());
    return send_error(self, client, wire::FRAME_TOO_LARGE,
                      "frame too large: " + std::to_string(frame.size()) + " bytes, the limit is " +
                          std::to_string(st.opts.max_frame_bytes) +
                          " (the server's --max-frame-bytes; images count toward it)",
                      id.value_or(0), id.has_value() && !st.inflight.count({client, *id}));
  }
  // Zero bytes parse as a ClientMessage of all defaults, which the version
  // check would answer as an old client; it is no message at all.
  if (frame.size() == 0)
    return send_error(self, client, wire::MALFORMED,
                      "malformed frame: empty (a ClientMessage has at least its version)");
  wire::ClientMessage msg;
  if (!msg.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) {
    if (auto bad = invalid_utf8_field(frame.data(), frame.size())) {
      if (bad->has_id) count_refusal(self, "invalid UTF-8");
      return send_error(self, client, wire::INVALID_ARGUMENT,
                        bad->field + " is not valid UTF-8 (text fields must be)", bad->id,
                        bad->has_id);
    }
    const auto id = peek_generate_id(frame.data(), frame.size());
    return send_error(self, client, wire::MALFORMED,
                      "malformed frame: " + std::to_string(frame.size()) +
                          " bytes that do not parse as a troupe.wire.ClientMessage",
                      id.value_or(0), id.has_value() && !st.inflight.count({client, *id}));
  }
  if (msg.protocol_version() != wire::PROTOCOL_VERSION_CURRENT)
    return send_error(self, client, wire::UNSUPPORTED_VERSION,
                      "unsupported protocol version " + std::to_string(msg.protocol_version()) +
                          " (this server speaks " + std::to_string(wire::PROTOCOL_VERSION_CURRENT) +
                          ")");
  switch (msg.body_case()) {
    case wire::ClientMessage::kGenerate:
      return on_generate(self, client, *msg.mutable_generate());
    case wire::ClientMessage::kCancel: {
      const uint64_t id = msg.cancel().request_id();
      auto it = st.inflight.find({client, id});
      if (it == st.inflight.end())
        return send_error(
            self, client, wire::UNKNOWN_REQUEST,
            "cancel: request id " + std::to_string(id) + " is not in flight on this connection", id,
            true);
      self->send(it->second, cancel_atom::value);
      return;
    }
    case wire::ClientMessage::kPing: {
      wire::ServerMessage m;
      auto* p = m.mutable_pong();
      p->set_nonce(msg.ping().nonce());
      p->set_model(st.ctx->model_name);
      p->set_protocol_version(wire::PROTOCOL_VERSION_CURRENT);
      p->set_admin_port(st.admin_port);
      return send_to(self, client, encode_frame(m));
    }
    case wire::ClientMessage::BODY_NOT_SET:
      return send_error(self, client, wire::MALFORMED,
                        "malformed message: no body (generate, cancel or ping)");
  }
}

// One round: wait briefly for client frames, take what has arrived, then
// let the mailbox (request actors' frames) run before the next round.
void poll_once(self_ptr self) {
  auto& st = self->state;
  zmq::pollitem_t items[] = {{st.zmq->sock.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::milliseconds(st.opts.poll_ms));
  for (int i = 0; i < 256; ++i) {
    std::vector<zmq::message_t> parts;
    std::optional<size_t> n;
    try {
      n = zmq::recv_multipart(st.zmq->sock, std::back_inserter(parts), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("gateway: receive failed: {}", e.what());
      break;
    }
    if (!n) break;
    try {
      on_frame(self, parts);
    } catch (const std::exception& e) {
      if (!parts.empty())
        send_error(self, parts[0].to_string(), wire::INTERNAL,
                   std::string("internal error: ") + e.what());
    }
  }
}

gateway_actor::behavior_type gateway_behavior(self_ptr self,
                                              std::shared_ptr<const serve_context> ctx,
                                              gateway_options opts,
                                              std::shared_ptr<zmq_endpoint> zmq) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.opts = std::move(opts);
  st.zmq = std::move(zmq);
  // A request actor ended before its last frame: its client gets an Error.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.by_actor.find(dm.source);
    if (it == st.by_actor.end()) return;
    const auto key = it->second;
    st.by_actor.erase(it);
    st.inflight.erase(key);
    st.since.erase(key);
    send_to(self, key.first,
            error_frame(wire::INTERNAL,
                        "request " + std::to_string(key.second) +
                            " ended without finishing: " + self->system().render(dm.reason),
                        key.second, true),
            frame_due::owed);
  });
  self->send(self, poll_atom::value);
  return {
      // A request's frame for its client; the last one ends the request.
      [self](reply_atom, const std::string& client, uint64_t id, const std::string& frame,
             bool last) {
        auto& st = self->state;
        send_to(self, client, frame, last ? frame_due::owed : frame_due::stream);
        if (!last) return;
        auto it = st.inflight.find({client, id});
        if (it == st.inflight.end()) return;
        self->demonitor(it->second.address());
        st.by_actor.erase(it->second.address());
        st.inflight.erase(it);
        st.since.erase({client, id});
      },
      // A finished request's trace: into the metrics and the history.
      [self](trace_atom, request_trace& t) {
        auto& st = self->state;
        if (st.ctx->metrics) record_request(*st.ctx->metrics, t);
        st.traces.push_back(std::move(t));
        while (st.traces.size() > st.opts.trace_history) st.traces.pop_front();
      },
      // The most recent traces, oldest first.
      [self](traces_atom) {
        const auto& t = self->state.traces;
        return std::vector<request_trace>(t.begin(), t.end());
      },
      // Take no new requests (cancel: end those in flight); replies how many remain.
      [self](drain_atom, bool cancel) {
        auto& st = self->state;
        st.draining = true;
        if (cancel)
          for (const auto& [key, req] : st.inflight) self->send(req, cancel_atom::value);
        return static_cast<int32_t>(st.inflight.size());
      },
      // The requests in flight, each with its trace so far (admin).
      [self](requests_atom) -> caf::result<std::vector<inflight_request>> {
        // Each request actor is asked for its trace so far (where it runs,
        // its state, its tokens); one that does not answer in 2 s is listed
        // without it.
        auto& st = self->state;
        const auto now = std::chrono::steady_clock::now();
        struct gathering {
          std::vector<inflight_request> out;
          size_t left = 0;
          caf::typed_response_promise<std::vector<inflight_request>> rp;
        };
        auto g = std::make_shared<gathering>();
        std::vector<request_actor> actors;
        for (const auto& [key, req] : st.inflight) {
          auto since = st.since.find(key);
          const double age = since == st.since.end() ? 0 : ms_between(since->second, now);
          g->out.push_back({key.second, hex_bytes(key.first), age, {}});
          actors.push_back(req);
        }
        if (actors.empty()) return g->out;
        g->left = actors.size();
        g->rp = self->make_response_promise<std::vector<inflight_request>>();
        for (size_t i = 0; i < actors.size(); ++i)
          self->request(actors[i], std::chrono::seconds(2), trace_atom::value)
              .then(
                  [g, i](request_trace& t) {
                    g->out[i].live = std::move(t);
                    if (--g->left == 0) g->rp.deliver(std::move(g->out));
                  },
                  [g](caf::error&) {
                    if (--g->left == 0) g->rp.deliver(std::move(g->out));
                  });
        return g->rp;
      },
      // Cancel the in-flight requests with this id, of any client (admin).
      [self](cancel_atom, uint64_t id) {
        const auto found = requests_with_id(self->state, id);
        for (const auto& req : found) self->send(req, cancel_atom::value);
        return static_cast<int32_t>(found.size());
      },
      // Preempt the sequence of an in-flight request with this id (admin).
      [self](preempt_atom, uint64_t id) -> caf::result<int32_t> {
        const auto found = requests_with_id(self->state, id);
        if (found.empty()) return not_in_flight(id);
        return relay<int32_t>(self, found[0], std::chrono::seconds(5), preempt_atom::value);
      },
      // One in-flight request's trace, by its id (admin).
      [self](trace_atom, uint64_t id) -> caf::result<request_trace> {
        // The live trace of a request in flight, from its request actor.
        const auto found = requests_with_id(self->state, id);
        if (found.empty()) return not_in_flight(id);
        return relay<request_trace>(self, found[0], std::chrono::seconds(5), trace_atom::value);
      },
      // Move the one in-flight request with this id to that instance (admin).
      [self](migrate_atom, uint64_t id, uint64_t instance) -> caf::result<uint64_t> {
        const auto found = requests_with_id(self->state, id);
        if (found.empty()) return not_in_flight(id);
        if (found.size() > 1)
          return caf::make_error(
              caf::sec::invalid_argument,
              std::to_string(found.size()) + " requests in flight have id " + std::to_string(id));
        return relay<uint64_t>(self, found[0], std::chrono::seconds(60), migrate_atom::value,
                               instance);
      },
      // The admin port, told to clients in Pong; set once the admin exists.
      [self](admin_port_atom, uint32_t port) {
        self->state.admin_port = port;
        return port;
      },
      // Its own loop: stalled frames, the socket, then the mailbox, again.
      [self](poll_atom) {
        if (!self->state.stalled.empty()) flush_stalled(self);
        poll_once(self);
        self->send(self, poll_atom::value);
      },
  };
}

}  // namespace

gateway_handle spawn_gateway(caf::actor_system& sys, std::shared_ptr<const serve_context> ctx,
                             gateway_options opts) {
  if (opts.endpoints.empty()) throw std::runtime_error("service.listen: no endpoint to listen on");
  // A client's bad frame is answered with an Error; libprotobuf's own
  // "String field contains invalid UTF-8" line per frame would let any
  // client fill the log.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
        spdlog::debug("libprotobuf {}:{}: {}", file, line, message);
      });
  auto zmq = std::make_shared<zmq_endpoint>();
  auto& s = zmq->sock;
  s.set(zmq::sockopt::router_mandatory, 1);  // tells us when a client is gone
  // A bounded queue per client: a full one marks a slow reader (send_to).
  s.set(zmq::sockopt::sndhwm, std::max(16, opts.client_backlog));
  s.set(zmq::sockopt::linger, 1000);  // flush the last frames at shutdown
  // Oversized frames are refused with an Error by us; the socket only drops
  // peers that send absurd ones (ZeroMQ disconnects them, no reply).
  // (Twice the limit, so a frame just over it still gets its Error.)
  const int64_t hard_limit = std::max<int64_t>(int64_t{64} << 20, 2 * opts.max_frame_bytes);
  s.set(zmq::sockopt::maxmsgsize, hard_limit);
  gateway_handle h;
  for (const auto& ep : opts.endpoints) {
    try {
      s.bind(ep);
    } catch (const zmq::error_t& e) {
      // ZeroMQ binds addresses and interfaces, not host names.
      throw std::runtime_error(
          "service.listen: cannot listen on " + ep + ": " + e.what() +
          (e.num() == ENODEV ? " (give an IP address or an interface, e.g. 127.0.0.1, not a name)"
                             : ""));
    }
    h.endpoints.push_back(s.get(zmq::sockopt::last_endpoint));
  }
  h.actor =
      sys.spawn<caf::detached>(gateway_behavior, std::move(ctx), std::move(opts), std::move(zmq));
  return h;
}

}  // namespace troupe
