#pragma once
// A cluster's global state as etcd holds it (issue 37 item 4): the nodes'
// records with their load and KV summaries, and the services' records with
// their endpoints and load (runtime/service/cluster_state).  Read by
// `troupe cluster` for operators and by `troupe client --server etcd://...`
// to find the services of a cluster.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/service/membership.hpp"

namespace troupe::cli {

struct cluster_view {
  std::string cluster;  // the fingerprint (16 hex digits) under /troupe/
  std::vector<node_record> nodes;
  std::vector<service_record> services;
  std::vector<std::string> skipped;  // keys that hold no record (foreign, broken)
};

// Reads /troupe/<cluster>/ from the registry `url` (etcd://HOST:PORT[,...]).
// `cluster` empty: the one cluster the registry holds.  Throws
// std::runtime_error when etcd does not answer, when it holds no cluster,
// or (`cluster` empty) several, naming them.
cluster_view read_cluster(const std::string& url, const std::string& cluster);

// --cluster: 16 hex digits (a fingerprint as `troupe node` prints it).
CLI::Validator cluster_fingerprint_check();

}  // namespace troupe::cli
