#include "tools/troupe/admin_link.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <zmq.hpp>

#include "actors/admin_endpoint.hpp"
#include "net/secret.hpp"
#include "runtime/common/user_text.hpp"
#include "tools/client/client.hpp"

namespace troupe::cli {

namespace {

struct endpoint {
  std::string host;
  int port = 0;
};

// --admin HOST:PORT as given.
endpoint parse_admin(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::invalid_argument(
        "--admin: give the server's admin endpoint as HOST:PORT "
        "(service.admin_port of troupe serve), got " +
        quoted_value(text));
  endpoint a{text.substr(0, colon),
             static_cast<int>(port_number(std::string_view(text).substr(colon + 1)))};
  if (a.port <= 0) throw std::invalid_argument("--admin: bad port in " + quoted_value(text));
  return a;
}

// ZeroMQ retries a refused connection quietly until the timeout; a plain
// TCP connect first says at once that nothing listens there.
std::string reachable(const endpoint& at, int timeout_ms) {
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

}  // namespace

struct admin_link::impl {
  endpoint at;
  zmq::context_t ctx{1};
  std::unique_ptr<zmq::socket_t> sock;

  void open() {
    sock = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    sock->set(zmq::sockopt::linger, 0);
    sock->connect("tcp://" + at.host + ":" + std::to_string(at.port));
  }
};

void add_admin_target_flags(CLI::App& cmd, admin_target& t, int default_timeout_ms) {
  cmd.add_option("--admin", t.admin,
                 "the server's admin endpoint HOST:PORT (troupe serve --admin-port); default: "
                 "the port the server names in its Pong, on the host of --server");
  cmd.add_option("--secret-file", t.secret_file,
                 "file with the admin secret (control or read-only); default: "
                 "$TROUPE_ADMIN_SECRET, else the one the server left for this user");
  cmd.add_option("--admin-timeout-ms", t.timeout_ms,
                 "give up after this long (the ping, then each admin call); a gone server "
                 "never hangs the command")
      ->default_val(default_timeout_ms)
      ->check(CLI::Range(1, 1 << 30));
}

admin_link::admin_link(admin_target t) : target_(std::move(t)) {}
admin_link::~admin_link() = default;

bool admin_link::connected() const {
  return impl_ && impl_->sock;
}

std::string admin_link::where() const {
  return impl_ ? impl_->at.host + ":" + std::to_string(impl_->at.port) : std::string();
}

bool admin_link::connect() {
  impl_.reset();
  auto p = std::make_unique<impl>();
  if (!target_.admin.empty()) {
    try {
      p->at = parse_admin(target_.admin);
    } catch (const std::exception& e) {
      why_ = e.what();
      return false;
    }
  } else {
    client::connection conn(target_.server);
    auto pong = conn.pong(std::chrono::milliseconds(target_.timeout_ms));
    if (!pong) {
      why_ = "no answer from " + target_.server + " within " + std::to_string(target_.timeout_ms) +
             " ms (is troupe serve running?)";
      return false;
    }
    if (pong->admin_port() == 0 || pong->admin_port() > 65535) {
      why_ = "the server at " + target_.server +
             " has no admin endpoint (started with --admin-port -1); start it with --admin-port "
             "0 or a port, or give --admin HOST:PORT";
      return false;
    }
    p->at = {client::endpoint_host(target_.server), static_cast<int>(pong->admin_port())};
  }
  const std::string where = p->at.host + ":" + std::to_string(p->at.port);
  if (auto why = reachable(p->at, target_.timeout_ms); !why.empty()) {
    why_ = "cannot reach the admin endpoint at " + where + ": " + why;
    return false;
  }
  p->open();
  impl_ = std::move(p);
  why_.clear();
  return true;
}

admin_reply admin_link::call(const std::string& command, nlohmann::json args, int wait_ms) {
  const int timeout_ms = std::max(wait_ms, target_.timeout_ms);
  admin_reply out;
  if (!connected() && !connect()) {
    out.code = "unreachable";
    out.message = why_;
    return out;
  }
  // The secret: --secret-file, $TROUPE_ADMIN_SECRET, else what the server
  // left in the run folder for this port (control first, then read-only
  // for read commands).
  std::string secret;
  if (!target_.secret_file.empty()) {
    try {
      secret = read_secret_file(target_.secret_file);
    } catch (const std::exception& e) {
      out.code = "secret";
      out.message = e.what();
      return out;
    }
  } else if (const char* env = std::getenv("TROUPE_ADMIN_SECRET"); env && *env) {
    secret = env;
  } else {
    std::vector<std::string> kinds = {"admin"};
    if (admin_command_is_read_only(command)) kinds.push_back("admin-read");
    for (const auto& kind : kinds) try {
        secret = read_secret_file(run_secret_path(kind, impl_->at.port));
        break;
      } catch (const std::exception&) {
      }
  }
  args["command"] = command;
  args["secret"] = secret;
  const std::string body = args.dump();
  auto& sock = *impl_->sock;
  sock.send(zmq::buffer(body), zmq::send_flags::none);
  zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
  zmq::message_t msg;
  if (!(items[0].revents & ZMQ_POLLIN) || !sock.recv(msg, zmq::recv_flags::dontwait)) {
    // A late reply must not answer the next call: start a fresh socket.
    impl_->open();
    out.code = "timeout";
    out.message = "no answer from the admin endpoint at " + where() + " within " +
                  std::to_string(timeout_ms) + " ms";
    return out;
  }
  auto reply = nlohmann::json::parse(msg.to_string(), nullptr, false);
  if (reply.is_discarded() || !reply.is_object() || !reply.contains("ok")) {
    out.code = "protocol";
    out.message = where() + " does not answer like a troupe admin endpoint";
    return out;
  }
  if (!reply["ok"].get<bool>()) {
    const auto& e = reply["error"];
    out.code = e.value("code", "?");
    out.message = e.value("message", "");
    return out;
  }
  out.ok = true;
  out.result = std::move(reply["result"]);
  return out;
}

}  // namespace troupe::cli
