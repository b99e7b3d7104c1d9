#pragma once
// The node protocol (docs/architecture.md §2 "The actors",
// §2.2 "Processes, threads and boundaries"; issue 10): a `troupe node`
// process hosts engine instances for services.  A service's node link asks it
// to host instances built from plain, serializable specs; the node spawns
// each one (device actor + instance actor) and hands back their handles,
// which the service then uses exactly as local ones.  Everything here crosses
// processes, over CAF's middleman on the cluster's TLS.
#include <caf/all.hpp>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/device.hpp"
#include "messages/instance.hpp"
#include "runtime/config/settings.hpp"
#include "runtime/service/cluster_state.hpp"

namespace troupe {

// What a node needs to build one engine instance.  Paths and names are as the
// node sees them; no pointer, no open file (docs/architecture.md
// §2.2 "Processes, threads and boundaries").
struct instance_spec {
  // The service's [engine] settings, with the node's overrides
  // ([[cluster.node]]): resolved where the service started, so the node's
  // own environment does not change them.
  engine_settings engine;
  std::string role = "mixed";  // reported by the instance (the router decides its work)
  int32_t cores = 0;           // > 0: a slice of the device with this many cores (device_choice)
  int32_t slice = 0;           // which slice
  double tpot_target_ms = 0;   // service.tpot_target_ms: co-location's TPOT guard
  // Empty: any service asking for the same spec in the same slot shares the
  // instance.  A service id: that service's alone (it sets state on the
  // instance that is one service's: PD roles, a dp group's lockstep, an
  // expert controller's swaps).
  std::string owner;
};

// Every [engine] field of the schema, in its order (generated from
// runtime/config/settings.def, so a new engine setting travels with no
// edit here).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_settings& x) {
#define TROUPE_INSPECT_IN_engine(key) , x.key
#define TROUPE_INSPECT_IN_service(key)
#define TROUPE_INSPECT_IN_cluster(key)
#define TROUPE_SETTING(section, key, ...) TROUPE_INSPECT_IN_##section(key)
  return f(caf::meta::type_name("engine_settings")
#include "runtime/config/settings.def"
  );
#undef TROUPE_INSPECT_IN_engine
#undef TROUPE_INSPECT_IN_service
#undef TROUPE_INSPECT_IN_cluster
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, instance_spec& x) {
  return f(caf::meta::type_name("instance_spec"), x.engine, x.role, x.cores, x.slice,
           x.tpot_target_ms, x.owner);
}

// One pipeline stage a node runs for a pipelined device elsewhere (issue
// 35): a device actor over the model's layers [layer_first, layer_end)
// with `n_pages` pages of its layers' KV, on the node's device (the
// engine's platform and device, whole).  It lives as long as the pipeline
// that asked for it (linked to it) or the node.
struct stage_spec {
  engine_settings engine;
  int32_t layer_first = 0;
  int32_t layer_end = 0;
  int32_t n_pages = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_spec& x) {
  return f(caf::meta::type_name("stage_spec"), x.engine, x.layer_first, x.layer_end, x.n_pages);
}

// One instance a node runs for a service: its slot (the index of its spec
// in the service's request, stable across reconnects) and what its device
// holds (the service checks the model fingerprint).
struct hosted_instance {
  int32_t slot = 0;
  instance_actor actor;
  device_info info;
  device_actor device;  // its device actor: the expert controller reads and swaps experts there
  kv_pool_actor store;  // its process's KV store (null: none): where others pull its pages from
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hosted_instance& x) {
  return f(caf::meta::type_name("hosted_instance"), x.slot, x.actor, x.info, x.device, x.store);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_load& x) {
  return f(caf::meta::type_name("node_load"), x.instances, x.running, x.waiting, x.used_pages,
           x.total_pages, x.kv_host_pages, x.kv_disk_pages, x.kv_hits, x.kv_misses);
}

