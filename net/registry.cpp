#include "net/registry.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace troupe {

std::string registry_nodes_prefix(const std::string& cluster_fingerprint) {
  return "/troupe/" + cluster_fingerprint + "/nodes/";
}

registration::registration(std::vector<std::string> endpoints, std::string key, std::string value,
                           int ttl_s)
    : client_(std::move(endpoints)), key_(std::move(key)), ttl_s_(ttl_s), value_(std::move(value)) {
  thread_ = std::thread([this] { loop(); });
}

registration::registration(std::vector<std::string> endpoints, std::string key,
                           std::function<std::string()> current, int ttl_s)
    : client_(std::move(endpoints)),
      key_(std::move(key)),
      ttl_s_(ttl_s),
      value_(current()),
      current_(std::move(current)) {
  thread_ = std::thread([this] { loop(); });
}

registration::~registration() {
  stop(false);
}

void registration::set_value(std::string value) {
  std::lock_guard<std::mutex> lk(mu_);
  value_ = std::move(value);  // put at the next renewal
}

void registration::stop(bool withdraw) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  if (withdraw && lease_ != 0) {
    try {
      client_.revoke(lease_);
      registered_ = false;
    } catch (const std::exception& e) {
      spdlog::warn("registry: could not withdraw {} (it expires in {} s): {}", key_, ttl_s_,
                   e.what());
    }
  }
}

void registration::loop() {
  // Renew at a third of the TTL, so two lost renewals still leave the key;
  // of the TTL etcd granted when that is shorter than the one asked for.
  int64_t granted = ttl_s_;
  auto renew_every = [&] {
    return std::chrono::milliseconds(std::max<int64_t>(1, std::min<int64_t>(ttl_s_, granted)) *
                                     1000 / 3);
  };
  const auto retry_every = std::chrono::milliseconds(1000);
  std::string logged;  // the last failure logged: an outage logs once
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    std::string value = value_;
    lk.unlock();
    bool ok = true;
    try {
      if (lease_ != 0) {
        const int64_t left = client_.keep_alive(lease_);
        if (left <= 0) {
          spdlog::warn("registry: the lease of {} expired; registering again", key_);
          lease_ = 0;
        } else {
          granted = left;
        }
      }
      // The record again at every renewal: cheap, and a key deleted by
      // hand (or a put that failed after its grant) comes back.
      const bool fresh = lease_ == 0;
      int64_t ttl = 0;
      const int64_t lease = fresh ? client_.grant(ttl_s_, &ttl) : lease_;
      if (fresh && ttl > 0) granted = ttl;
      client_.put(key_, value, lease);
      lease_ = lease;
      if (fresh) spdlog::info("registry: registered {} (lease ttl {} s)", key_, ttl_s_);
      registered_ = true;
      if (!logged.empty()) spdlog::info("registry: etcd answers again");
      logged.clear();
    } catch (const std::exception& e) {
      ok = false;
      if (logged != e.what()) {
        logged = e.what();
        spdlog::warn("registry: {} (retrying every second)", e.what());
      }
    }
    // The next value (a load summary) after the lease is safe: a slow
    // answer delays the next renewal by as much, never this one.
    const auto made = std::chrono::steady_clock::now();
    std::string next;
    if (current_) {
      try {
        next = current_();
      } catch (const std::exception& e) {
        spdlog::warn("registry: the value of {} could not be made: {}", key_, e.what());
      }
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - made);
    lk.lock();
    if (!next.empty()) value_ = std::move(next);
    if (!ok) registered_ = false;
    const auto wait = ok ? renew_every() - took : retry_every;
    wake_.wait_for(lk, std::max(wait, std::chrono::milliseconds(100)),
                   [this] { return stopping_; });
  }
}

registry_watch::registry_watch(std::vector<std::string> endpoints, std::string prefix,
                               std::chrono::milliseconds every, callback seen)
    : client_(std::move(endpoints)),
      prefix_(std::move(prefix)),
      every_(every),
      seen_(std::move(seen)) {
  thread_ = std::thread([this] { loop(); });
}

registry_watch::~registry_watch() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void registry_watch::loop() {
  std::string logged;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    lk.unlock();
    try {
      auto kvs = client_.range_prefix(prefix_);
      if (!logged.empty()) spdlog::info("registry: etcd answers again");
      logged.clear();
      seen_(kvs);
    } catch (const std::exception& e) {
      if (logged != e.what()) {
        logged = e.what();
        spdlog::warn("registry: {}; keeping the nodes known so far", e.what());
      }
    }
    lk.lock();
    wake_.wait_for(lk, every_, [this] { return stopping_; });
  }
}

}  // namespace troupe
