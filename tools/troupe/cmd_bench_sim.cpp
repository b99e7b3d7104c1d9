// troupe bench sim: the cluster simulator (sim/cluster_sim) driven by
// the load options of `troupe bench serve`, reporting the same metrics and
// the same JSON, for as many instances as wanted; the cost model comes
// from `troupe bench sim-calibrate`.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "sim/cluster_sim.hpp"
#include "tools/troupe/bench_load.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct sim_flags : load_flags {
  std::string cost_model;
  int instances = 2;
  bool pd = false;
  std::string pd_placement = "slo";
  bool role_switching = false;
  std::vector<std::string> roles;
  std::string router = "least-load";
  double ttft_target_ms = 0;
  double tpot_target_ms = 0;
  int max_batch_tokens = 256;
  int max_seqs = 64;
  int chunk_size = 128;
  bool colocate = false;
  double window_ms = 1000;
  pd_config pd_cfg;
  int kv_pages = 0;       // 0: the cost model's
  std::string autoscale;  // MIN:MAX
  autoscale_config scale;
  double start_s = 2;
  double diurnal_period_s = 0;  // > 0: a diurnal arrival rate, peak --request-rate
  double diurnal_trough = 0.1;
  bool no_prefix_caching = false;
  double kv_host_mb = 0, kv_disk_mb = 0;
  std::string kv_tier_eviction = "lru";
  bool kv_pull = false;
  double router_staleness_ms = 0;
  sim_pipeline_config pipeline;
  bool layer_migration = false;
  bool head_migration = false;
  double move_ms_per_layer = 250;
  double head_move_ms_per_layer = 15;
};

sim_config make_config(const sim_flags& f) {
  sim_config c;
  c.instances = f.instances;
  c.pd = f.pd;
  c.pd_placement = f.pd_placement;
  c.role_switching = f.role_switching;
  for (const auto& r : f.roles) {
    auto role = parse_role(r);
    if (!role) throw CLI::ValidationError("--roles", "'" + r + "' is not a role");
    c.roles.push_back(*role);
  }
  auto p = parse_placement_policy(f.router);
  if (!p) throw CLI::ValidationError("--router", "'" + f.router + "' is not a policy");
  c.mixed_policy = *p;
  c.limits = {f.max_batch_tokens, f.max_seqs, f.chunk_size, 16};
  c.limits.offline_yields = f.colocate;
  c.targets = {f.ttft_target_ms, f.tpot_target_ms};
  c.pd_cfg = f.pd_cfg;
  c.window_s = f.window_ms / 1000;
  c.cost = cost_model::load(f.cost_model);
  if (!f.autoscale.empty()) {
    c.autoscale = true;
    c.scale = f.scale;
    try {
      parse_autoscale_bounds(f.autoscale, c.scale);
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError("--autoscale", e.what());
    }
    c.start_s = f.start_s;
  }
  if (f.kv_pages > 0) c.cost.kv_pages = f.kv_pages;
  c.prefix_caching = !f.no_prefix_caching;
  c.kv_host_bytes = uint64_t(f.kv_host_mb * 1024 * 1024);
  c.kv_disk_bytes = uint64_t(f.kv_disk_mb * 1024 * 1024);
  c.tier_policy = *parse_tier_eviction(f.kv_tier_eviction);
  c.pipeline = f.pipeline;
  c.pipeline.migration = f.layer_migration;
  c.pipeline.head_migration = f.head_migration;
  c.pipeline.migration_opts.move_cost_s = f.move_ms_per_layer / 1000;
  c.pipeline.migration_opts.head_move_cost_s = f.head_move_ms_per_layer / 1000;
  c.kv_pull = f.kv_pull;
  c.router_staleness_s = f.router_staleness_ms / 1000;
  if ((c.kv_host_bytes > 0 || c.kv_disk_bytes > 0) && !c.prefix_caching)
    throw CLI::ValidationError("--kv-host-mb", "the KV store needs prefix caching");
  if (c.kv_pull && c.kv_host_bytes == 0)
    throw CLI::ValidationError("--kv-pull",
                               "pulls come from other instances' stores: give "
                               "--kv-host-mb");
  return c;
}

