// troupe cluster: a cluster's global state as its registry holds it (issue
// 37): every node with its load and KV store summary, every service with
// its endpoints and load.  Reads etcd only; needs no secret (the registry
// holds none).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tools/troupe/cluster_view.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct cluster_flags {
  std::string registry;
  std::string cluster;
  bool json = false;
};

int run_cluster(const cluster_flags& f) {
  const auto v = read_cluster(f.registry, f.cluster);
  if (f.json) {
    nlohmann::json j;
    j["cluster"] = v.cluster;
    j["nodes"] = nlohmann::json::array();
    for (const auto& n : v.nodes)
      j["nodes"].push_back({{"address", n.address},
                            {"instances", n.instances},
                            {"cores", n.cores},
                            {"mem_total", n.mem_total},
                            {"load", to_json(n.load)}});
    j["services"] = nlohmann::json::array();
    for (const auto& s : v.services)
      j["services"].push_back(nlohmann::json::parse(to_registry_value(s)));
    j["skipped"] = v.skipped;
    // Keys are etcd's bytes: any that are not UTF-8 are shown replaced.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    return 0;
  }
  std::printf("cluster %s: %zu nodes, %zu services\n", v.cluster.c_str(), v.nodes.size(),
              v.services.size());
  for (const auto& n : v.nodes) {
    const auto& l = n.load;
    std::printf(
        "  node %-21s %d instances, %lld running, %lld waiting, KV pages %lld/%lld; store: host "
        "%lld, disk %lld pages, %llu hits, %llu misses\n",
        n.address.c_str(), l.instances, static_cast<long long>(l.running),
        static_cast<long long>(l.waiting), static_cast<long long>(l.used_pages),
        static_cast<long long>(l.total_pages), static_cast<long long>(l.kv_host_pages),
        static_cast<long long>(l.kv_disk_pages), static_cast<unsigned long long>(l.kv_hits),
        static_cast<unsigned long long>(l.kv_misses));
  }
  for (const auto& s : v.services) {
    std::string eps;
    for (const auto& e : s.endpoints) eps += (eps.empty() ? "" : " ") + e;
    std::printf(
        "  service %s %s (%s): %d of %d instances serving, %lld running, %lld waiting, %lld "
        "requests in flight\n",
        s.id.c_str(), eps.c_str(), s.model.c_str(), s.serving, s.instances,
        static_cast<long long>(s.running), static_cast<long long>(s.waiting),
        static_cast<long long>(s.in_flight));
  }
  for (auto k : v.skipped) {
    // etcd's bytes: nothing that steers a terminal reaches it.
    for (auto& c : k)
      if (static_cast<unsigned char>(c) < ' ' || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    std::printf("  (skipped %s: not a record)\n", k.c_str());
  }
  return 0;
}

}  // namespace

void add_cluster(CLI::App& app) {
  auto f = std::make_shared<cluster_flags>();
  auto* cmd = app.add_subcommand(
      "cluster",
      "show a cluster's nodes (load, KV store) and services (endpoints, load) from its registry");
  cmd->add_option("--registry", f->registry, "etcd://HOST:PORT[,HOST:PORT...]")->required();
  cmd->add_option("--cluster", f->cluster,
                  "the cluster's fingerprint (16 hex digits, as troupe node prints it); default: "
                  "the one cluster the registry holds");
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->get_option("--cluster")->check(cluster_fingerprint_check());
  cmd->callback([f] {
    if (run_cluster(*f) != 0) throw CLI::RuntimeError(1);
  });
}

}  // namespace troupe::cli
