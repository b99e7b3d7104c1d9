// troupe client admin: inspects and steers a running `troupe serve` through
// its admin endpoint (service.admin_port; JSON over ZeroMQ, docs/security.md):
//   troupe client --server EP admin [--admin HOST:PORT] kv|instances|requests
//   troupe client --server EP admin [--admin HOST:PORT] trace ID | cancel ID
// Without --admin the server is pinged over the client protocol: its Pong
// names the admin port, on the host of EP.  The secret comes from
// --secret-file, else $TROUPE_ADMIN_SECRET, else the file the server left
// for its user in the run folder.  --json prints one JSON object (or
// array) instead of text.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <zmq.hpp>

#include "actors/admin_endpoint.hpp"
#include "runtime/secret.hpp"
#include "tools/client/client.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

// Text output: the JSON, one "key: value" a line (nested objects indented).
void print_text(const nlohmann::json& j, const std::string& indent = "") {
  if (j.is_array()) {
    if (j.empty()) std::printf("%s(none)\n", indent.c_str());
    for (const auto& el : j) {
      print_text(el, indent);
      std::printf("\n");
    }
    return;
  }
  for (const auto& [k, v] : j.items()) {
    if (v.is_object()) {
      std::printf("%s%s:\n", indent.c_str(), k.c_str());
      print_text(v, indent + "  ");
    } else {
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      std::printf("%s%s: %s\n", indent.c_str(), k.c_str(), s.c_str());
    }
  }
}

struct admin_flags {
  std::string admin;        // HOST:PORT; empty: ask the server
  std::string secret_file;  // empty: $TROUPE_ADMIN_SECRET, else the run folder's
  std::string action;
  uint64_t id = 0;
  uint64_t instance = 0;
  int timeout_ms = 10000;
  const std::string* server = nullptr;
  const bool* json = nullptr;
};

struct admin_endpoint {
  std::string host;
  int port = 0;
};

// --admin HOST:PORT as given.
admin_endpoint parse_admin(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::invalid_argument(
        "--admin: give the server's admin endpoint as HOST:PORT "
        "(service.admin_port of troupe serve), got '" +
        text + "'");
  admin_endpoint a{text.substr(0, colon), 0};
  try {
    a.port = std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (a.port <= 0 || a.port > 65535)
    throw std::invalid_argument("--admin: bad port in '" + text + "'");
  return a;
}

// The admin endpoint the server names in its Pong; nullopt (said why on
// stderr) when it does not answer or has none.
std::optional<admin_endpoint> ask_server(const std::string& server, int timeout_ms) {
  client::connection conn(server);
  auto pong = conn.pong(std::chrono::milliseconds(timeout_ms));
  if (!pong) {
    std::fprintf(stderr,
                 "error: admin: no answer from %s within %d ms (is troupe serve running?)\n",
                 server.c_str(), timeout_ms);
    return std::nullopt;
  }
  if (pong->admin_port() == 0 || pong->admin_port() > 65535) {
    std::fprintf(stderr,
                 "error: admin: the server at %s has no admin endpoint (started with "
                 "--admin-port -1); start it with --admin-port 0 or a port, or give --admin "
                 "HOST:PORT\n",
                 server.c_str());
    return std::nullopt;
  }
  return admin_endpoint{client::endpoint_host(server), static_cast<int>(pong->admin_port())};
}

// The secret to send: --secret-file, $TROUPE_ADMIN_SECRET, else what the
// server left in the run folder for this port (control first, then
// read-only for read commands); empty when there is none.
std::string find_secret(const admin_flags& f, int port) {
  if (!f.secret_file.empty()) return read_secret_file(f.secret_file);
  if (const char* env = std::getenv("TROUPE_ADMIN_SECRET"); env && *env) return env;
  std::vector<std::string> kinds = {"admin"};
  if (admin_command_is_read_only(f.action)) kinds.push_back("admin-read");
  for (const auto& kind : kinds) try {
      return read_secret_file(run_secret_path(kind, port));
    } catch (const std::exception&) {
    }
  return {};
}

// ZeroMQ retries a refused connection quietly until the timeout; a plain
// TCP connect first says at once that nothing listens there.
std::string reachable(const admin_endpoint& at, int timeout_ms) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &res);
      rc != 0)
    return ::gai_strerror(rc);
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      rc = ::poll(&p, 1, timeout_ms) == 1 &&
                   ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0
               ? 0
               : -1;
      errno = err ? err : ETIMEDOUT;
    }
    if (rc != 0) why = std::strerror(errno);
    ::close(fd);
    if (rc == 0) {
      ::freeaddrinfo(res);
      return {};
    }
  }
  ::freeaddrinfo(res);
  return why;
}