// The dataset as the simulator sees it: token counts (and ids, for prefix
// caching) and send times.  As bench serve sends them: only a
// conversation's first turn takes the arrival schedule; a later turn
// follows its previous one.
std::vector<sim_request> to_sim(const std::vector<bench::bench_request>& reqs,
                                const std::vector<double>& arrivals, double duration) {
  std::vector<sim_request> out;
  size_t root = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    sim_request s;
    if (r.after < 0) {
      if (root >= arrivals.size() || (duration > 0 && arrivals[root] > duration)) break;
      s.arrival = arrivals[root++];
    } else {
      s.after = r.after;
      s.think_s = r.think_s;
    }
    s.turn = r.turn;
    s.tokens = r.prompt_tokens;
    // Text prompts (jsonl) count about 4 bytes a token.
    s.prompt = r.prompt_len > 0           ? r.prompt_len
               : !r.prompt_tokens.empty() ? int32_t(r.prompt_tokens.size())
                                          : int32_t(std::max<size_t>(1, r.prompt_text.size() / 4));
    if (!s.tokens.empty()) s.prompt = int32_t(s.tokens.size());
    s.output = r.output_len > 0 ? r.output_len : 128;
    s.offline = r.offline;
    out.push_back(s);
  }
  return out;
}

struct sim_run {
  sim_result result;
  bench::metrics m;
};

sim_run run_once(const sim_flags& f, const sim_config& c, const bench::slo& goals,
                 const std::vector<bench::bench_request>& reqs, const std::vector<double>& trace,
                 double rate) {
  auto arrivals =
      !trace.empty() ? trace
      : f.diurnal_period_s > 0
          ? bench::diurnal_arrivals(reqs.size(), rate, f.diurnal_trough, f.diurnal_period_s, f.seed)
          : bench::gamma_arrivals(reqs.size(), rate, f.burstiness, f.seed);
  auto sreqs = to_sim(reqs, arrivals, f.duration);
  sim_run out;
  out.result = simulate(c, sreqs);
  double end = 0;
  for (const auto& r : out.result.records) end = std::max(end, r.end_time);
  const double start = sreqs.empty() ? 0 : sreqs.front().arrival;
  out.m = bench::compute_metrics(out.result.records, end - start, goals);
  // Token intervals from the requests that kept them all (every one in
  // runs below 4 M tokens).
  out.m.itl_ms = bench::distribution::of_seconds(out.result.itl_s);
  return out;
}

nlohmann::json stats_json(const sim_stats& s) {
  return {{"steps", s.steps},
          {"events", s.events},
          {"flips", s.flips},
          {"flip_log", s.flip_log},
          {"evacuated", s.evacuated},
          {"transfers", s.transfers},
          {"transfer_bytes", s.transfer_bytes},
          {"mean_transfer_ms", s.transfers ? s.transfer_ms_total / double(s.transfers) : 0.0},
          {"preemptions", s.preemptions},
          {"ttft_prediction_mape", s.ttft_mape},
          {"simulated_s", s.simulated_s},
          {"instance_seconds", s.instance_seconds},
          {"peak_instances", s.peak_instances},
          {"scale_ups", s.scale_ups},
          {"scale_downs", s.scale_downs},
          {"scale_log", s.scale_log},
          {"prompt_tokens", s.prompt_tokens},
          {"device_hit_tokens", s.device_hit_tokens},
          {"host_tier_tokens", s.host_hit_tokens},
          {"disk_tier_tokens", s.disk_hit_tokens},
          {"pulled_tokens", s.pulled_tokens},
          {"spilled_pages", s.spilled_pages},
          {"kv_check", s.kv_check},
          {"devices", s.devices},
          {"layer_moves", s.layer_moves},
          {"layers_moved", s.layers_moved},
          {"head_moves", s.head_moves},
          {"heads_home", s.heads_home},
          {"move_pause_ms", s.move_pause_ms},
          {"wall_s", s.wall_s}};
}

