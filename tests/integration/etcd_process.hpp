#pragma once
// A real etcd (Debian's etcd-server) as a child of a registry test: on
// loopback ports the OS picked, with a temporary data dir removed with the
// object; ready once it answers a range over its HTTP/JSON gateway.  It can
// be killed and started again on the same ports and data (the registry's
// outage test).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "child_process.hpp"
#include "net/etcd_client.hpp"
#include "server_process.hpp"

namespace troupe::testing {

class etcd_process {
 public:
  etcd_process() : client_port_(free_port()), peer_port_(free_port()) {
    char tmpl[] = "/tmp/troupe_etcd_XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    start();
  }
  ~etcd_process() {
    child_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // etcd://127.0.0.1:PORT, for --registry.
  std::string url() const { return "etcd://" + endpoint(); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }

  void kill9() { child_.reset(); }
  // Again on the same ports, with the same data.
  void start() {
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::string client = "http://" + endpoint();
    child_ = std::make_unique<child_process>(
        "etcd --name troupe-test --data-dir " + dir_ + " --listen-client-urls " + client +
            " --advertise-client-urls " + client + " --listen-peer-urls " + peer +
            " --initial-advertise-peer-urls " + peer + " --initial-cluster troupe-test=" + peer,
        "etcd");
    etcd_client c({endpoint()}, std::chrono::milliseconds(500));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
      try {
        c.range_prefix("/");
        return;
      } catch (const etcd_error&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    throw std::runtime_error("etcd did not answer within 30 s: " + child_->stderr_text());
  }

 private:
  int client_port_, peer_port_;
  std::string dir_;
  std::unique_ptr<child_process> child_;
};

}  // namespace troupe::testing
