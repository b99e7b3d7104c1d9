#include "actors/admin_groups.hpp"

#include "messages/admin.hpp"

#include <string>

namespace troupe {

using json = nlohmann::json;

json to_json(const dp_group_status& s) {
  json replicas = json::array();
  for (const auto& r : s.replicas)
    replicas.push_back({{"instance", r.instance},
                        {"state", r.state},
                        {"capacity_tokens", r.capacity_tokens},
                        {"kv_tokens", r.kv_tokens},
                        {"sequences", r.sequences},
                        {"admitted", r.admitted},
                        {"moved_in", r.moved_in},
                        {"moved_out", r.moved_out},
                        {"step_ms", r.step_ms},
                        {"wait_ms", r.wait_ms},
                        {"dummy_steps", r.dummy_steps}});
  const auto& c = s.config;
  return {{"replicas", replicas},
          {"config",
           {{"interval_ms", c.interval_ms},
            {"gap_share", c.gap_share},
            {"max_moves", c.max_moves},
            {"min_left", c.min_left},
            {"patience", c.patience},
            {"rebalance", c.rebalance},
            {"lockstep", c.lockstep}}},
          {"gap_over_mean", s.gap_over_mean},
          {"mean_gap_over_mean", s.mean_gap_over_mean},
          {"max_gap_tokens", s.max_gap_tokens},
          {"checks", s.checks},
          {"loaded_checks", s.loaded_checks},
          {"rebalances", s.rebalances},
          {"migrations", s.migrations},
          {"failed_migrations", s.failed_migrations},
          {"migrated_tokens", s.migrated_tokens},
          {"rounds", s.rounds},
          {"round_ms", s.round_ms},
          {"straggler_ms", s.straggler_ms},
          {"last_decision", s.last_decision}};
}

json to_json(const expert_status& s) {
  json layers = json::array();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& x = s.layers[l];
    layers.push_back({{"layer", l},
                      {"tokens", x.tokens},
                      {"device_load", x.device_load},
                      {"imbalance", x.imbalance},
                      {"placement", x.layout}});
  }
  return {{"devices", s.devices},
          {"engines", s.engines},
          {"layers", layers},
          {"busy_s", s.busy_s},
          {"epoch", s.epoch},
          {"swaps", s.swaps},
          {"aborted", s.aborted},
          {"last_before", s.last_before},
          {"last_after", s.last_after},
          {"phase", s.phase},
          {"engine_epochs", s.engine_epochs},
          {"aligned", s.aligned}};
}

void record_dp_group(metrics_registry& m, const dp_group_status& s) {
  m.gauge_set("troupe_dp_gap_over_mean",
              "DP group: (max - min) KV tokens over the mean, at the last check", {},
              s.gap_over_mean);
  m.gauge_set("troupe_dp_mean_gap_over_mean",
              "DP group: the gap over the mean, averaged over the checks that found load", {},
              s.mean_gap_over_mean);
  m.counter_set("troupe_dp_migrations_total", "DP group: sequences moved to balance KV", {},
                static_cast<double>(s.migrations));
  m.counter_set("troupe_dp_migrated_tokens_total", "DP group: KV tokens moved", {},
                static_cast<double>(s.migrated_tokens));
  m.counter_set("troupe_dp_rounds_total", "DP group: lockstep rounds", {},
                static_cast<double>(s.rounds));
  m.counter_set("troupe_dp_straggler_seconds_total",
                "DP group: per lockstep round, the slowest replica's step minus the mean step", {},
                s.straggler_ms / 1000);
  for (const auto& r : s.replicas) {
    const metric_labels l{{"instance", instance_name(r.instance)}};
    m.gauge_set("troupe_dp_kv_tokens", "DP group: KV tokens a replica holds (last check)", l,
                static_cast<double>(r.kv_tokens));
    m.counter_set("troupe_dp_wait_seconds_total",
                  "DP group: time a replica waited for its round's slowest step", l,
                  r.wait_ms / 1000);
    m.counter_set("troupe_dp_dummy_steps_total", "DP group: dummy steps of an idle replica", l,
                  static_cast<double>(r.dummy_steps));
  }
}

void record_experts(metrics_registry& m, const expert_status& s) {
  m.counter_set("troupe_expert_swaps_total", "Expert placements swapped in (two-phase commits)", {},
                static_cast<double>(s.swaps));
  m.counter_set("troupe_expert_swaps_aborted_total", "Expert swaps given up", {},
                static_cast<double>(s.aborted));
  for (size_t l = 0; l < s.layers.size(); ++l)
    m.gauge_set("troupe_expert_imbalance",
                "Tokens per expert device, max over mean, since the last swap",
                {{"layer", std::to_string(l)}}, s.layers[l].imbalance);
  for (size_t d = 0; d < s.busy_s.size(); ++d)
    m.counter_set("troupe_expert_device_busy_seconds_total",
                  "Kernel time of each expert device (summed over engines)",
                  {{"device", std::to_string(d)}}, s.busy_s[d]);
}

}  // namespace troupe