nlohmann::json sim_config_json(const sim_flags& f, const sim_config& c, size_t planned) {
  auto j = load_config_json(f, planned);
  j["instances"] = f.instances;
  j["mode"] = f.pd ? "pd" : "mixed";
  j["placement"] = f.pd ? f.pd_placement : f.router;
  j["role_switching"] = f.role_switching;
  j["roles"] = f.roles;
  j["ttft_target_ms"] = f.ttft_target_ms;
  j["tpot_target_ms"] = f.tpot_target_ms;
  j["colocate"] = f.colocate;
  j["limits"] = {{"max_batch_tokens", f.max_batch_tokens},
                 {"max_seqs", f.max_seqs},
                 {"chunk_size", f.chunk_size}};
  j["cost_model"] = c.cost.to_json();
  if (c.pipeline.stages > 1)
    j["pipeline"] = {{"stages", c.pipeline.stages},
                     {"layers", c.pipeline.layers},
                     {"classifier_layers", c.pipeline.classifier_layers},
                     {"layer_migration", c.pipeline.migration},
                     {"head_migration", c.pipeline.head_migration},
                     {"head_trip_ms", c.pipeline.trip_ms},
                     {"move_cooldown_windows", c.pipeline.migration_opts.cooldown_windows},
                     {"head_move_ms_per_layer", f.head_move_ms_per_layer},
                     {"rebalance", c.pipeline.migration_opts.threshold},
                     {"move_ms_per_layer", f.move_ms_per_layer},
                     {"load_skew", c.pipeline.load_skew},
                     {"loaded_share", c.pipeline.loaded_share},
                     {"load_shift_s", c.pipeline.load_shift_s}};
  return j;
}

void print_stats(const sim_stats& s) {
  std::printf(
      "simulated %.1f s in %.2f s wall: %llu steps, %llu events, %llu flips (%llu decoding "
      "sequences migrated off), %llu KV transfers (%.1f MB), %llu preemptions, TTFT prediction "
      "error %.1f%%\n",
      s.simulated_s, s.wall_s, static_cast<unsigned long long>(s.steps),
      static_cast<unsigned long long>(s.events), static_cast<unsigned long long>(s.flips),
      static_cast<unsigned long long>(s.evacuated), static_cast<unsigned long long>(s.transfers),
      s.transfer_bytes / 1e6, static_cast<unsigned long long>(s.preemptions), s.ttft_mape * 100);
  if (s.prompt_tokens > 0) {
    const double p = double(s.prompt_tokens) / 100;
    std::printf(
        "prefix caching: %.1f%% of prompt tokens cached in the arena; tiers served %.1f%% "
        "(host), %.1f%% (disk), pulls %.1f%%; %llu pages offered to the stores\n",
        s.device_hit_tokens / p, s.host_hit_tokens / p, s.disk_hit_tokens / p, s.pulled_tokens / p,
        static_cast<unsigned long long>(s.spilled_pages));
  }
  if (!s.kv_check.empty()) std::printf("KV page accounting: %s\n", s.kv_check.c_str());
  if (s.pipelined)
    std::printf(
        "devices: %d; layer moves %llu (%llu layers), KV-head groups moved %llu (home %llu), "
        "instances paused %.0f ms for them\n",
        s.devices, static_cast<unsigned long long>(s.layer_moves),
        static_cast<unsigned long long>(s.layers_moved),
        static_cast<unsigned long long>(s.head_moves),
        static_cast<unsigned long long>(s.heads_home), s.move_pause_ms);
  for (size_t i = 0; i < s.flip_log.size() && i < 5; ++i)
    std::printf("  flip %s\n", s.flip_log[i].c_str());
  if (s.scale_ups + s.scale_downs > 0 || s.instance_seconds > 0)
    std::printf(
        "autoscaling: %.0f instance-seconds (mean %.1f instances), peak %d, %llu started, %llu "
        "retired\n",
        s.instance_seconds, s.simulated_s > 0 ? s.instance_seconds / s.simulated_s : 0.0,
        s.peak_instances, static_cast<unsigned long long>(s.scale_ups),
        static_cast<unsigned long long>(s.scale_downs));
}

