#pragma once
// The service's nodes (issue 37): one node link per `troupe node` the
// service uses, whether named at start (--nodes, [[cluster.node]]), joined
// through the registry (--registry), or added by hand (`node add`).  It
// starts and stops the links, keeps every link's peer list current, and
// turns the registry's view into joins and removals
// (runtime/service/membership: diff_membership).  A removal drains the
// node's instances (their sequences move elsewhere), releases them on the
// node, stops the link and drops the node from the router.
#include <string>
#include <vector>

#include "messages/node.hpp"
#include "messages/router.hpp"
#include "runtime/service/pd_policy.hpp"

namespace troupe {

struct node_set_options {
  std::string service_id;
  std::string model_fingerprint;
  router_actor router;
  instance_spec base;                // a joined node's instances: copies of this
  bool pd = false;                   // roles continue the instances' order
  std::vector<instance_role> roles;  // service.roles
  bool mixed_start = false;          // beyond them: mixed (role switching through M)
  int32_t next_role = 0;             // the local instances came first
  // Whether its instances may be shared with other services (actors/node):
  // not with PD, a dp group or an expert controller, which set state on an
  // instance that is one service's.
  bool share = true;
};

node_set_actor spawn_node_set(caf::actor_system& sys, node_set_options opts);

}  // namespace troupe
