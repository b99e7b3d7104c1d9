#pragma once
// Every actor interface of troupe, in one place, so the system's protocol
// surface reads at a glance (one header per protocol, included here).
#include "messages/device.hpp"

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
}

}  // namespace troupe