void run_sim(const sim_flags& f) {
  bench::slo goals;
  std::vector<bench::bench_request> reqs;
  std::vector<double> trace;
  try {
    goals = bench::slo::parse(f.goodput);
    if (f.sweep) bench::check_sweep(f.sweep_spec, goals);
    reqs = make_dataset(f);
    trace = send_times(f);
    bench::gamma_arrivals(1, f.sweep ? f.sweep_spec.start : f.request_rate, f.burstiness, f.seed);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError(e.what());
  }
  const auto cfg = make_config(f);
  std::fprintf(stderr, "bench sim: %d instances, %s%s, %zu requests, cost model %s\n", f.instances,
               f.pd ? ("pd " + f.pd_placement).c_str() : ("mixed " + f.router).c_str(),
               f.role_switching ? " with role switching" : "", reqs.size(), f.cost_model.c_str());
  const bool keep_records = reqs.size() <= 100000;
  if (!f.sweep) {
    auto r = run_once(f, cfg, goals, reqs, trace, f.request_rate);
    std::cout << bench::format_summary(r.m, goals) << std::flush;
    print_stats(r.result.stats);
    if (!f.json_out.empty()) {
      auto j = bench::to_json(r.m);
      j["backend"] = "sim";
      j["target"] = "simulated cluster";
      j["config"] = sim_config_json(f, cfg, r.m.requests);
      j["sim"] = stats_json(r.result.stats);
      if (keep_records) j["requests"] = records_json(r.result.records, reqs);
      write_json(f.json_out, j);
    }
    return;
  }
  std::vector<bench::metrics> metrics;
  auto probes_json = nlohmann::json::array();
  auto probes = bench::run_sweep(f.sweep_spec, [&](double rate) {
    auto r = run_once(f, cfg, goals, reqs, trace, rate);
    bench::sweep_probe p;
    p.rate = rate;
    p.goodput_fraction =
        r.m.requests ? static_cast<double>(r.m.good_completed) / r.m.requests : 0.0;
    p.pass = bench::meets_target(r.m.good_completed, r.m.requests, f.sweep_spec.target);
    std::fprintf(stderr, "sweep probe %zu: %s req/s: %.3f good: %s (%llu flips)\n",
                 metrics.size() + 1, rate_text(rate).c_str(), p.goodput_fraction,
                 p.pass ? "pass" : "fail", static_cast<unsigned long long>(r.result.stats.flips));
    auto j = bench::to_json(r.m);
    j["request_rate"] = rate;
    j["goodput_fraction"] = p.goodput_fraction;
    j["pass"] = p.pass;
    j["sim"] = stats_json(r.result.stats);
    probes_json.push_back(std::move(j));
    metrics.push_back(r.m);
    return p;
  });
  print_sweep_table(f, probes, metrics);
  if (!f.json_out.empty()) {
    nlohmann::json j;
    j["backend"] = "sim";
    j["config"] = sim_config_json(f, cfg, reqs.size());
    j["config"].erase("request_rate");
    const auto answer = bench::sweep_answer(probes);
    j["sweep"] = {{"goodput_target", f.sweep_spec.target},
                  {"goodput", f.goodput},
                  {"highest_rate", answer ? nlohmann::json(*answer) : nlohmann::json(nullptr)}};
    j["probes"] = std::move(probes_json);
    write_json(f.json_out, j);
  }
}

}  // namespace

