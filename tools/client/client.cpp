#include "tools/client/client.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <zmq.hpp>

namespace troupe::client {

struct connection::impl {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
};

connection::connection(const std::string& endpoint) : impl_(std::make_unique<impl>()) {
  impl_->sock.set(zmq::sockopt::linger, 0);
  try {
    impl_->sock.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw client_error("cannot connect to " + endpoint + ": " + e.what());
  }
}

connection::~connection() = default;

void connection::send(wire::ClientMessage msg) {
  msg.set_protocol_version(wire::PROTOCOL_VERSION_CURRENT);
  send_raw(msg.SerializeAsString());
}

void connection::send_raw(std::string_view bytes) {
  try {
    impl_->sock.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    throw client_error(std::string("send failed: ") + e.what());
  }
}

std::optional<wire::ServerMessage> connection::receive(std::chrono::milliseconds timeout) {
  zmq::pollitem_t items[] = {{impl_->sock.handle(), 0, ZMQ_POLLIN, 0}};
  if (zmq::poll(items, 1, timeout) == 0) return std::nullopt;
  zmq::message_t frame;
  if (!impl_->sock.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
  wire::ServerMessage msg;
  if (!msg.ParseFromArray(frame.data(), static_cast<int>(frame.size())))
    throw client_error("the server sent " + std::to_string(frame.size()) +
                       " bytes that are not a troupe.wire.ServerMessage");
  return msg;
}

void connection::generate(const wire::Generate& gen) {
  wire::ClientMessage m;
  *m.mutable_generate() = gen;
  send(std::move(m));
}

void connection::cancel(uint64_t request_id) {
  wire::ClientMessage m;
  m.mutable_cancel()->set_request_id(request_id);
  send(std::move(m));
}

bool connection::ping(std::chrono::milliseconds timeout) {
  return pong(timeout).has_value();
}

std::optional<wire::Pong> connection::pong(std::chrono::milliseconds timeout) {
  const uint64_t nonce =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  wire::ClientMessage m;
  m.mutable_ping()->set_nonce(nonce);
  send(std::move(m));
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto r = receive(left);
    if (!r) return std::nullopt;
    if (r->has_pong() && r->pong().nonce() == nonce) return r->pong();
  }
}

std::optional<uint64_t> apply(const wire::ServerMessage& msg,
                              std::function<result*(uint64_t)> find) {
  switch (msg.body_case()) {
    case wire::ServerMessage::kAccepted:
      if (auto* r = find(msg.accepted().request_id())) {
        r->accepted = true;
        r->accepted_unix_ms = unix_ms_now();
      }
      return msg.accepted().request_id();
    case wire::ServerMessage::kChunk:
      if (auto* r = find(msg.chunk().request_id())) {
        r->token_ids.insert(r->token_ids.end(), msg.chunk().token_ids().begin(),
                            msg.chunk().token_ids().end());
        r->text += msg.chunk().text();
        r->deltas.push_back(msg.chunk().text());
      }
      return msg.chunk().request_id();
    case wire::ServerMessage::kFinished:
      if (auto* r = find(msg.finished().request_id())) {
        r->finished = msg.finished();
        r->finished_unix_ms = unix_ms_now();
      }
      return msg.finished().request_id();
    case wire::ServerMessage::kError:
      if (!msg.error().has_request_id()) return std::nullopt;
      if (auto* r = find(msg.error().request_id())) {
        r->error = msg.error();
        r->finished_unix_ms = unix_ms_now();
      }
      return msg.error().request_id();
    default:
      return std::nullopt;
  }
}

std::vector<result> run(connection& conn, const std::vector<wire::Generate>& requests,
                        std::chrono::milliseconds timeout,
                        const std::function<void(const wire::TokenChunk&)>& on_chunk) {
  std::vector<result> out(requests.size());
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].request_id = requests[i].request_id();
    index[requests[i].request_id()] = i;
    conn.generate(requests[i]);
  }
  auto find = [&](uint64_t id) -> result* {
    auto it = index.find(id);
    return it == index.end() ? nullptr : &out[it->second];
  };
  auto open = [&] {
    return std::count_if(out.begin(), out.end(), [](const result& r) { return !r.done(); });
  };
  while (open() > 0) {
    auto msg = conn.receive(timeout);
    if (!msg) {
      for (auto& r : out)
        if (!r.done()) {
          wire::Error e;
          e.set_code(wire::ERROR_UNSPECIFIED);
          e.set_message("no answer from the server in " + std::to_string(timeout.count()) + " ms");
          e.set_request_id(r.request_id);
          e.set_has_request_id(true);
          r.error = e;
          r.finished_unix_ms = unix_ms_now();
        }
      break;
    }
    if (msg->has_error() && !msg->error().has_request_id())
      throw client_error("server error: " + msg->error().message());
    apply(*msg, find);
    if (msg->has_chunk() && on_chunk) on_chunk(msg->chunk());
  }
  return out;
}

std::string endpoint_host(const std::string& endpoint) {
  const std::string local = "127.0.0.1";
  const std::string tcp = "tcp://";
  if (endpoint.rfind(tcp, 0) != 0) return local;  // ipc://, inproc://
  std::string host = endpoint.substr(tcp.size());
  if (const auto semi = host.find(';'); semi != std::string::npos)  // source;destination
    host = host.substr(semi + 1);
  if (const auto colon = host.rfind(':'); colon != std::string::npos) host = host.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "*" || host == "0.0.0.0" || host == "::") return local;
  return host;
}

double unix_ms_now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string to_string(wire::FinishReason r) {
  if (r == wire::FINISH_UNSPECIFIED) return "none";
  std::string s = wire::FinishReason_Name(r);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace troupe::client