int run_admin(const admin_flags& f) {
  std::optional<admin_endpoint> at;
  if (!f.admin.empty())
    at = parse_admin(f.admin);
  else if (!(at = ask_server(*f.server, f.timeout_ms)))
    return 1;
  const std::string where = at->host + ":" + std::to_string(at->port);
  if (auto why = reachable(*at, f.timeout_ms); !why.empty()) {
    std::fprintf(stderr, "error: admin %s: cannot reach the admin endpoint at %s: %s\n",
                 f.action.c_str(), where.c_str(), why.c_str());
    return 1;
  }
  nlohmann::json req = {{"command", f.action}, {"secret", find_secret(f, at->port)}};
  if (f.action == "trace" || f.action == "cancel" || f.action == "migrate") req["id"] = f.id;
  if (f.action == "migrate" || f.action == "drain" || f.action == "kill")
    req["instance"] = f.instance;

  zmq::context_t ctx(1);
  zmq::socket_t sock(ctx, zmq::socket_type::dealer);
  sock.set(zmq::sockopt::linger, 0);
  sock.connect("tcp://" + where);
  const std::string body = req.dump();
  sock.send(zmq::buffer(body), zmq::send_flags::none);
  zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::milliseconds(f.timeout_ms));
  zmq::message_t msg;
  if (!(items[0].revents & ZMQ_POLLIN) || !sock.recv(msg, zmq::recv_flags::dontwait)) {
    std::fprintf(stderr, "error: admin %s: no answer from the admin endpoint at %s within %d ms\n",
                 f.action.c_str(), where.c_str(), f.timeout_ms);
    return 1;
  }
  auto reply = nlohmann::json::parse(msg.to_string(), nullptr, false);
  if (reply.is_discarded() || !reply.is_object() || !reply.contains("ok")) {
    std::fprintf(stderr, "error: admin %s: %s does not answer like a troupe admin endpoint\n",
                 f.action.c_str(), where.c_str());
    return 1;
  }
  if (!reply["ok"].get<bool>()) {
    const auto& e = reply["error"];
    std::fprintf(stderr, "error: admin %s: %s: %s\n", f.action.c_str(),
                 e.value("code", "?").c_str(), e.value("message", "").c_str());
    return 1;
  }
  const nlohmann::json& out = reply["result"];
  if (*f.json)
    std::cout << out.dump() << std::endl;
  else
    print_text(out);
  if (f.action == "cancel" && out.value("cancelled", 0) == 0) {
    std::fprintf(stderr, "error: no request with id %llu in flight\n",
                 static_cast<unsigned long long>(f.id));
    return 1;
  }
  return 0;
}

}  // namespace

CLI::App* add_client_admin(CLI::App& client, const std::string& server, const bool& json) {
  auto f = std::make_shared<admin_flags>();
  f->server = &server;
  f->json = &json;
  auto* cmd =
      client.add_subcommand("admin", "inspect and steer the server through its admin endpoint");
  cmd->fallthrough();
  cmd->require_subcommand(1);
  cmd->add_option("--admin", f->admin,
                  "the server's admin endpoint HOST:PORT (troupe serve --admin-port); default: "
                  "the port the server names in its Pong, on the host of --server");
  cmd->add_option("--secret-file", f->secret_file,
                  "file with the admin secret (control or read-only); default: "
                  "$TROUPE_ADMIN_SECRET, else the one the server left for this user");
  cmd->add_option("--admin-timeout-ms", f->timeout_ms,
                  "give up after this long (the ping, then each admin call)")
      ->default_val(10000)
      ->check(CLI::Range(1, 1 << 30));
  auto action = [&](const char* name, const char* help, bool with_id, bool with_instance = false) {
    auto* sub = cmd->add_subcommand(name, help);
    sub->fallthrough();
    if (with_id) sub->add_option("id", f->id, "the client's request id")->required();
    if (with_instance)
      sub->add_option("instance", f->instance, "an instance id (admin instances)")->required();
    sub->callback([f, name] {
      f->action = name;
      int rc = run_admin(*f);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  };
  action("kv", "KV pages: total, free, used, reusable; prefix hit rate", false);
  action("instances", "the instances with their queues and counters", false);
  action("nodes", "the cluster's nodes: address, state, resources, instances", false);
  action("requests", "the requests in flight", false);
  action("trace", "one request's trace (the newest with this id)", true);
  action("cancel", "cancel the in-flight requests with this id", true);
  action("migrate", "move an in-flight request to another instance (KV and all)", true, true);
  action("drain", "stop placing on an instance; returns once it holds no request", false, true);
  action("kill", "fault injection: kill an instance as a crash would (its requests recover)", false,
         true);
  return cmd;
}

}  // namespace troupe::cli
