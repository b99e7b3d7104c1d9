#pragma once
// A cluster's membership as the registry holds it (issue 37): the record a
// node keeps in etcd, and the plain policy that turns what a service reads
// there into nodes to join and nodes to drop.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/service/cluster_state.hpp"

namespace troupe {

// What a node says of itself in the registry: where it listens, how many
// instances it hosts for each service that finds it there, its resources.
// Never a secret.
struct node_record {
  std::string address;  // HOST:PORT of its node actor
  int32_t instances = 1;
  int32_t cores = 0;
  int64_t mem_total = 0;
  std::vector<std::string> devices;  // OpenCL devices, as the node names them
  node_load load;                    // as of its last renewal (runtime/service/cluster_state)
};

std::string to_registry_value(const node_record& r);
// The record in `value`, or nullopt with `why` set when it is not one
// (a foreign or broken key: skipped, never fatal).
std::optional<node_record> parse_registry_value(const std::string& value, std::string* why);

struct membership_change {
  std::vector<node_record> join;   // registered now, not in the service yet
  std::vector<std::string> leave;  // joined through the registry, no longer registered
};

// `joined`: the nodes the service took from the registry; `fixed`: those it
// was started with (--nodes; never dropped by the registry, never joined
// twice); `registered`: the records etcd holds now.
membership_change diff_membership(const std::set<std::string>& joined,
                                  const std::set<std::string>& fixed,
                                  const std::vector<node_record>& registered);

}  // namespace troupe
