#pragma once
// Every actor interface of troupe, in one place, so the system's protocol
// surface reads at a glance (one header per protocol, included here).
#include "messages/admin.hpp"
#include "messages/device.hpp"
#include "messages/dp_group.hpp"
#include "messages/encoder.hpp"
#include "messages/expert_controller.hpp"
#include "messages/instance.hpp"
#include "messages/kv_pool.hpp"
#include "messages/monitor.hpp"
#include "messages/node.hpp"
#include "messages/router.hpp"

namespace troupe {

// Every user type that crosses an actor boundary, with its registered
// name: `f.template operator()<T>(name)` for each.  One list serves the
// registration below and the test that round-trips every type
// (tests/unit/test_message_types.cpp), so a type cannot be registered
// without being tested.
template <class F>
void for_each_message_type(F&& f) {
  f.template operator()<forward_seq>("troupe.forward_seq");
  f.template operator()<std::vector<forward_seq>>("troupe.forward_seqs");
  f.template operator()<presample_row>("troupe.presample_row");
  f.template operator()<placeholder_row>("troupe.placeholder_row");
  f.template operator()<forward_batch>("troupe.forward_batch");
  f.template operator()<forward_result>("troupe.forward_result");
  f.template operator()<device_info>("troupe.device_info");
  f.template operator()<head_op>("troupe.head_op");
  f.template operator()<head_answer>("troupe.head_answer");
  f.template operator()<expert_stats>("troupe.expert_stats");
  f.template operator()<expert_plan>("troupe.expert_plan");
  f.template operator()<layer_experts>("troupe.layer_experts");
  f.template operator()<std::vector<layer_experts>>("troupe.layer_experts_list");
  f.template operator()<expert_layer_status>("troupe.expert_layer_status");
  f.template operator()<expert_status>("troupe.expert_status");
  f.template operator()<std::vector<int32_t>>("troupe.int32s");
  f.template operator()<pool_stats>("troupe.pool_stats");
  f.template operator()<kv_page>("troupe.kv_page");
  f.template operator()<std::vector<kv_page>>("troupe.kv_pages");
  f.template operator()<tier_stats>("troupe.tier_stats");
  f.template operator()<std::vector<tier_stats>>("troupe.tier_stats_list");
  f.template operator()<kv_store_stats>("troupe.kv_store_stats");
  f.template operator()<std::vector<uint8_t>>("troupe.bytes");
  f.template operator()<prompt_embeds>("troupe.prompt_embeds");
  f.template operator()<std::vector<prompt_embeds>>("troupe.prompt_embeds_list");
  f.template operator()<sequence_request>("troupe.sequence_request");
  f.template operator()<kv_receiver_actor>("troupe.kv_receiver_actor");
  f.template operator()<encoder_actor>("troupe.encoder_actor");
  f.template operator()<token_batch>("troupe.token_batch");
  f.template operator()<step_timing>("troupe.step_timing");
  f.template operator()<std::vector<step_timing>>("troupe.step_timings");
  f.template operator()<instance_stats>("troupe.instance_stats");
  f.template operator()<request_trace>("troupe.request_trace");
  f.template operator()<std::vector<request_trace>>("troupe.request_traces");
  f.template operator()<inflight_request>("troupe.inflight_request");
  f.template operator()<std::vector<inflight_request>>("troupe.inflight_requests");
  f.template operator()<instance_info>("troupe.instance_info");
  f.template operator()<std::vector<instance_info>>("troupe.instance_infos");
  f.template operator()<std::vector<uint64_t>>("troupe.uint64s");
  f.template operator()<instance_spec>("troupe.instance_spec");
  f.template operator()<std::vector<instance_spec>>("troupe.instance_specs");
  f.template operator()<stage_spec>("troupe.stage_spec");
  f.template operator()<hosted_instance>("troupe.hosted_instance");
  f.template operator()<std::vector<hosted_instance>>("troupe.hosted_instances");
  f.template operator()<node_resources>("troupe.node_resources");
  f.template operator()<link_status>("troupe.link_status");
  f.template operator()<node_link_actor>("troupe.node_link_actor");
  f.template operator()<device_actor>("troupe.device_actor");
  f.template operator()<std::vector<link_status>>("troupe.link_statuses");
  f.template operator()<router_instance>("troupe.router_instance");
  f.template operator()<std::vector<router_instance>>("troupe.router_instances");
  f.template operator()<placement_reply>("troupe.placement_reply");
  f.template operator()<instance_window>("troupe.instance_window");
  f.template operator()<std::vector<instance_window>>("troupe.instance_windows");
  f.template operator()<monitor_report>("troupe.monitor_report");
  f.template operator()<sequence_load>("troupe.sequence_load");
  f.template operator()<std::vector<sequence_load>>("troupe.sequence_loads");
  f.template operator()<sequences_report>("troupe.sequences_report");
  f.template operator()<dp_group_config>("troupe.dp_group_config");
  f.template operator()<dp_replica_status>("troupe.dp_replica_status");
  f.template operator()<dp_group_status>("troupe.dp_group_status");
}

// Registers them all, so sends work between nodes too (CAF 0.17 needs
// this for serialization).
template <class Config>
void register_message_types(Config& cfg) {
  for_each_message_type(
      [&cfg]<class T>(const char* name) { cfg.template add_message_type<T>(name); });
}

}  // namespace troupe
