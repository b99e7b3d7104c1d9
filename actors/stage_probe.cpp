#include "actors/stage_probe.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

namespace troupe {

stage_probe probe_stage(caf::actor_system& sys, const device_actor& stage, int32_t layers,
                        int32_t n_embd, bool takes_tokens, int reps) {
  caf::scoped_actor self{sys};
  std::string error;
  auto fail = [&](caf::error& e) { error = sys.render(e); };
  stage_probe p;
  double pass_ms = std::numeric_limits<double>::infinity();
  double trip_s = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, reps) && error.empty(); ++i) {
    forward_batch b;
    b.tokens = {0};
    b.positions = {0};
    b.seqs = {forward_seq{0, 1, {0}}};
    if (!takes_tokens) b.stage_input.assign(static_cast<size_t>(n_embd), 0.0f);
    self->request(stage, std::chrono::seconds(60), forward_atom::value, std::move(b))
        .receive([&](forward_result& r) { pass_ms = std::min(pass_ms, r.device_ms); }, fail);
    const auto sent = std::chrono::steady_clock::now();
    self->request(stage, std::chrono::seconds(60), info_atom::value)
        .receive(
            [&](device_info& d) {
              trip_s = std::min(
                  trip_s,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
              p.memory_bytes = d.memory_bytes;
            },
            fail);
  }
  if (!error.empty()) throw std::runtime_error("probing a pipeline stage: " + error);
  p.seconds_per_layer = pass_ms / 1000.0 / std::max(1, layers);
  p.round_trip_s = trip_s;
  return p;
}

}  // namespace troupe
