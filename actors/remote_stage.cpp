#include "actors/remote_stage.hpp"

#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/config/settings.hpp"

namespace troupe {

device_actor spawn_remote_stage(caf::actor_system& sys, const std::string& address,
                                const stage_spec& spec) {
  const std::string what = "pipeline stage of layers " + std::to_string(spec.layer_first) + ".." +
                           std::to_string(spec.layer_end - 1) + " on node " + address;
  if (auto why = check_node_address(address); !why.empty())
    throw std::runtime_error(what + ": " + why);
  // Nodes speak only the cluster's TLS (net/cluster_tls.hpp): a process
  // without the secret cannot reach one.
  if (!sys.has_openssl_manager())
    throw std::runtime_error(what +
                             ": stages on troupe nodes need the cluster's secret "
                             "(cluster.secret_file), and this process has none");
  const auto colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  const auto port = static_cast<uint16_t>(std::stoi(address.substr(colon + 1)));
  caf::scoped_actor self{sys};
  std::string error;
  node_actor node;
  // A connect can time out for a moment on a busy host: BASP drops a peer
  // that has been silent for cluster.connection_timeout_ms, and a node
  // still loading its model may be silent that long during the handshake.
  // Such timeouts are tried again until 10 s have passed in all; any other
  // answer (a refusal, a failed handshake, no such host) is final.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int attempt = 1;; ++attempt) {
    error.clear();
    bool timed_out = false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    self->request(sys.openssl_manager().actor_handle(),
                  std::max(left, std::chrono::milliseconds(500)), caf::connect_atom::value, host,
                  port)
        .receive(
            [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
              if (ptr)
                node = caf::actor_cast<node_actor>(ptr);
              else
                error = "it publishes no node actor at that port";
            },
            [&](caf::error& e) {
              error =
                  "cannot connect: " + sys.render(e) + " (attempt " + std::to_string(attempt) + ")";
              timed_out = e == caf::sec::connection_timeout || e == caf::sec::request_timeout;
            });
    if (!timed_out || std::chrono::steady_clock::now() + std::chrono::milliseconds(500) >= deadline)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  if (!error.empty()) throw std::runtime_error(what + ": " + error);
  device_actor stage;
  // Loading a stage reads its layers from the node's disk: minutes at most.
  self->request(node, std::chrono::minutes(10), spawn_stage_atom::value, spec)
      .receive([&](device_actor& d) { stage = std::move(d); },
               [&](caf::error& e) { error = sys.render(e); });
  if (!error.empty()) throw std::runtime_error(what + ": " + error);
  if (!stage) throw std::runtime_error(what + ": the node answered no stage");
  return stage;
}

}  // namespace troupe
