// troupe bench static-batch: SLO-ODBS against FIFO, length-only (S3-like)
// and SLO-only batching, static batches on one simulated instance
// (sim/static_batch_sim) with step costs from a cost model fitted on the
// real engine (troupe bench sim-calibrate).
#include <cstdio>
#include <iostream>

#include "sim/static_batch_sim.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct static_flags {
  std::string cost_model;
  std::string order = "all";
  uint64_t requests = 2000;
  double rate = 2.0;
  double slo_lo_s = 1, slo_hi_s = 60;
  int max_batch = 8;
  double threshold = 1.0;
  double w1 = 1, w2 = 1;
  bool oracle = false;
  bool fill = false;
  uint64_t seed = 36;
  bool json = false;
};

void run_static(const static_flags& f) {
  const cost_model cost = cost_model::load(f.cost_model);
  const auto reqs = static_workload(f.requests, f.rate, f.slo_lo_s, f.slo_hi_s, f.seed);
  std::vector<batch_order> orders;
  if (f.order == "all")
    orders = {batch_order::fifo, batch_order::length, batch_order::slo, batch_order::slo_odbs};
  else if (auto o = parse_batch_order(f.order))
    orders = {*o};
  else
    throw CLI::ValidationError("--order",
                               "'" + f.order + "' is not fifo, length, slo, slo-odbs or all");
  nlohmann::json out = nlohmann::json::array();
  if (!f.json)
    std::printf("%-9s %10s %12s %12s %12s %9s %9s %8s\n", "order", "violated", "mean lat s",
                "p99 lat s", "out tok/s", "padding", "accuracy", "batches");
  for (batch_order o : orders) {
    static_batch_config c;
    c.order = o;
    c.oracle = f.oracle;
    c.odbs.max_batch = f.max_batch;
    c.odbs.threshold = f.threshold;
    c.odbs.w1 = f.w1;
    c.odbs.w2 = f.w2;
    c.odbs.fill = f.fill;
    const auto r = run_static_batches(reqs, c, cost);
    if (f.json) {
      out.push_back({{"order", to_string(o)},
                     {"completed", r.completed},
                     {"violation_rate", r.violation_rate},
                     {"mean_latency_s", r.mean_latency_s},
                     {"p99_latency_s", r.p99_latency_s},
                     {"output_tokens_per_s", r.output_tokens_per_s},
                     {"padding_share", r.padding_share},
                     {"bucket_accuracy", r.bucket_accuracy},
                     {"batches", r.batches}});
    } else {
      std::printf("%-9s %9.1f%% %12.2f %12.2f %12.1f %8.1f%% %8.1f%% %8llu\n", to_string(o),
                  100 * r.violation_rate, r.mean_latency_s, r.p99_latency_s, r.output_tokens_per_s,
                  100 * r.padding_share, 100 * r.bucket_accuracy,
                  static_cast<unsigned long long>(r.batches));
    }
  }
  if (f.json) std::cout << out.dump(2) << std::endl;
}

}  // namespace

void add_bench_static(CLI::App& bench) {
  auto f = std::make_shared<static_flags>();
  auto* cmd = bench.add_subcommand(
      "static-batch",
      "static batching on one simulated instance: SLO-ODBS (sort by SLO, group by predicted "
      "output length) against FIFO, length-only and SLO-only, with a cost model from bench "
      "sim-calibrate");
  cmd->add_option("--cost-model", f->cost_model, "the file bench sim-calibrate wrote")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--order", f->order, "fifo, length, slo, slo-odbs or all")->capture_default_str();
  cmd->add_option("--requests", f->requests, "requests")
      ->check(CLI::Range(uint64_t(1), uint64_t(100000)))
      ->capture_default_str();
  cmd->add_option("--request-rate", f->rate, "Poisson arrivals per second")
      ->check(finite_number(false))
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  cmd->add_option("--slo-min-s", f->slo_lo_s, "shortest completion deadline (seconds)")
      ->check(finite_number(false))
      ->check(CLI::Range(1e-3, 1e9))
      ->capture_default_str();
  cmd->add_option("--slo-max-s", f->slo_hi_s, "longest completion deadline (seconds)")
      ->check(finite_number(false))
      ->check(CLI::Range(1e-3, 1e9))
      ->capture_default_str();
  cmd->add_option("--max-batch", f->max_batch, "requests per static batch")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--threshold", f->threshold,
                  "slo-odbs: a request joins while its cost is at most this")
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--w1", f->w1, "slo-odbs: weight of the SLO spread (0: ODBS)")
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_option("--w2", f->w2, "slo-odbs: weight of the length spread (0: SLO-DBS)")
      ->check(finite_number(true))
      ->capture_default_str();
  cmd->add_flag("--oracle", f->oracle,
                "plan with the exact output lengths (default: predicted online)");
  cmd->add_flag("--fill", f->fill,
                "slo-odbs: fill each group up to --max-batch with later requests predicted no "
                "longer than its longest (troupe serve's --odbs-fill; here they pad to it)");
  cmd->add_option("--seed", f->seed, "seed of the workload")->capture_default_str();
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->callback([f] {
    if (f->slo_hi_s < f->slo_lo_s)
      throw CLI::ValidationError("--slo-max-s", "is below --slo-min-s");
    run_static(*f);
  });
}

}  // namespace troupe::cli
