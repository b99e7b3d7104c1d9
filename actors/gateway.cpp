#include "actors/gateway.hpp"

#include <spdlog/spdlog.h>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "actors/admin.hpp"
#include "messages/client.pb.h"

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
  uint32_t admin_port = 0;  // told to clients in Pong; 0: no admin endpoint
  bool draining = false;
  static inline const char* name = "gateway";
};

using self_ptr = gateway_actor::stateful_pointer<gateway_state>;

void cancel_client(gateway_state& st, self_ptr self, const std::string& client) {
  for (auto it = st.inflight.lower_bound({client, 0});
       it != st.inflight.end() && it->first.first == client; ++it)
    self->send(it->second, cancel_atom::value);
}

// Sends one frame to a client.  A client that is gone (ROUTER_MANDATORY
// reports it) costs nobody else anything: its requests are cancelled.
void send_to(self_ptr self, const std::string& client, const std::string& frame) {
  auto& st = self->state;
  try {
    st.zmq->sock.send(zmq::buffer(client), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    st.zmq->sock.send(zmq::buffer(frame), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) cancel_client(st, self, client);
  }
}

void send_error(self_ptr self, const std::string& client, wire::ErrorCode code,
                const std::string& message, uint64_t request_id = 0, bool has_request_id = false) {
  send_to(self, client, error_frame(code, message, request_id, has_request_id));
}

void on_generate(self_ptr self, const std::string& client, wire::Generate& gen) {
  auto& st = self->state;
  const uint64_t id = gen.request_id();
  if (st.draining)
    return send_error(self, client, wire::SHUTTING_DOWN,
                      "the server is shutting down and takes no new requests", id, true);
  const request_key key{client, id};
  if (st.inflight.count(key))
    return send_error(self, client, wire::DUPLICATE_REQUEST_ID,
                      "duplicate request id " + std::to_string(id) +
                          ": a request with this id is in flight on this connection",
                      id, true);
  if (static_cast<int32_t>(st.inflight.size()) >= st.opts.max_inflight)
    return send_error(self, client, wire::OVERLOADED,
                      "overloaded: " + std::to_string(st.inflight.size()) +
                          " requests in flight (limit " + std::to_string(st.opts.max_inflight) +
                          "); try again later",
                      id, true);
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
  if (frame.size() > st.opts.max_frame_bytes)
    return send_error(self, client, wire::FRAME_TOO_LARGE,
                      "frame too large: " + std::to_string(frame.size()) + " bytes, the limit is " +
                          std::to_string(st.opts.max_frame_bytes));
  wire::ClientMessage msg;
  if (!msg.ParseFromArray(frame.data(), static_cast<int>(frame.size())))
    return send_error(self, client, wire::MALFORMED,
                      "malformed frame: " + std::to_string(frame.size()) +
                          " bytes that do not parse as a troupe.wire.ClientMessage");
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
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.by_actor.find(dm.source);
    if (it == st.by_actor.end()) return;
    const auto key = it->second;
    st.by_actor.erase(it);
    st.inflight.erase(key);
    st.since.erase(key);
    send_error(self, key.first, wire::INTERNAL,
               "request " + std::to_string(key.second) +
                   " ended without finishing: " + self->system().render(dm.reason),
               key.second, true);
  });
  self->send(self, poll_atom::value);
  return {
      [self](reply_atom, const std::string& client, uint64_t id, const std::string& frame,
             bool last) {
        auto& st = self->state;
        send_to(self, client, frame);
        if (!last) return;
        auto it = st.inflight.find({client, id});
        if (it == st.inflight.end()) return;
        self->demonitor(it->second.address());
        st.by_actor.erase(it->second.address());
        st.inflight.erase(it);
        st.since.erase({client, id});
      },
      [self](trace_atom, request_trace& t) {
        auto& st = self->state;
        if (st.ctx->metrics) record_request(*st.ctx->metrics, t);
        st.traces.push_back(std::move(t));
        while (st.traces.size() > st.opts.trace_history) st.traces.pop_front();
      },
      [self](traces_atom) {
        const auto& t = self->state.traces;
        return std::vector<request_trace>(t.begin(), t.end());
      },
      [self](drain_atom, bool cancel) {
        auto& st = self->state;
        st.draining = true;
        if (cancel)
          for (const auto& [key, req] : st.inflight) self->send(req, cancel_atom::value);
        return static_cast<int32_t>(st.inflight.size());
      },
      [self](requests_atom) {
        auto& st = self->state;
        const auto now = std::chrono::steady_clock::now();
        std::vector<inflight_request> out;
        for (const auto& [key, since] : st.since)
          out.push_back({key.second, hex_bytes(key.first),
                         std::chrono::duration<double, std::milli>(now - since).count()});
        return out;
      },
      [self](cancel_atom, uint64_t id) {
        int32_t n = 0;
        for (const auto& [key, req] : self->state.inflight)
          if (key.second == id) {
            self->send(req, cancel_atom::value);
            ++n;
          }
        return n;
      },
      [self](admin_port_atom, uint32_t port) {
        self->state.admin_port = port;
        return port;
      },
      [self](poll_atom) {
        poll_once(self);
        self->send(self, poll_atom::value);
      },
  };
}

}  // namespace

gateway_handle spawn_gateway(caf::actor_system& sys, std::shared_ptr<const serve_context> ctx,
                             gateway_options opts) {
  if (opts.endpoints.empty()) throw std::runtime_error("gateway: no endpoint to listen on");
  auto zmq = std::make_shared<zmq_endpoint>();
  auto& s = zmq->sock;
  s.set(zmq::sockopt::router_mandatory, 1);  // tells us when a client is gone
  s.set(zmq::sockopt::sndhwm, 0);            // never drop a frame of a stream
  s.set(zmq::sockopt::linger, 1000);         // flush the last frames at shutdown
  // Oversized frames are refused with an Error by us; the socket only drops
  // peers that send absurd ones (ZeroMQ disconnects them, no reply).
  const int64_t hard_limit = std::max<int64_t>(int64_t{64} << 20, 16 * opts.max_frame_bytes);
  s.set(zmq::sockopt::maxmsgsize, hard_limit);
  gateway_handle h;
  for (const auto& ep : opts.endpoints) {
    try {
      s.bind(ep);
    } catch (const zmq::error_t& e) {
      throw std::runtime_error("gateway: cannot listen on " + ep + ": " + e.what());
    }
    h.endpoints.push_back(s.get(zmq::sockopt::last_endpoint));
  }
  h.actor =
      sys.spawn<caf::detached>(gateway_behavior, std::move(ctx), std::move(opts), std::move(zmq));
  return h;
}

}  // namespace troupe
