#pragma once
// The router protocol (docs/architecture.md §2 "The actors", issue 10): the
// registry of a service's instances, where each request goes
// (runtime/service/placement), and the instances' states.  Request actors ask it for
// a placement; admin for the registry; drain takes an instance out of
// placement.
#include <caf/all.hpp>
#include <string>
#include <vector>
#include "messages/atoms.hpp"

#include "messages/instance.hpp"
#include "messages/node.hpp"

namespace troupe {

// One instance as the router knows it.
struct router_instance {
  uint64_t id = 0;
  std::string node = "local";  // where it runs
  std::string role = "mixed";
  std::string state = "serving";  // serving, draining, down
  instance_actor actor;
  std::string pool = "M";  // disaggregation: M, P, D, P->D, D->P (runtime/service/pd_policy)
  kv_pool_actor store;     // its process's KV store (null: none)
  device_actor device;     // its device (a pipeline's layer moves go there; null: unknown)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, router_instance& x) {
  return f(caf::meta::type_name("router_instance"), x.id, x.node, x.role, x.state, x.actor, x.pool,
           x.store, x.device);
}

// Where a request goes, and why (for its trace).
struct placement_reply {
  uint64_t instance = 0;
  instance_actor actor;
  std::string why;
  // Disaggregation: the instance only prefills; after the first token the
  // request asks for a decode placement and moves its KV there.
  bool prefill_only = false;
  double predicted_ttft_ms = 0;  // 0: no prediction (the model has no sample yet)
  // The KV store: other nodes' kv_pools holding more of the prompt than
  // this instance's arena and store, worth pulling from (in order); and
  // where the request keeps copies of its KV (recovery), null: none.
  std::vector<kv_pool_actor> kv_sources;
  kv_pool_actor kv_copy_to;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_reply& x) {
  return f(caf::meta::type_name("placement_reply"), x.instance, x.actor, x.why, x.prefill_only,
           x.predicted_ttft_ms, x.kv_sources, x.kv_copy_to);
}

// place:    (prompt tokens, the prompt's full-page hashes, preferred
//           instance) an instance for a new request, by the service's
//           policy; an error when no instance is serving.  The preferred
//           instance (0: none), where serving and taking prefill, is taken
//           instead (hybrid EPD's EP-D: prefill where the images were
//           encoded).
// lookup:   (instance id) that instance, for a migration; an error when it
//           is unknown or not serving.
// registry: every instance with its node, role and state.
// draininst: (instance id) no new placements on it; its sequences move to
//           other instances (router_options::drain_migrates) or finish
//           there; replies once it holds no sequence, with its id.
// killinst: (instance id) fault injection: the instance actor is killed
//           as a crash would; its requests recover elsewhere.  Replies
//           with the id.
// addinst:  (node, instances) a node link's instances, up now: new ones
//           get fresh ids, a slot seen before (the node came back) gets its
//           old id and serves again.  Replies with the ids, slot order.
// nodes:    (status) a node link's news; () every node's last status.
// tick:     its own timer: refresh the instances' load snapshots.
// placedec: (prefill instance, context tokens) where a disaggregated
//           request decodes after its prefill (runtime/service/pd_policy).
// placeenc: (images) hybrid EPD (router_options::epd): the instance whose
//           encoder takes a request's images, and why
//           (runtime/service/epd_policy place_encode); an error when none
//           serves.  The router counts them waiting there until
// encoded:  (instance id, images) the request's images are done there
//           (encoded or failed).
// setrole:  (instance id, prefill|decode|mixed|encode) the instance takes the role
//           now (pool X->Y: new work of the new role at once, its old work
//           finishing); replies with what changed once the instance agreed.
// movelayers: (instance id, from, to, layers) its pipelined device moves
//           layers between two neighbouring stages (the device's
//           movelayers); replies with what moved.
// moveheads: (instance id, from, to, heads) its pipelined device moves the
//           attention of a group of KV heads of stage `from` to stage `to`
//           (0 heads: home again; the device's moveheads).
// instforget: (id) the instance was stopped on purpose (autoscaling).
// nodeforget: (address) the node left the service (actors/node_set): its
//           status and its instances leave the registry.
// window:   its own timer: the monitor's window, and role switching.
using router_actor = caf::typed_actor<
    caf::reacts_to<nodes_atom, link_status>,
    caf::replies_to<nodes_atom>::with<std::vector<link_status>>,
    caf::reacts_to<forget_node_atom, std::string>, caf::reacts_to<forget_instance_atom, uint64_t>,
    caf::replies_to<add_instances_atom, std::string,
                    std::vector<hosted_instance>>::with<std::vector<uint64_t>>,
    caf::replies_to<place_atom, int32_t, std::vector<uint64_t>, uint64_t>::with<placement_reply>,
    caf::replies_to<place_encode_atom, int32_t>::with<uint64_t, std::string>,
    caf::reacts_to<encoded_atom, uint64_t, int32_t>,
    caf::replies_to<lookup_atom, uint64_t>::with<placement_reply>,
    caf::replies_to<registry_atom>::with<std::vector<router_instance>>,
    caf::replies_to<drain_instance_atom, uint64_t>::with<uint64_t>,
    caf::replies_to<kill_instance_atom, uint64_t>::with<uint64_t>, caf::reacts_to<tick_atom>,
    caf::reacts_to<window_atom>,
    caf::replies_to<place_decode_atom, uint64_t, int32_t>::with<placement_reply>,
    caf::replies_to<set_role_atom, uint64_t, std::string>::with<std::string>,
    caf::replies_to<set_atom, std::string, std::string>::with<std::string>,
    caf::replies_to<move_layers_atom, uint64_t, int32_t, int32_t, int32_t>::with<std::string>,
    caf::replies_to<move_heads_atom, uint64_t, int32_t, int32_t, int32_t>::with<std::string>>;

}  // namespace troupe
