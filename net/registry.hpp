#pragma once
// A cluster's registry in etcd (issue 37): the two background loops over an
// etcd_client.  A node keeps its record under a lease (registration); a
// service reads the nodes' prefix at intervals (registry_watch).  Both run
// on their own thread, since etcd calls block; neither holds a secret (the
// cluster secret gates the connections themselves, docs/security.md).
// While etcd is unreachable both keep going: the registration retries and
// registers again when etcd is back (a new lease if the old one expired),
// the watch reports nothing, so a service keeps the membership it knew.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net/etcd_client.hpp"

namespace troupe {

// The prefix of a cluster's nodes: one cluster's processes (one secret, so
// one fingerprint) share it; several clusters may share an etcd.
std::string registry_nodes_prefix(const std::string& cluster_fingerprint);

// Keeps `key` = `value` in etcd under a lease of `ttl_s` seconds, renewed
// every third of it, until stopped.  Its value can change (load): set by
// set_value, or made at each renewal by a function.
class registration {
 public:
  registration(std::vector<std::string> endpoints, std::string key, std::string value, int ttl_s);
  // The value made anew by `current` at every renewal, on the loop's
  // thread (a load summary: it may block briefly, asking actors); an empty
  // string from it keeps the last value.
  registration(std::vector<std::string> endpoints, std::string key,
               std::function<std::string()> current, int ttl_s);
  ~registration();  // stop(false)
  registration(const registration&) = delete;
  registration& operator=(const registration&) = delete;

  void set_value(std::string value);
  // Ends the loop; `withdraw` revokes the lease (the key goes at once, as
  // a node leaving on purpose does) instead of letting it expire.
  void stop(bool withdraw);
  // Whether the key is in etcd now, as far as the loop knows.
  bool registered() const { return registered_.load(); }

 private:
  void loop();

  etcd_client client_;
  std::string key_;
  int ttl_s_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::string value_;
  std::function<std::string()> current_;
  bool stopping_ = false;
  std::atomic<bool> registered_{false};
  int64_t lease_ = 0;
  std::thread thread_;
};

// Reads every key under `prefix` each `every` and hands them to `seen`
// (on the watch's thread) when etcd answered; an unreachable etcd calls
// nothing, so a service keeps what it knew.
class registry_watch {
 public:
  using callback = std::function<void(const std::vector<etcd_kv>&)>;
  registry_watch(std::vector<std::string> endpoints, std::string prefix,
                 std::chrono::milliseconds every, callback seen);
  ~registry_watch();
  registry_watch(const registry_watch&) = delete;
  registry_watch& operator=(const registry_watch&) = delete;

 private:
  void loop();

  etcd_client client_;
  std::string prefix_;
  std::chrono::milliseconds every_;
  callback seen_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe
