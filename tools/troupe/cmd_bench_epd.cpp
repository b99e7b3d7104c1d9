// troupe bench epd: the xLLM report's hybrid EPD ablation (Fig. 22) at
// reduced scale, in the EPD simulator (sim/epd_sim) with step costs from
// a cost model fitted on the real engine (troupe bench sim-calibrate):
// goodput of the profiler's strategy, of each strategy forced, of the
// three stages on every instance ("without hybrid EPD") and of that with
// request-level iterations and one stream as well ("without stage-level
// scheduling").
#include <cstdio>
#include <iostream>

#include "sim/epd_sim.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct epd_flags {
  std::string cost_model;
  std::string strategy = "auto";
  int32_t instances = 8;
  uint64_t requests = 1000;
  int32_t image_tokens = 576;
  double encoder_scale = 1;
  double overlap = 0;
  double ttft_slo_s = 2, tpot_slo_ms = 100;
  double target = 0.9;
  uint64_t seed = 36;
  bool json = false;
};

struct variant {
  std::string name;
  std::optional<epd_strategy> strategy;
  bool stage_scheduling = true;
  bool dual_stream = true;
};

std::vector<variant> variants(const epd_flags& f) {
  if (f.strategy != "auto") {
    auto s = parse_epd_strategy(f.strategy);
    if (!s)
      throw CLI::ValidationError("--strategy",
                                 "'" + f.strategy + "' is not auto, EP-D, ED-P, E-P-D or EPD");
    return {{std::string(to_string(*s)), s, true, true}};
  }
  return {{"hybrid EPD (profiler's pick)", std::nullopt, true, true},
          {"EP-D", epd_strategy::ep_d, true, true},
          {"ED-P", epd_strategy::ed_p, true, true},
          {"E-P-D", epd_strategy::e_p_d, true, true},
          {"without hybrid EPD (EPD on every instance)", epd_strategy::colocated, true, true},
          {"without stage-level scheduling as well", epd_strategy::colocated, false, false}};
}

void run_epd(const epd_flags& f) {
  epd_sim_config base;
  base.cost = cost_model::load(f.cost_model);
  base.instances = f.instances;
  base.image_tokens = f.image_tokens;
  base.encoder_scale = f.encoder_scale;
  base.dual_stream_overlap = f.overlap;
  base.ttft_slo_s = f.ttft_slo_s;
  base.tpot_slo_s = f.tpot_slo_ms / 1000;
  const auto vs = variants(f);
  nlohmann::json out = nlohmann::json::array();
  double first = 0;
  // The profiler measures on a trial workload of its own: a quarter as
  // many requests, another seed.
  const uint64_t trial_requests = std::max<uint64_t>(100, f.requests / 4);
  bool header = false;
  for (const auto& v : vs) {
    auto c = base;
    c.strategy = v.strategy;
    c.stage_scheduling = v.stage_scheduling;
    c.dual_stream = v.dual_stream;
    std::fprintf(stderr, "bench epd: %s: profiling ...\n", v.name.c_str());
    c.profile = epd_sim_profile(c, trial_requests, f.seed + 1, f.target);
    if (!f.json && !v.strategy) {
      std::printf("profiler (%d instances, TPOT SLO %.0f ms): estimate; by trial\n", f.instances,
                  f.tpot_slo_ms);
      for (const auto& l : c.profile->log) std::printf("  %s\n", l.c_str());
    }
    if (!f.json && !header) {
      std::printf("%-44s %-12s %9s %7s %10s %10s %7s\n", "configuration", "pools", "goodput",
                  "ratio", "p99 TTFT s", "p99 TPOT ms", "enc b");
      header = true;
    }
    epd_sim_result at;
    std::fprintf(stderr, "bench epd: %s: goodput ...\n", v.name.c_str());
    const double g = epd_goodput(c, f.requests, f.seed, f.target, &at);
    // The first row is the reference (none when it served nothing).
    if (&v == &vs.front()) first = g;
    const double ratio = g > 0 ? first / g : 0;
    if (f.json) {
      out.push_back({{"configuration", v.name},
                     {"strategy", to_string(at.profile.strategy)},
                     {"pools", at.profile.pools},
                     {"encoder_batch", at.profile.limits.max_encode_batch},
                     {"prefill_tokens", at.profile.limits.max_prefill_tokens},
                     {"decode_tokens", at.profile.limits.max_decode_tokens},
                     {"profiler_log", at.profile.log},
                     {"goodput_req_s", g},
                     {"first_over_this", ratio},
                     {"attainment", at.attainment},
                     {"ttft_p99_s", at.ttft_p99_s},
                     {"tpot_p99_ms", at.tpot_p99_s * 1000},
                     {"mean_encode_batch", at.mean_encode_batch}});
    } else {
      const std::string pools =
          std::string(to_string(at.profile.strategy)) + " " + pools_text(at.profile.pools);
      std::printf("%-44s %-12s %9.2f %6.2fx %10.2f %10.1f %7.2f\n", v.name.c_str(), pools.c_str(),
                  g, ratio, at.ttft_p99_s, at.tpot_p99_s * 1000, at.mean_encode_batch);
    }
  }
  if (f.json)
    std::cout << out.dump(2) << std::endl;
  else
    std::printf(
        "goodput: requests/s with %.0f%% meeting TTFT %.2f s and TPOT %.0f ms; ratio: the "
        "first row's goodput over the row's\n",
        100 * f.target, f.ttft_slo_s, f.tpot_slo_ms);
}

}  // namespace

void add_bench_epd(CLI::App& bench) {
  auto f = std::make_shared<epd_flags>();
  auto* cmd = bench.add_subcommand(
      "epd",
      "hybrid EPD for multimodal requests, simulated: the start-up profiler's strategy (EP-D, "
      "ED-P or E-P-D) and limits, the per-iteration batch rule, against each strategy forced "
      "and the report's ablations (goodput at an SLO attainment target), with a cost model from "
      "bench sim-calibrate");
  cmd->add_option("--cost-model", f->cost_model, "the file bench sim-calibrate wrote")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--strategy", f->strategy,
                  "auto (the profiler's pick and the ablations), EP-D, ED-P, E-P-D or EPD (all "
                  "three stages on every instance)")
      ->capture_default_str();
  cmd->add_option("--instances", f->instances, "instances")
      ->check(CLI::Range(3, 256))
      ->capture_default_str();
  cmd->add_option("--requests", f->requests, "requests per simulated run")
      ->check(CLI::Range(uint64_t(10), uint64_t(100000)))
      ->capture_default_str();
  cmd->add_option("--image-tokens", f->image_tokens,
                  "placeholder tokens an image adds to the prompt (LLaVA-1.5: 576)")
      ->check(CLI::Range(1, 16384))
      ->capture_default_str();
  cmd->add_option("--encoder-scale", f->encoder_scale,
                  "an image's encode costs the language model's forward of its tokens times this")
      ->check(finite_number(false))
      ->check(CLI::Range(1e-3, 1e3))
      ->capture_default_str();
  cmd->add_option("--dual-stream-overlap", f->overlap,
                  "share of the shorter stream hidden when encodes run beside decodes (0: none, "
                  "as on this CPU)")
      ->check(finite_number(true))
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--ttft-slo-s", f->ttft_slo_s, "TTFT SLO, seconds")
      ->check(finite_number(false))
      ->check(CLI::Range(1e-3, 1e4))
      ->capture_default_str();
  cmd->add_option("--tpot-slo-ms", f->tpot_slo_ms, "TPOT SLO, ms")
      ->check(finite_number(false))
      ->check(CLI::Range(1e-1, 1e6))
      ->capture_default_str();
  cmd->add_option("--target", f->target, "SLO attainment that counts as served")
      ->check(finite_number(false))
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of the workload")->capture_default_str();
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->callback([f] { run_epd(*f); });
}

}  // namespace troupe::cli
