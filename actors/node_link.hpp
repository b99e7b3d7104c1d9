#pragma once
// A node link (issue 10): the service's side of one `troupe node`.  It
// connects over the cluster's TLS middleman, asks the node to host this
// service's instances (messages/node.hpp), checks they serve the service's
// model, and hands them to the router.  It watches the node: when the node
// is lost (its connection closes, or CAF's heartbeat times out) the router
// and the request actors see the instances go down by themselves; the link
// reconnects after `retry`, backing off to 5 s while the node stays away,
// and when the node is back its instances serve again under their old ids.  When the node says it
// is leaving, the link drains its instances (their sequences move elsewhere).
#include <chrono>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/node.hpp"
#include "messages/router.hpp"

namespace troupe {

struct node_link_options {
  std::string host;
  uint16_t port = 0;
  std::string service_id;  // which service asks (the node keeps instances per service)
  std::vector<instance_spec> specs;
  std::string model_fingerprint;  // the service's model: instances must match it
  router_actor router;
  // Every node of the service: the node connects directly to those whose
  // address sorts before its own (one connection per pair), for KV
  // transfers.
  std::vector<std::string> peers;
  std::chrono::milliseconds retry{1000};
  std::chrono::seconds host_timeout{600};  // loading models on the node
  std::string address() const { return host + ":" + std::to_string(port); }
};

// status:  what it knows now.
// settled: the same, once the first attempt has an outcome (for start-up).
// peers:   (addresses) the service's nodes changed (one joined or left).
// shrink:  its last instance drains (requests move elsewhere), stops on
//          the node and leaves the router; one always stays.  Replies with
//          its id.
// detach:  the node leaves this service: the link asks it to release the
//          service's instances (drain them first), stops retrying and
//          quits; replies true when the node heard it.
using node_link_full_actor = node_link_actor::extend<
    caf::replies_to<status_atom>::with<link_status>,
    caf::replies_to<settled_atom>::with<link_status>, caf::reacts_to<connect_now_atom>,
    caf::reacts_to<tick_atom>, caf::replies_to<grow_atom, int32_t>::with<std::vector<uint64_t>>,
    caf::reacts_to<peers_atom, std::vector<std::string>>, caf::replies_to<detach_atom>::with<bool>,
    caf::replies_to<shrink_atom>::with<uint64_t>>;

node_link_full_actor spawn_node_link(caf::actor_system& sys, node_link_options opts);

}  // namespace troupe
