// troupe bench placement: where HELR (runtime/device/layer_placement)
// would put a model's layers on a topology read from a JSON file, in each
// mode: the stages, their layers, the step's compute and link latency.
// Pipeline-parallel instances (issue 35 item 1) do not exist yet; this is
// the planner they will call, usable today to size a deployment.
#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "runtime/device/layer_placement.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct placement_flags {
  std::string topology;
  std::string mode = "all";
  double kv_reserve_gib = -1;  // >= 0: overrides the file's
  bool json = false;
};

struct topology {
  std::vector<placement_device> devices;
  std::vector<std::vector<double>> link_s;
  layer_model model;
};

topology read_topology(const std::string& path, double kv_override_gib) {
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw CLI::ValidationError("--topology", path + ": not JSON (" + e.what() + ")");
  }
  topology t;
  constexpr double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
  try {
    if (!j.at("devices").is_array() || !j.at("links_ms").is_array())
      throw std::invalid_argument("devices and links_ms must be arrays");
    for (const auto& d : j.at("devices"))
      t.devices.push_back({d.value("name", "device " + std::to_string(t.devices.size())),
                           d.at("memory_gib").get<double>() * gib,
                           d.at("ms_per_layer").get<double>() / 1000.0});
    for (const auto& row : j.at("links_ms")) {
      if (!row.is_array()) throw std::invalid_argument("each row of links_ms must be an array");
      t.link_s.emplace_back();
      for (const auto& v : row) t.link_s.back().push_back(v.get<double>() / 1000.0);
    }
    const auto& m = j.at("model");
    const auto& layers = m.at("layers");
    if (!layers.is_number_integer() || layers.get<int64_t>() < 1 || layers.get<int64_t>() > 1000000)
      throw std::invalid_argument("model.layers must be a whole number from 1 to 1000000");
    t.model.layers = layers.get<int32_t>();
    t.model.layer_bytes = m.at("layer_mib").get<double>() * mib;
    t.model.kv_reserve_bytes = m.value("kv_reserve_gib", 0.0) * gib;
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError("--topology", path + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw CLI::ValidationError(
        "--topology", path +
                          ": needs devices [{name, memory_gib, ms_per_layer}], links_ms (a square "
                          "matrix) and model {layers, layer_mib, kv_reserve_gib} (" +
                          e.what() + ")");
  }
  if (kv_override_gib >= 0) t.model.kv_reserve_bytes = kv_override_gib * gib;
  return t;
}

void run_placement(const placement_flags& f) {
  const topology t = read_topology(f.topology, f.kv_reserve_gib);
  std::vector<placement_mode> modes;
  if (f.mode == "all")
    modes = {placement_mode::he, placement_mode::lr, placement_mode::helr};
  else
    try {
      modes = {parse_placement_mode(f.mode)};
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError("--mode", e.what());
    }
  nlohmann::json out = nlohmann::json::array();
  for (placement_mode m : modes) {
    layer_placement p;
    try {
      p = place_layers(t.devices, t.link_s, t.model, m);
    } catch (const std::exception& e) {
      // std::runtime_error: main prints it (CLI11 prints no RuntimeError).
      throw std::runtime_error(std::string("troupe bench placement: ") + e.what());
    }
    nlohmann::json stages = nlohmann::json::array();
    std::string line;
    for (const auto& s : p.stages) {
      const std::string& name = t.devices[s.device].name;
      stages.push_back({{"device", name}, {"first_layer", s.first_layer}, {"layers", s.layers}});
      line += (line.empty() ? "" : " -> ") + name + " [" + std::to_string(s.first_layer) + ".." +
              std::to_string(s.first_layer + s.layers - 1) + "]";
    }
    if (f.json)
      out.push_back({{"mode", placement_mode_name(m)},
                     {"stages", stages},
                     {"compute_ms", p.compute_s * 1000},
                     {"link_ms", p.link_s * 1000},
                     {"latency_ms", p.latency_s() * 1000}});
    else
      std::printf("%-4s %zu device%s, %.2f ms a step (compute %.2f + links %.2f): %s\n",
                  placement_mode_name(m), p.stages.size(), p.stages.size() == 1 ? "" : "s",
                  p.latency_s() * 1000, p.compute_s * 1000, p.link_s * 1000, line.c_str());
  }
  if (f.json) std::cout << out.dump(2) << std::endl;
}

}  // namespace

void add_bench_placement(CLI::App& bench) {
  auto f = std::make_shared<placement_flags>();
  auto* cmd = bench.add_subcommand(
      "placement",
      "HELR layer placement (UELLM): which devices would hold which layers of a model, from a "
      "topology file (bench/topologies/uellm_4x3090.json is an example)");
  cmd->add_option("--topology", f->topology,
                  "JSON: devices [{name, memory_gib, ms_per_layer}], links_ms [[...]], model "
                  "{layers, layer_mib, kv_reserve_gib}")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--mode", f->mode, "he (fewest devices), lr (lowest latency), helr or all")
      ->capture_default_str();
  cmd->add_option("--kv-reserve-gib", f->kv_reserve_gib,
                  "GiB kept free on every device for its KV cache (default: the file's)")
      ->check(finite_number(true))
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->callback([f] { run_placement(*f); });
}

}  // namespace troupe::cli