// What a node has to offer.
struct node_resources {
  std::string host;        // its hostname
  int32_t cores = 0;       // online CPUs
  uint64_t mem_total = 0;  // bytes
  uint64_t mem_available = 0;
  std::vector<std::string> opencl_devices;  // "platform/device: name"
  int32_t instances = 0;                    // hosted now, for all services
  // Other nodes it connected to directly (peers; one of each pair
  // connects): KV moves between them without passing through a service
  // process.
  std::vector<std::string> peers;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_resources& x) {
  return f(caf::meta::type_name("node_resources"), x.host, x.cores, x.mem_total, x.mem_available,
           x.opencl_devices, x.instances, x.peers);
}

// A node as the service's link to it knows it (admin `nodes`).
struct link_status {
  std::string address;
  std::string state;  // connecting, up, down, refused, leaving
  std::string error;  // why it is not up (empty when it is)
  int32_t attempts = 0;
  std::vector<uint64_t> instances;  // router ids
  node_resources resources;
  device_info info;  // of its first instance, once up
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, link_status& x) {
  return f(caf::meta::type_name("link_status"), x.address, x.state, x.error, x.attempts,
           x.instances, x.resources, x.info);
}

// The service side of one node (actors/node_link): told when the node is
// about to stop, so the service moves its sequences off first.
using node_link_actor = caf::typed_actor<caf::reacts_to<leaving_atom>>;

// The service's nodes (actors/node_set), static and joined at run time.
// nodeadd:    (address, count, specs) a node joins: a link to it starts
//             with `specs` (none: `count` copies of the service's engine);
//             replies at once with its state ("connecting").
// settled:    (address) its state once the link's first attempt ended.
// noderemove: (address) drain its instances, release them on the node,
//             stop the link, and drop it from the router; replies with
//             what was done.
// registry:   (addresses, counts) the nodes the registry holds now: joins
//             the new ones, removes those it joined that are gone.
// grow:       (address, n) the node hosts n more instances.
// shrink:     (address) its last instance drains and stops (at least one
//             stays); replies with that instance's id.
using node_set_actor =
    caf::typed_actor<caf::replies_to<node_add_atom, std::string, int32_t,
                                     std::vector<instance_spec>>::with<link_status>,
                     caf::replies_to<settled_atom, std::string>::with<link_status>,
                     caf::replies_to<node_remove_atom, std::string>::with<std::string>,
                     caf::reacts_to<registry_atom, std::vector<std::string>, std::vector<int32_t>>,
                     caf::replies_to<grow_atom, std::string, int32_t>::with<std::vector<uint64_t>>,
                     caf::replies_to<shrink_atom, std::string>::with<uint64_t>>;

// host:      (service id, link, specs) the instances this service runs on
//            the node, one per spec: the ones it runs already (a link that
//            reconnects gets the same actors back), or the one another
//            service asked for with the same spec in the same slot (shared),
//            else spawned now.  Specs it no longer names are released.  The
//            reply comes once all are up; an error names the spec that
//            failed and why (unknown model, no OpenCL device, ...).
// resources: cores, memory, OpenCL devices, instances hosted.
// spawnstage: (spec) a pipeline stage's device actor on this node, loaded
//          (the reply comes once its layers are up; an error says why not).
// peers:   (addresses) the service's other nodes: the node connects to
//          each directly (the cluster's TLS), so KV bytes between their
//          instances and stores travel node to node.
using node_actor = caf::typed_actor<
    caf::reacts_to<peers_atom, std::vector<std::string>>,
    caf::replies_to<host_atom, std::string, node_link_actor,
                    std::vector<instance_spec>>::with<std::vector<hosted_instance>>,
    caf::replies_to<resources_atom>::with<node_resources>,
    caf::replies_to<spawn_stage_atom, stage_spec>::with<device_actor>>;

// The node's one-at-a-time builder (detached: loading a model blocks).
using node_spawner_actor = caf::typed_actor<
    caf::replies_to<spawn_instance_atom, int32_t, instance_spec>::with<hosted_instance>>;

// A pipeline stage's one-off builder (detached: loading blocks).  Not the
// instance spawner: an instance it builds may wait for its stages, on this
// node or on another that waits for this one.
using stage_builder_actor =
    caf::typed_actor<caf::replies_to<spawn_stage_atom, stage_spec>::with<device_actor>>;

}  // namespace troupe
