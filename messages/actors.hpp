#pragma once
// Every actor interface of troupe, in one place, so the system's protocol
// surface reads at a glance (one header per protocol, included here).
#include "messages/admin.hpp"
#include "messages/device.hpp"
#include "messages/instance.hpp"
#include "messages/kv_pool.hpp"
#include "messages/node.hpp"
#include "messages/router.hpp"

namespace troupe {

// Registers every user type that crosses an actor boundary, so sends work
// between nodes too (CAF 0.17 needs this for serialization).
template <class Config>
void register_message_types(Config& cfg) {
  cfg.template add_message_type<forward_seq>("troupe.forward_seq");
  cfg.template add_message_type<std::vector<forward_seq>>("troupe.forward_seqs");
  cfg.template add_message_type<forward_batch>("troupe.forward_batch");
  cfg.template add_message_type<forward_result>("troupe.forward_result");
  cfg.template add_message_type<device_info>("troupe.device_info");
  cfg.template add_message_type<std::vector<int32_t>>("troupe.int32s");
  cfg.template add_message_type<alloc_request>("troupe.alloc_request");
  cfg.template add_message_type<page_copy>("troupe.page_copy");
  cfg.template add_message_type<seq_pages>("troupe.seq_pages");
  cfg.template add_message_type<step_allocation>("troupe.step_allocation");
  cfg.template add_message_type<prefix_match>("troupe.prefix_match");
  cfg.template add_message_type<pool_stats>("troupe.pool_stats");
  cfg.template add_message_type<std::vector<uint8_t>>("troupe.bytes");
  cfg.template add_message_type<sequence_request>("troupe.sequence_request");
  cfg.template add_message_type<token_batch>("troupe.token_batch");
  cfg.template add_message_type<instance_stats>("troupe.instance_stats");
  cfg.template add_message_type<request_trace>("troupe.request_trace");
  cfg.template add_message_type<std::vector<request_trace>>("troupe.request_traces");
  cfg.template add_message_type<inflight_request>("troupe.inflight_request");
  cfg.template add_message_type<std::vector<inflight_request>>("troupe.inflight_requests");
  cfg.template add_message_type<instance_info>("troupe.instance_info");
  cfg.template add_message_type<std::vector<instance_info>>("troupe.instance_infos");
  cfg.template add_message_type<std::vector<uint64_t>>("troupe.uint64s");
  cfg.template add_message_type<instance_spec>("troupe.instance_spec");
  cfg.template add_message_type<std::vector<instance_spec>>("troupe.instance_specs");
  cfg.template add_message_type<hosted_instance>("troupe.hosted_instance");
  cfg.template add_message_type<std::vector<hosted_instance>>("troupe.hosted_instances");
  cfg.template add_message_type<node_resources>("troupe.node_resources");
  cfg.template add_message_type<link_status>("troupe.link_status");
  cfg.template add_message_type<node_link_actor>("troupe.node_link_actor");
  cfg.template add_message_type<std::vector<link_status>>("troupe.link_statuses");
  cfg.template add_message_type<router_instance>("troupe.router_instance");
  cfg.template add_message_type<std::vector<router_instance>>("troupe.router_instances");
  cfg.template add_message_type<placement_reply>("troupe.placement_reply");
}

}  // namespace troupe
