#pragma once
// A cluster's global state in etcd (issue 37 item 4), beside the nodes'
// membership records: what each node and each service publishes at
// intervals (at every renewal of its lease), aggregated, never per page or
// per request, and never a secret.
//
// - A node's record carries its load: the instances it hosts for every
//   service, their sequences and KV pages, and its KV store's summary (pages
//   and hit counts by tier).
// - A service keeps its own record under /troupe/<cluster>/services/<id>:
//   the client endpoints it listens on and its load (instances, requests in
//   flight).  Clients read them to find the services of a cluster and try
//   the least loaded first (`troupe client --server etcd://...`); operators
//   read both with `troupe cluster`.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace troupe {

// A node's load, summed over the instances it hosts (shared by every
// service that uses them) and its KV store's tiers.
struct node_load {
  int32_t instances = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t used_pages = 0;   // arena pages in use, all instances
  int64_t total_pages = 0;  // arena pages, all instances
  int64_t kv_host_pages = 0;
  int64_t kv_disk_pages = 0;
  uint64_t kv_hits = 0;    // store pages found by lookups, all tiers
  uint64_t kv_misses = 0;  // lookups that ended at a page no tier held
};

nlohmann::json to_json(const node_load& l);
// Fields missing or of the wrong type read as 0 (an older node's record).
node_load node_load_from(const nlohmann::json& j);

// What a service publishes of itself.
struct service_record {
  std::string id;
  std::vector<std::string> endpoints;  // client endpoints (tcp://HOST:PORT)
  std::string model;
  int32_t instances = 0;  // in its router
  int32_t serving = 0;    // of those, taking requests
  int64_t running = 0;    // sequences on its instances (other services' too where shared)
  int64_t waiting = 0;
  int64_t in_flight = 0;  // its own requests in flight
};

std::string registry_services_prefix(const std::string& cluster_fingerprint);
std::string to_registry_value(const service_record& r);
// The record in `value`, or nullopt with `why` set (a foreign or broken key).
std::optional<service_record> parse_service_record(const std::string& value, std::string* why);

// A bound endpoint as a client elsewhere dials it: tcp://0.0.0.0:P (and
// tcp://*:P, tcp://[::]:P) name the machine as `host`; the rest as they are
// (a loopback or ipc:// endpoint serves clients of this machine only).
std::string dialable_endpoint(const std::string& bound, const std::string& host);

// The endpoints of the services that serve, the least loaded first (its
// requests in flight per serving instance, then the id), each once; the
// services with no serving instance last.
std::vector<std::string> rank_service_endpoints(std::vector<service_record> services);

}  // namespace troupe
