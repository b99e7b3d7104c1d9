#pragma once
// A small client of etcd's v3 API over its HTTP/JSON gateway (issue 37):
// the registry of a troupe cluster.  etcd 3.4 (Debian's etcd-server) serves
// the gRPC gateway under /v3/ on its client URL; keys and values travel as
// base64.  Only what the registry needs: leases (grant, keep-alive,
// revoke), put under a lease, a prefix range, delete.  Calls block (a few
// hundred ms at most, bounded by `timeout`): use it from a plain thread, not
// from an actor's handler.
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

// etcd could not be reached, or answered with an error.
struct etcd_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct etcd_kv {
  std::string key;
  std::string value;
  int64_t lease = 0;
};

// The key just after every key that starts with `prefix` (etcd's
// range_end for a prefix).
std::string prefix_end(const std::string& prefix);

class etcd_client {
 public:
  // `endpoints` as HOST:PORT; each call tries them in turn until one answers.
  explicit etcd_client(std::vector<std::string> endpoints,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

  // A new lease of `ttl_s` seconds; its id.  `granted_ttl_s`: the TTL etcd
  // gave it (it may raise a short one to its minimum; 0 when not said).
  int64_t grant(int ttl_s, int64_t* granted_ttl_s = nullptr);
  // Renews the lease; its remaining TTL in seconds, 0 when etcd no longer
  // knows it (it expired, or was revoked).
  int64_t keep_alive(int64_t lease);
  void revoke(int64_t lease);
  // `lease` 0: no lease (the key stays until deleted).
  void put(const std::string& key, const std::string& value, int64_t lease = 0);
  std::vector<etcd_kv> range_prefix(const std::string& prefix);
  void remove(const std::string& key);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  // POSTs `body` to /v3/<path> at the first endpoint that answers; the JSON
  // reply as text.  Throws etcd_error naming every endpoint's failure.
  std::string call(const std::string& path, const std::string& body);

  std::vector<std::string> endpoints_;
  std::chrono::milliseconds timeout_;
  size_t preferred_ = 0;  // the endpoint that answered last
};

}  // namespace troupe
