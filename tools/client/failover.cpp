#include "tools/client/failover.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <thread>

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
                    std::chrono::milliseconds wait, std::string* model) {
  const size_t n = endpoints.size();
  std::vector<std::unique_ptr<connection>> conns(n);
  std::vector<std::optional<std::string>> served(n);  // by order from `start`: its model
  for (size_t k = 0; k < n; ++k) {
    try {
      conns[k] = std::make_unique<connection>(endpoints[(start + k) % n]);
      wire::ClientMessage m;
      m.mutable_ping()->set_nonce(1);
      conns[k]->send(std::move(m));
    } catch (const client_error&) {
      conns[k].reset();  // not an endpoint ZeroMQ can dial (a bad registry record)
    }
  }
  auto fits = [&](size_t k) {
    return served[k] && (!model || model->empty() || *served[k] == *model);
  };
  auto deadline = clock_type::now() + wait;
  bool grace = false;
  while (clock_type::now() < deadline) {
    bool all = true;
    for (size_t k = 0; k < n; ++k) {
      if (!conns[k] || served[k]) continue;
      all = false;
      try {
        while (auto msg = conns[k]->receive(std::chrono::milliseconds(0)))
          if (msg->has_pong()) {
            served[k] = msg->pong().model();
            break;
          }
      } catch (const client_error&) {
        conns[k].reset();  // it answered with bytes that are not the protocol
      }
    }
    // The first in order that fits, once the ones before it had 100 ms
    // more than the fastest answer.
    for (size_t k = 0; k < n && !grace; ++k)
      if (fits(k)) {
        grace = true;
        deadline = std::min(deadline, clock_type::now() + std::chrono::milliseconds(100));
      }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t k = 0; k < n; ++k)
    if (fits(k)) {
      if (model && model->empty()) *model = *served[k];
      return static_cast<int>((start + k) % n);
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
  // The model of the first service that answers: a failover goes only to
  // services of the same model.
  std::string model;
  int at = first_answering(endpoints, 0, o.lost_after, &model);
  if (at < 0) throw client_error("no endpoint answers a ping");
  // Services that keep coming and going are not chased for ever.
  const size_t most_moves = 3 * endpoints.size();
  size_t moves = 0;
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
    const int next = first_answering(endpoints, size_t(at) + 1, o.lost_after, &model);
    const auto left = static_cast<size_t>(open());
    if (o.on_failover) o.on_failover(was, next < 0 ? "" : endpoints[size_t(next)], left);
    if (next < 0 || ++moves > most_moves) {
      end_open(out, wire::UNAVAILABLE,
               "the service at " + was + " was lost and " +
                   (next < 0 ? "no endpoint serving " + model + " answers"
                             : std::to_string(most_moves) + " moves were made already"));
      break;
    }
    at = next;
  }
  return out;
}

}  // namespace troupe::client
