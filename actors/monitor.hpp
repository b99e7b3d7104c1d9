#pragma once
// The monitor actor (docs/architecture.md §2 "The actors", issue 11 item 3):
// one per service, a thin shell over runtime/service/service_monitor with the
// service's clock.
#include "messages/monitor.hpp"

namespace troupe {

monitor_actor spawn_monitor(caf::actor_system& sys, double window_s);

}  // namespace troupe
