#pragma once
// The node actor (docs/architecture.md §2 "The actors",
// §2.2 "Processes, threads and boundaries"; issue 10): one per `troupe node`
// process.  It hosts engine instances for services (messages/node.hpp):
// builds them from specs on a detached spawner, keeps them while a
// service's link using them lives (and for `reap_after` once it is gone, so
// a service that reconnects finds its instances and sequences still there),
// and tells the services when the node is about to stop.  Services that ask
// for the same spec in the same slot share one instance (issue 37): each
// router places its requests there, the instance's scheduler admits them
// all, and the instance stops once no service uses it.
//
// spawn_engine is the one way an engine is built, for `troupe serve`'s
// local instances as for a node's.
#include <chrono>
#include <memory>
#include "messages/atoms.hpp"

#include "actors/kv_pool.hpp"
#include "messages/node.hpp"
#include "runtime/model/model_file.hpp"
#include "runtime/service/cluster_state.hpp"

namespace troupe {

struct engine_handles {
  hosted_instance hosted;
  device_actor device;  // exit it after the instance
};

// Loads the model on a device and spawns the device and instance actors.
// `model` is the spec's model already open (troupe serve opens it once for
// all its local instances); null: opened here from the name in the spec.
// Blocks while the model loads (call it from a detached actor or before
// serving).  Throws with the reason when it cannot.
// `tiers` is the process's KV store (actors/kv_pool), null for none.
engine_handles spawn_engine(caf::actor_system& sys, int32_t slot, const instance_spec& spec,
                            std::shared_ptr<const model_file> model = nullptr,
                            kv_pool_actor tiers = {});

// The KV store an engine with these settings asks for (enabled() false:
// none).
kv_store_options kv_store_options_of(const engine_settings& es);

// The admission policy an engine with these settings runs under (the
// batching mode, the order, SLO-ODBS's parameters).
admission_policy admission_policy_of(const engine_settings& es);

// The scheduler limits an engine with these settings runs under (checked
// by troupe serve at start, taken by spawn_engine).
scheduler_limits limits_of(const engine_settings& es);

// A pipeline stage's device on this process's device (the node's side of
// spawnstage): the model opened by name, layers and pages as `spec` says.
// Blocks while the layers load.  Throws with the reason when it cannot.
device_actor spawn_stage_device(caf::actor_system& sys, const stage_spec& spec);

// What this machine has (cores, memory, OpenCL devices).
node_resources local_resources();

struct node_options {
  std::chrono::seconds reap_after{60};  // a lost service's instances are kept this long
};

// `stop_atom` on the node: the node is stopping; replies with the
// sequences its instances still hold.  The first call tells every service
// (leaving), which moves its sequences elsewhere; the caller polls until 0.
// `node_load_atom`: the load of every instance it hosts and its KV store,
// summed (the registry record's load, runtime/service/cluster_state).
using node_control_actor = node_actor::extend<caf::replies_to<stop_atom>::with<int32_t>,
                                              caf::replies_to<node_load_atom>::with<node_load>>;

node_control_actor spawn_node(caf::actor_system& sys, node_options opts);

}  // namespace troupe
