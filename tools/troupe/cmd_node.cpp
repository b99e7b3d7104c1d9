// troupe node: a process that hosts engine instances for services (issue 10,
// docs/architecture.md §2.2 "Processes, threads and boundaries").  It
// publishes its node actor on --listen over CAF's middleman on the cluster's
// TLS (only peers with the cluster secret get in), builds instances when a
// service asks, and serves until SIGTERM; then it tells its services, which
// move their sequences elsewhere, and stops once its instances hold none (or
// the grace period ends).  With --registry it keeps its record in etcd
// under a lease (net/registry: registration), so services of its cluster
// find it while it runs; at SIGTERM it withdraws the record first.
#include <pthread.h>
#include <signal.h>

#include <caf/openssl/publish.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "actors/node.hpp"
#include "net/registry.hpp"
#include "runtime/service/membership.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct node_flags {
  std::string listen = "127.0.0.1:0";
  cluster_settings cluster;
  double grace_s = 30;
  int reap_after_s = 60;
  int instances = 1;      // offered to each service that finds it in the registry
  std::string advertise;  // the address services dial (default: --listen's host, bound port)
};

// The address a service reaches this node at (checked in run_node).
std::string advertised(const node_flags& f, const std::string& host, uint16_t port) {
  if (!f.advertise.empty()) return f.advertise;
  return host + ":" + std::to_string(port);
}

int run_node(const node_flags& f) {
  auto [host, port] = split_address(f.listen, "--listen");
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  // A write to a socket its peer has reset fails with EPIPE, handled where
  // it happens, instead of ending the process (libevent writes with
  // writev, which has no MSG_NOSIGNAL).
  ::signal(SIGPIPE, SIG_IGN);

  if (!f.cluster.registry.empty() && !f.advertise.empty()) {
    if (auto why = check_dial_address(f.advertise); !why.empty())
      throw std::invalid_argument("--advertise: " + why);
  }
  if (f.cluster.registry.empty() && (!f.advertise.empty() || f.instances != 1))
    std::fprintf(stderr, "troupe node: --advertise and --instances count with --registry only\n");
  if (!f.cluster.registry.empty() && f.advertise.empty() &&
      (host.empty() || host == "0.0.0.0" || host == "::"))
    throw std::invalid_argument(
        "--registry with --listen on every interface: give --advertise HOST:PORT, the address "
        "services dial");
  const std::string secret = load_cluster_secret(f.cluster);
  actor_env env(secret, f.cluster);
  node_options no;
  no.reap_after = std::chrono::seconds(f.reap_after_s);
  auto node = spawn_node(*env.sys, no);
  auto bound = caf::openssl::publish(caf::actor_cast<node_actor>(node), port,
                                     host.empty() ? nullptr : host.c_str(), true);
  if (!bound) {
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    throw std::runtime_error("--listen " + f.listen +
                             ": cannot listen: " + env.sys->render(bound.error()));
  }
  const auto res = local_resources();
  std::fprintf(stderr, "troupe node: %d cores, %.1f GiB memory, cluster %s\n", res.cores,
               static_cast<double>(res.mem_total) / (1u << 30),
               cluster_fingerprint(secret).substr(0, 16).c_str());
  for (const auto& d : res.opencl_devices)
    std::fprintf(stderr, "troupe node: OpenCL %s\n", d.c_str());
  // In the registry, before the ready line: a service that reads the
  // registry after it finds the node there.
  std::unique_ptr<registration> reg;
  if (!f.cluster.registry.empty()) {
    node_record rec;
    rec.address = advertised(f, host, static_cast<uint16_t>(*bound));
    rec.instances = f.instances;
    rec.cores = res.cores;
    rec.mem_total = static_cast<int64_t>(res.mem_total);
    rec.devices = res.opencl_devices;
    // The record again at every renewal, with the node's load as of then
    // (asked of the node actor from the registration's thread).
    auto current = [sys = env.sys.get(), node, rec]() mutable {
      caf::scoped_actor self{*sys};
      // Briefly: the lease's next renewal waits for it (a 2 s lease renews
      // every 0.67 s).
      self->request(node, std::chrono::milliseconds(500), node_load_atom::value)
          .receive([&](node_load& l) { rec.load = l; }, [](caf::error&) {});
      return to_registry_value(rec);
    };
    reg = std::make_unique<registration>(
        registry_endpoints(f.cluster.registry),
        registry_nodes_prefix(cluster_fingerprint(secret).substr(0, 16)) + rec.address,
        std::function<std::string()>(current), f.cluster.registry_ttl_s);
    for (int i = 0; i < 50 && !reg->registered(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (reg->registered())
      std::fprintf(stderr, "troupe node: registered in %s as %s\n", f.cluster.registry.c_str(),
                   rec.address.c_str());
    else
      std::fprintf(stderr,
                   "troupe node: not yet registered in %s as %s: etcd does not answer (retrying "
                   "every second)\n",
                   f.cluster.registry.c_str(), rec.address.c_str());
  }
  std::printf("troupe node: listening on %s:%u\n", host.empty() ? "0.0.0.0" : host.c_str(),
              static_cast<unsigned>(*bound));
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "troupe node: %s, handing sequences back (grace %.1f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", f.grace_s);
  caf::scoped_actor self{*env.sys};
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(f.grace_s * 1000));
  for (;;) {
    int32_t held = 0;
    self->request(node, std::chrono::seconds(5), stop_atom::value)
        .receive([&](int32_t n) { held = n; }, [&](caf::error&) { held = 0; });
    // Out of the registry once its services were told it leaves (they
    // drain it; a service that joins now would only be refused).
    if (reg) reg->stop(true);
    if (held == 0) break;
    if (std::chrono::steady_clock::now() >= end) {
      std::fprintf(stderr, "troupe node: %d sequences still here at the end of the grace period\n",
                   held);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  self->send_exit(node, caf::exit_reason::user_shutdown);
  env.exit_limit = std::chrono::seconds(5);
  std::fprintf(stderr, "troupe node: stopped\n");
  return 0;
}

}  // namespace

void add_node(CLI::App& app) {
  auto f = std::make_shared<node_flags>();
  auto* cmd = app.add_subcommand(
      "node", "host engine instances for troupe services (troupe serve --nodes HOST:PORT)");
  cmd->add_option("-l,--listen", f->listen,
                  "HOST:PORT to listen on (default 127.0.0.1:0: loopback, a port the OS picks)");
  // The schema's [cluster] keys every process of a cluster takes.
  auto cluster = std::make_shared<settings_flags>(
      *cmd, [](const setting_key& k) { return k.where == applies::cluster; });
  cmd->parse_complete_callback([f, cluster] { f->cluster = cluster->resolve().cluster; });
  cmd->add_option("--grace-s", f->grace_s,
                  "at SIGTERM: seconds to wait for the services to move their sequences away")
      ->check(finite_number(true) & CLI::Range(0.0, 3600.0));
  cmd->add_option("--instances", f->instances,
                  "with --registry: instances this node hosts for each service that finds it "
                  "there")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--advertise", f->advertise,
                  "with --registry: the HOST:PORT services dial (default: --listen's host and "
                  "the bound port)");
  cmd->add_option("--reap-after-s", f->reap_after_s,
                  "a service that lost its connection gets its instances back if it returns "
                  "within this many seconds")
      ->check(CLI::Range(1, 86400));
  cmd->callback([f] {
    int rc = run_node(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
