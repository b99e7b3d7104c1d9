#include "tools/client/failover.hpp"

#include <algorithm>
#include <map>
#include <memory>

namespace troupe::client {

namespace {

using clock_type = std::chrono::steady_clock;

wire::Error client_side_error(wire::ErrorCode code, uint64_t request_id, std::string message) {
  wire::Error e;
  e.set_code(code);
  e.set_message(std::move(message));
  e.set_request_id(request_id);
  e.set_has_request_id(true);
  return e;
}

void end_open(std::vector<result>& out, wire::ErrorCode code, const std::string& why) {
  for (auto& r : out)
    if (!r.done()) {
      r.error = client_side_error(code, r.request_id, why);
      r.finished_unix_ms = unix_ms_now();
    }
}

}  // namespace

std::vector<std::string> split_endpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t from = 0;
  for (;;) {
    const size_t comma = list.find(',', from);
    std::string e =
        list.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    e.erase(0, e.find_first_not_of(" \t"));
    e.erase(e.find_last_not_of(" \t") + 1);
    if (e.empty()) throw client_error("an empty endpoint in '" + list + "'");
    out.push_back(std::move(e));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

int first_answering(const std::vector<std::string>& endpoints, size_t start,
                    std::chrono::milliseconds wait) {
  for (size_t k = 0; k < endpoints.size(); ++k) {
    const size_t i = (start + k) % endpoints.size();
    connection c(endpoints[i]);
    if (c.ping(wait)) return static_cast<int>(i);
  }
  return -1;
}

std::vector<result> run_failover(const std::vector<std::string>& endpoints,
                                 const std::vector<wire::Generate>& requests,
                                 const failover_options& o) {
  if (endpoints.empty()) throw client_error("no endpoint given");
  std::vector<result> out(requests.size());
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].request_id = requests[i].request_id();
    index[requests[i].request_id()] = i;
  }
  auto find = [&](uint64_t id) -> result* {
    auto it = index.find(id);
    return it == index.end() ? nullptr : &out[it->second];
  };
  auto open = [&] {
    return std::count_if(out.begin(), out.end(), [](const result& r) { return !r.done(); });
  };
  int at = first_answering(endpoints, 0, o.lost_after);
  if (at < 0) throw client_error("no endpoint answers a ping");
  while (open() > 0) {
    // Every request not ended yet goes (again, whole) to this endpoint.
    connection conn(endpoints[size_t(at)]);
    for (size_t i = 0; i < requests.size(); ++i)
      if (!out[i].done()) {
        out[i] = result{};
        out[i].request_id = requests[i].request_id();
        conn.generate(requests[i]);
      }
    auto heard = clock_type::now();  // any message, a pong included
    auto progress = heard;           // a message about a request
    auto pinged = heard - o.probe;
    bool lost = false;
    while (open() > 0) {
      auto msg = conn.receive(std::min(o.probe, std::chrono::milliseconds(200)));
      const auto now = clock_type::now();
      if (msg) {
        heard = now;
        if (msg->has_pong()) continue;
        if (msg->has_error() && !msg->error().has_request_id())
          throw client_error("server error: " + msg->error().message());
        progress = now;
        apply(*msg, find);
        if (msg->has_chunk() && o.on_chunk) o.on_chunk(msg->chunk());
        continue;
      }
      if (now - heard >= o.lost_after) {
        lost = true;
        break;
      }
      if (now - progress >= o.timeout) {
        end_open(out, wire::ERROR_UNSPECIFIED,
                 "no answer from the server in " + std::to_string(o.timeout.count()) + " ms");
        break;
      }
      if (now - heard >= o.probe && now - pinged >= o.probe) {
        wire::ClientMessage m;
        m.mutable_ping()->set_nonce(1);
        conn.send(std::move(m));
        pinged = now;
      }
    }
    if (!lost) break;
    const std::string was = endpoints[size_t(at)];
    const int next = first_answering(endpoints, size_t(at) + 1, o.lost_after);
    const auto left = static_cast<size_t>(open());
    if (o.on_failover) o.on_failover(was, next < 0 ? "" : endpoints[size_t(next)], left);
    if (next < 0) {
      end_open(out, wire::UNAVAILABLE,
               "the service at " + was + " was lost and no endpoint answers");
      break;
    }
    at = next;
  }
  return out;
}

}  // namespace troupe::client