void add_bench_sim(CLI::App& bench) {
  auto f = std::make_shared<sim_flags>();
  auto* cmd = bench.add_subcommand(
      "sim",
      "simulate a cluster of N instances running troupe's own placement, role-switching and "
      "step policies, with costs measured on the real engine (bench sim-calibrate)");
  cmd->add_option("--cost-model", f->cost_model, "the file bench sim-calibrate wrote")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--instances", f->instances, "simulated instances")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_flag("--pd", f->pd, "prefill/decode disaggregation");
  cmd->add_option("--pd-placement", f->pd_placement,
                  "with --pd: slo (xLLM: predicted TTFT, pools, decode caps), least-load or "
                  "round-robin (static pools)")
      ->check(CLI::IsMember({"slo", "least-load", "round-robin"}))
      ->capture_default_str();
  cmd->add_flag("--role-switching", f->role_switching, "with --pd slo: flip roles by the policy");
  cmd->add_option("--roles", f->roles,
                  "starting role per instance (prefill, decode, mixed); default half and half, "
                  "all mixed with --role-switching through mixed")
      ->delimiter(',');
  cmd->add_option("--router", f->router, "without --pd: round-robin, least-load, slo or load-aware")
      ->capture_default_str();
  cmd->add_option("--ttft-target-ms", f->ttft_target_ms, "online TTFT target (0: none)");
  cmd->add_option("--tpot-target-ms", f->tpot_target_ms, "online TPOT target (0: none)");
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "rows of one step")
      ->capture_default_str();
  cmd->add_option("--max-seqs", f->max_seqs, "sequences running at once")->capture_default_str();
  cmd->add_option("--chunk-size", f->chunk_size, "prefill rows per sequence and step")
      ->capture_default_str();
  cmd->add_option("--kv-pages", f->kv_pages, "KV pages per instance (default: the cost model's)");
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching,
                "compute every prompt (prefix caching needs datasets of token ids: all but "
                "text prompts)");
  cmd->add_option("--kv-host-mb", f->kv_host_mb,
                  "a KV store per instance with a host tier of this size (MiB): pages its arena "
                  "evicts go there, and prompts load them back (serve's --kv-host-mb)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--kv-disk-mb", f->kv_disk_mb,
                  "and a disk tier of this size below it (MiB; load rates: the cost model's tiers)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--kv-tier-eviction", f->kv_tier_eviction, "the tiers' policy: lru or lfu")
      ->check(CLI::IsMember({"lru", "lfu"}))
      ->capture_default_str();
  cmd->add_flag("--kv-pull", f->kv_pull,
                "a prompt's pages may come from another instance's store (the router's pull "
                "rule, at the cost model's transfer rate)");
  cmd->add_option("--router-staleness-ms", f->router_staleness_ms,
                  "the router sees the instances' loads as of a snapshot this old at most, as "
                  "the real one polls (100 ms); 0: as they are")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  cmd->add_flag("--colocate", f->colocate, "online/offline co-location in every instance");
  cmd->add_option("--window-ms", f->window_ms, "the monitor's window")->capture_default_str();
  cmd->add_option("--autoscale", f->autoscale,
                  "MIN:MAX: start with --instances, then start and retire instances by the "
                  "autoscaling policy at every window (mixed instances)");
  cmd->add_option("--autoscale-grow-load", f->scale.grow_load,
                  "start instances above this share of capacity (sequences held / max_seqs)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 10.0));
  cmd->add_option("--autoscale-shrink-load", f->scale.shrink_load,
                  "retire one below this share of capacity")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--autoscale-cooldown-s", f->scale.shrink_cooldown_s,
                  "between retirements, and after a start")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--autoscale-start-s", f->start_s,
                  "a started instance serves after this long (its model loads)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--pipeline-stages", f->pipeline.stages,
                  "pipelined instances: each instance's layers over this many devices of its own "
                  "(1: one device each)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--model-layers", f->pipeline.layers, "pipelined instances: the model's layers")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--classifier-layers", f->pipeline.classifier_layers,
                  "pipelined instances: the classifier's work on the last stage, in layers")
      ->check(CLI::Range(0.0, 100000.0))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_flag("--layer-migration", f->layer_migration,
                "pipelined instances: move layers between stages by the pipeline's own rule "
                "(BanaServe's layer migration) at every window");
  cmd->add_flag("--head-migration", f->head_migration,
                "pipelined instances: move a group of a stage's KV heads to another stage by the "
                "pipeline's own rule (BanaServe's attention-level migration), where no layer "
                "move pays");
  cmd->add_option("--head-move-ms-per-layer", f->head_move_ms_per_layer,
                  "an instance's pause per layer for moving every KV head's pages (a group pays "
                  "its share; troupe measured 5 ms a layer for 1 of SmolLM2's 3 heads)")
      ->check(CLI::Range(0.0, 1e6))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--move-cooldown-windows", f->pipeline.migration_opts.cooldown_windows,
                  "windows after a move of layers or heads before the next")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--head-trip-ms", f->pipeline.trip_ms,
                  "a stage's wait per layer and micro-batch with a group of its KV heads away "
                  "(troupe measured about 0.6 ms: docs/pipeline.md)")
      ->check(CLI::Range(0.0, 1e4))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--pipeline-rebalance", f->pipeline.migration_opts.threshold,
                  "the busiest stage's excess over the mean that moves layers")
      ->check(CLI::Range(0.0, 10.0))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--move-ms-per-layer", f->move_ms_per_layer,
                  "an instance's pause for each layer moved (troupe measured 250 ms a layer for "
                  "SmolLM2 with a full arena: docs/pipeline.md)")
      ->check(CLI::Range(0.0, 1e6))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--load-skew", f->pipeline.load_skew,
                  "pipelined instances: a loaded device runs this many times slower (co-tenants; "
                  "1: no skew)")
      ->check(CLI::Range(1.0, 100.0))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--loaded-share", f->pipeline.loaded_share, "the share of devices loaded")
      ->check(CLI::Range(0.0, 1.0))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--load-shift-s", f->pipeline.load_shift_s,
                  "which devices are loaded changes every this many seconds")
      ->check(CLI::Range(0.0, 1e9))
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--diurnal-period-s", f->diurnal_period_s,
                  "arrivals at a rate that follows a day of this length: --request-rate at the "
                  "peak, --diurnal-trough of it at the trough")
      ->check(CLI::Range(1.0, 1e7));
  cmd->add_option("--diurnal-trough", f->diurnal_trough, "the trough's share of the peak rate")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-decode", f->pd_cfg.min_decode, "decode instances kept")
      ->capture_default_str();
  cmd->add_option("--min-prefill", f->pd_cfg.min_prefill, "prefill instances kept")
      ->capture_default_str();
  cmd->add_option("--flip-windows", f->pd_cfg.violation_windows, "windows a trigger must hold")
      ->capture_default_str();
  cmd->add_option("--flip-cooldown-s", f->pd_cfg.cooldown_s, "per-instance cooldown")
      ->capture_default_str();
  cmd->add_option("--flip-miss-share", f->pd_cfg.miss_share,
                  "to prefill when this share of a window's prefills is predicted to miss TTFT")
      ->capture_default_str();
  cmd->add_option("--flip-via-mixed", f->pd_cfg.via_mixed,
                  "flip through mixed instances (false: straight between prefill and decode)")
      ->capture_default_str();
  cmd->add_option(
         "--flip-mixed-slack", f->pd_cfg.mixed_slack,
         "through mixed: P instances mix while mixed ones' TPOT is under this share of the target")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--flip-unmix", f->pd_cfg.unmix,
                  "through mixed: mixed instances whose requests miss TPOT turn prefill")
      ->capture_default_str();
  cmd->add_option("--flip-migrate", f->pd_cfg.preempt_migrate,
                  "a flip off decode migrates the instance's decoding sequences to decode "
                  "instances with room (false: they finish where they are)")
      ->capture_default_str();
  cmd->add_option("--flip-max", f->pd_cfg.max_flips, "instances one window may flip")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  add_load_options(*cmd, *f);
  cmd->callback([f] { run_sim(*f); });
}

}  // namespace troupe::cli
