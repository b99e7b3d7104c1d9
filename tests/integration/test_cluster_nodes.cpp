// The cluster across processes (issue 10): real `troupe node` processes on
// 127.0.0.1 host stories15M instances for a `troupe serve` with no local
// instance, over CAF's middleman on the cluster's TLS.  Every child is
// killed by its pid when its object goes, pass or fail; every wait is
// bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "net.hpp"
#include "node_process.hpp"
#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

const std::vector<std::string> kPrompts = {
    "Once upon a time, there was a little girl named Lily",
    "Tom had a small dog called Max",
    "The sun was hot and the sky was blue",
};

std::vector<int32_t> offline(const std::string& prompt, int n) {
  return offline_tokens("stories15m", prompt, n);
}

wire::Generate greedy(uint64_t id, int n, const std::string& text = kPrompts[0]) {
  return greedy_request(id, text, n);
}

std::string nodes_flag(std::initializer_list<const node_process*> nodes) {
  std::string s;
  for (const auto* n : nodes) {
    if (!s.empty()) s += ',';
    s += n->address();
  }
  return s;
}

// Receives until every result is done (or a minute without a message).
void drain_results(client::connection& c, std::vector<client::result>& rs, uint64_t first_id) {
  auto find = [&](uint64_t id) {
    return id >= first_id && id < first_id + rs.size() ? &rs[id - first_id] : nullptr;
  };
  auto all_done = [&] {
    for (const auto& r : rs)
      if (!r.done()) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, all_done, 60s)) << "no message for a minute";
}

// The spdlog time of the first stderr line containing `what`, in ms since
// the epoch (spdlog writes local time), or -1.
double log_time_ms(const std::string& log, const std::string& what) {
  const auto at = log.find(what);
  if (at == std::string::npos) return -1;
  const auto line = log.rfind('\n', at);
  const auto from = line == std::string::npos ? 0 : line + 1;
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(log.c_str() + from, "[%d-%d-%d %d:%d:%d.%d]", &tm.tm_year, &tm.tm_mon,
                  &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  return static_cast<double>(std::mktime(&tm)) * 1000.0 + ms;
}

double now_unix_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Three nodes from a config file, 30 streamed greedy requests from three
// client processes: identical to offline, spread over every instance.
// Then a prefix-aware service on the same nodes sends each shared-prefix
// group to one instance.
TEST(ClusterNodes, ThreeNodesFromAConfigServeLikeOffline) {
  secret_file secret("cluster-test-secret-three-nodes");
  node_process n1(secret.path()), n2(secret.path()), n3(secret.path());
  const std::string cfg = "/tmp/troupe_cluster_" + std::to_string(::getpid()) + ".toml";
  {
    std::FILE* f = std::fopen(cfg.c_str(), "w");
    std::fprintf(f, "[cluster]\nsecret_file = \"%s\"\n", secret.path().c_str());
    for (const auto* n : {&n1, &n2, &n3})
      std::fprintf(f, "\n[[cluster.node]]\naddress = \"%s\"\ninstances = 1\nkv_mb = 64\n",
                   n->address().c_str());
    std::fclose(f);
  }
  std::map<std::string, std::vector<int32_t>> want;
  for (const auto& p : kPrompts) want[p] = offline(p, 24);
  {
    server_process server("--config " + cfg + " --router round-robin");
    const auto inst = server.admin("instances");
    ASSERT_EQ(inst.size(), 3u) << inst.dump();
    std::set<std::string> node_names;
    for (const auto& i : inst) {
      for (const char* k : {"id", "node", "role", "state", "running", "waiting", "used_pages"})
        EXPECT_TRUE(i.contains(k)) << k;
      node_names.insert(i["node"].get<std::string>());
    }
    EXPECT_EQ(node_names, (std::set<std::string>{n1.address(), n2.address(), n3.address()}));

    std::vector<std::future<process_result>> clients;
    for (int c = 0; c < 3; ++c) {
      std::string cmd = troupe_bin() + " client --server " + shell_quote(server.endpoint()) +
                        " -n 24 --ignore-eos --json";
      for (int i = 0; i < 10; ++i) cmd += " -p " + shell_quote(kPrompts[(c + i) % 3]);
      clients.push_back(std::async(std::launch::async, [cmd] { return run_process(cmd); }));
    }
    std::set<uint64_t> used;
    int answers = 0;
    for (auto& f : clients) {
      auto r = f.get();
      ASSERT_EQ(r.exit_code, 0) << r.err;
      std::istringstream lines(r.out);
      std::string line;
      int i = 0;
      while (std::getline(lines, line)) {
        auto j = nlohmann::json::parse(line);
        ++answers;
        ++i;
        EXPECT_EQ(j["finish_reason"], "length");
        const auto ids = j["token_ids"].get<std::vector<int32_t>>();
        bool matches = false;
        for (const auto& [p, w] : want) matches = matches || ids == w;
        EXPECT_TRUE(matches) << line;
        for (auto id : j["usage"]["instances"]) used.insert(id.get<uint64_t>());
      }
    }
    EXPECT_EQ(answers, 30);
    EXPECT_EQ(used, (std::set<uint64_t>{1, 2, 3}));
    const auto nodes = server.admin("nodes");
    ASSERT_EQ(nodes.size(), 3u) << nodes.dump();
    for (const auto& n : nodes) EXPECT_EQ(n["state"], "up") << n.dump();
  }

  // Prefix-aware placement on the same nodes (a new service: new instances).
  server_process server("--config " + cfg + " --router prefix");
  std::remove(cfg.c_str());
  const std::vector<std::string> groups = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree and ran to get it.",
      "Tom had a small dog called Max. Every morning they walked to the river and looked at the "
      "ducks. Max liked to bark at the ducks, and Tom laughed every time the ducks flew away.",
      "The sun was hot and the sky was blue. Sara and her mom went to the beach with a big bag of "
      "toys. Sara built a castle with a tall tower and a deep hole for the water to come in."};
  client::connection c(server.endpoint());
  auto ask = [&](uint64_t id, const std::string& text) -> uint64_t {
    wire::Generate g;
    g.set_request_id(id);
    g.set_text(text);
    g.set_max_tokens(4);
    auto r = client::run(c, {g}, 60s);
    EXPECT_FALSE(r.at(0).error);
    if (r.at(0).finished.instances_size() != 1) return 0;
    return r.at(0).finished.instances(0);
  };
  std::vector<uint64_t> home;
  for (size_t g = 0; g < groups.size(); ++g) home.push_back(ask(100 + g, groups[g]));
  std::this_thread::sleep_for(500ms);  // the router's snapshots see the cached pages
  uint64_t id = 200;
  for (int round = 0; round < 3; ++round)
    for (size_t g = 0; g < groups.size(); ++g)
      EXPECT_EQ(ask(id++, groups[g] + " Then " + std::to_string(round) + " more."), home[g])
          << "group " << g << ", round " << round;
  const double hit = server.admin("kv")["prefix_hit_rate"].get<double>();
  std::printf("[ cluster ] prefix-aware on 3 nodes: prefix hit rate %.3f\n", hit);
  RecordProperty("prefix_hit_rate", std::to_string(hit));
  EXPECT_GT(hit, 0.3);
}

// kill -9 of a node while 12 greedy requests stream: all finish with the
// offline tokens, no error; the detection and recovery times are reported.
// Then the node is started again on its port and its instance comes back.
TEST(ClusterNodes, KillNineOfANodeLosesNoRequest) {
  secret_file secret("cluster-test-secret-kill");
  node_process n1(secret.path()), n2(secret.path());
  server_process server("--nodes " + nodes_flag({&n1, &n2}) + " --cluster-secret-file " +
                        secret.path() + " --router round-robin");
  const auto want = offline(kPrompts[0], 120);
  client::connection c(server.endpoint());
  std::vector<client::result> rs(12);
  for (uint64_t id = 1; id <= 12; ++id) c.generate(greedy(id, 120));
  auto find = [&](uint64_t id) { return id >= 1 && id <= 12 ? &rs[id - 1] : nullptr; };
  auto streaming = [&] {
    for (const auto& r : rs)
      if (r.token_ids.size() < 4 && !r.done()) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, streaming, 30s));
  std::vector<size_t> at_kill;
  for (const auto& r : rs) at_kill.push_back(r.token_ids.size());
  const double kill_ms = now_unix_ms();
  n1.kill9();
  std::vector<double> resumed(12, -1);  // when each request got a token after the kill
  auto all_done = [&] {
    for (const auto& r : rs)
      if (!r.done()) return false;
    return true;
  };
  while (!all_done()) {
    auto m = c.receive(60s);
    ASSERT_TRUE(m) << "requests stopped after the kill";
    if (auto id = client::apply(*m, find); id && *id >= 1 && *id <= 12) {
      auto& r = rs[*id - 1];
      if (resumed[*id - 1] < 0 && r.token_ids.size() > at_kill[*id - 1])
        resumed[*id - 1] = now_unix_ms();
    }
  }
  int recovered = 0;
  double first_recovered = -1;
  for (size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.finished.reason(), wire::LENGTH);
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
    if (r.finished.instances_size() > 1) {
      ++recovered;
      if (first_recovered < 0 || resumed[i] < first_recovered) first_recovered = resumed[i];
    }
  }
  EXPECT_EQ(recovered, 6);  // round-robin put half on the killed node
  const double down_ms = log_time_ms(server.stderr_text(), "is down");
  ASSERT_GT(down_ms, 0) << server.stderr_text();
  std::printf(
      "[ cluster ] kill -9: instance marked down after %.0f ms, first recovered token "
      "after %.0f ms\n",
      down_ms - kill_ms, first_recovered - kill_ms);
  RecordProperty("detect_ms", std::to_string(down_ms - kill_ms));
  RecordProperty("first_recovered_token_ms", std::to_string(first_recovered - kill_ms));
  EXPECT_LT(down_ms - kill_ms, 3000);

  // The node returns on its port (the old process is gone, its port
  // free): the link reconnects, the instance serves again under its id.
  auto started =
      run_process("exec " + troupe_bin() + " node --listen " + n1.address() +
                  " --cluster-secret-file " + secret.path() + " >/dev/null 2>&1 & echo $!");
  struct kill_at_end {
    pid_t pid;
    ~kill_at_end() {
      if (pid > 0) ::kill(pid, SIGKILL), ::waitpid(pid, nullptr, WNOHANG);
    }
  } back{static_cast<pid_t>(std::stol(started.out))};
  // Bounded at 60 s: here it takes 2 to 4 s, but a fresh-clone CI run on
  // two busy cores once needed more than 20 (a connect attempt to the
  // node while it starts may wait out its 10 s timeout, then the node
  // loads the model again).
  const auto back_from = clock_type::now();
  const auto until = back_from + 60s;
  std::string state;
  bool node_alive = true;
  while (clock_type::now() < until) {
    state = server.admin("instances")[0]["state"].get<std::string>();
    if (state == "serving") break;
    // A node that cannot listen again (another test took the port in the
    // moment it was free) exits: say so rather than wait.
    if (::kill(back.pid, 0) != 0 || ::waitpid(back.pid, nullptr, WNOHANG) == back.pid) {
      node_alive = false;
      break;
    }
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(node_alive) << "the restarted node exited: its port " << n1.address()
                          << " was taken again before it could listen";
  EXPECT_EQ(state, "serving") << "the node's instance did not come back";
  std::printf("[ cluster ] the restarted node's instance serves again after %.1f s\n",
              std::chrono::duration<double>(clock_type::now() - back_from).count());
}

// A node that hangs (SIGSTOP) keeps its connection open: CAF's heartbeat
// times out and its requests recover elsewhere anyway.
TEST(ClusterNodes, AHungNodeIsLostByHeartbeat) {
  secret_file secret("cluster-test-secret-hang");
  node_process n1(secret.path(), "--connection-timeout-ms 1000"),
      n2(secret.path(), "--connection-timeout-ms 1000");
  server_process server("--nodes " + nodes_flag({&n1, &n2}) + " --cluster-secret-file " +
                        secret.path() + " --router round-robin --connection-timeout-ms 1000");
  const auto want = offline(kPrompts[1], 100);
  client::connection c(server.endpoint());
  std::vector<client::result> rs(4);
  for (uint64_t id = 1; id <= 4; ++id) c.generate(greedy(id, 100, kPrompts[1]));
  while (rs[0].token_ids.size() < 4 || rs[1].token_ids.size() < 4) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m);
    client::apply(*m, [&](uint64_t id) { return id >= 1 && id <= 4 ? &rs[id - 1] : nullptr; });
  }
  const double stop_ms = now_unix_ms();
  n1.signal(SIGSTOP);
  drain_results(c, rs, 1);
  for (const auto& r : rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want);
  }
  const double down_ms = log_time_ms(server.stderr_text(), "is down");
  ASSERT_GT(down_ms, 0) << server.stderr_text();
  std::printf("[ cluster ] SIGSTOP: instance marked down after %.0f ms (timeout 1000 ms)\n",
              down_ms - stop_ms);
  EXPECT_LT(down_ms - stop_ms, 5000);
}

// A streaming request moved five times between two nodes through admin
// keeps its greedy tokens; a seeded sampled request moved mid-stream gives
// the tokens it gives unmoved.  Every source's pages come back.
TEST(ClusterNodes, MigrationsBetweenNodesKeepTheStream) {
  secret_file secret("cluster-test-secret-migrate");
  node_process n1(secret.path()), n2(secret.path());
  server_process server("--nodes " + nodes_flag({&n1, &n2}) + " --cluster-secret-file " +
                        secret.path());
  const auto want = offline(kPrompts[0], 200);
  client::connection busy(server.endpoint());
  for (uint64_t id = 100; id < 103; ++id) busy.generate(greedy(id, 200));
  client::connection c(server.endpoint());
  c.generate(greedy(7, 200));
  client::result r;
  auto find = [&](uint64_t id) { return id == 7 ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return !r.token_ids.empty() || r.done(); }, 30s));
  const int moved = migrate_back_and_forth(server, c, r, find, 7, 9, 5);
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.done(); }, 60s));
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
  EXPECT_GE(moved, 5);
  const auto t = server.admin("trace 7");
  EXPECT_GE(t["migrations"].get<int>(), 5) << t.dump();
  for (uint64_t id = 100; id < 103; ++id) busy.cancel(id);

  // Seeded sampling: the same request unmoved, then moved once mid-stream.
  auto sampled = [&](uint64_t id) {
    wire::Generate g = greedy(id, 120, kPrompts[2]);
    g.mutable_sampling()->set_temperature(0.9f);
    g.mutable_sampling()->set_seed(1234);
    return g;
  };
  const auto plain = client::run(c, {sampled(20)}, 60s).at(0);
  ASSERT_FALSE(plain.error);
  c.generate(sampled(21));
  client::result s;
  auto find_s = [&](uint64_t id) { return id == 21 ? &s : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find_s, [&] { return s.token_ids.size() >= 10 || s.done(); }, 30s));
  auto migrate_to = [&](int to) {
    return server.admin_command("migrate 21 " + std::to_string(to));
  };
  auto res = migrate_to(1);
  if (res.exit_code != 0 && res.err.find("already") != std::string::npos) res = migrate_to(2);
  EXPECT_EQ(res.exit_code, 0) << res.err;
  ASSERT_TRUE(receive_until(
      c, find_s, [&] { return s.done(); }, 60s));
  ASSERT_FALSE(s.error);
  EXPECT_EQ(s.token_ids, plain.token_ids);
  EXPECT_EQ(server.admin("trace 21")["migrations"].get<int>(), 1);
  const auto inst = server.wait_engine_idle(15s);
  for (const auto& i : inst) EXPECT_EQ(i["used_pages"], 0) << i.dump();
}

// Drain under load: no new placements on the drained instance, its
// requests move to the other node, its pages return to 0.
TEST(ClusterNodes, DrainMovesRequestsOffANode) {
  secret_file secret("cluster-test-secret-drain");
  node_process n1(secret.path()), n2(secret.path());
  server_process server("--nodes " + nodes_flag({&n1, &n2}) + " --cluster-secret-file " +
                        secret.path() + " --router round-robin");
  const auto want = offline(kPrompts[0], 150);
  client::connection c(server.endpoint());
  std::vector<client::result> rs(4);
  for (uint64_t id = 1; id <= 4; ++id) c.generate(greedy(id, 150));
  while (rs[0].token_ids.empty() || rs[1].token_ids.empty()) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m);
    client::apply(*m, [&](uint64_t id) { return id >= 1 && id <= 4 ? &rs[id - 1] : nullptr; });
  }
  auto drain = server.admin_command("drain 1");
  EXPECT_EQ(drain.exit_code, 0) << drain.err;
  const auto inst = server.admin("instances");
  EXPECT_EQ(inst[0]["state"], "draining");
  EXPECT_EQ(inst[0]["running"].get<int>() + inst[0]["waiting"].get<int>(), 0) << inst[0].dump();
  EXPECT_EQ(inst[0]["used_pages"], 0);
  client::connection c2(server.endpoint());
  for (const auto& r : client::run(c2, {greedy(11, 8), greedy(12, 8)}, 60s)) {
    ASSERT_FALSE(r.error);
    EXPECT_EQ(r.finished.instances(0), 2u);
  }
  drain_results(c, rs, 1);
  int moved = 0;
  for (const auto& r : rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want);
    if (r.finished.instances_size() > 1) ++moved;
  }
  EXPECT_EQ(moved, 2);  // the two round-robin put on instance 1 moved
}

// How often `needle` stands in the node's log, polled until it stands
// there `want` times or 5 s pass: the node logs a refused handshake when
// its side ends, which may be after the refused peer has exited.
size_t count_in_log(const node_process& n, const std::string& needle, size_t want) {
  const auto until = clock_type::now() + 5s;
  for (;;) {
    const std::string log = n.stderr_text();
    size_t found = 0;
    for (auto at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1))
      ++found;
    if (found >= want || clock_type::now() >= until) return found;
    std::this_thread::sleep_for(20ms);
  }
}

// Refusals: a service with another secret cannot use a node (the node logs
// the peer's address) and, with no other node, does not start; a peer
// speaking no TLS is refused and logged; a node that cannot be reached is
// reported and the service starts with the rest.
TEST(ClusterNodes, PeersWithoutTheSecretAndDeadNodesAreRefusedAndReported) {
  secret_file good("cluster-test-secret-good"), bad("cluster-test-secret-other");
  node_process n1(good.path());
  auto r = run_process(troupe_bin() + " serve -m stories15m --listen 'tcp://127.0.0.1:*' --nodes " +
                       n1.address() + " --cluster-secret-file " + bad.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(n1.address()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no instance"), std::string::npos) << r.err;
  EXPECT_GE(count_in_log(n1, "refused a peer at 127.0.0.1:", 1), 1u) << n1.stderr_text();

  // Plain bytes (no TLS) at the node's port.
  {
    const int fd = connect_local(n1.port());
    ASSERT_GE(fd, 0);
    send_all(fd, std::string("GET / HTTP/1.0\r\n\r\n") + std::string(64, '\0'));
    std::this_thread::sleep_for(300ms);
    ::close(fd);
  }
  EXPECT_GE(count_in_log(n1, "refused a peer", 2), 2u) << n1.stderr_text();

  // A node that is not there is reported by address; the service starts
  // with the node it has.
  const std::string gone = "127.0.0.1:" + std::to_string(free_port());
  server_process server("--nodes " + n1.address() + "," + gone + " --cluster-secret-file " +
                        good.path());
  const auto err = server.stderr_text();
  EXPECT_NE(err.find("node " + gone + ": down: cannot connect"), std::string::npos) << err;
  const auto inst = server.admin("instances");
  ASSERT_EQ(inst.size(), 1u) << inst.dump();
  EXPECT_EQ(inst[0]["node"], n1.address());
  client::connection c(server.endpoint());
  auto res = client::run(c, {greedy(1, 8)}, 60s);
  EXPECT_FALSE(res.at(0).error);
}

// A node that dies while the service is starting on it (killed while it
// builds the service's instance): the service reports it by address with
// the reason, starts with the node it has, and serves.
TEST(ClusterNodes, ANodeDyingDuringStartUpIsReported) {
  secret_file secret("cluster-test-secret-startup");
  node_process n1(secret.path()), n2(secret.path());
  // The watcher kills node 2 from another thread while this one starts the
  // service (the service is this thread's child: PR_SET_PDEATHSIG ties it
  // to the thread that forked it).
  bool asked = false;
  std::thread watcher([&] {
    const auto until = clock_type::now() + 60s;
    while (!(asked = n2.stderr_text().find("asks for 1 instances") != std::string::npos) &&
           clock_type::now() < until)
      std::this_thread::sleep_for(2ms);
    n2.kill9();
  });
  std::unique_ptr<server_process> server;
  try {
    server = std::make_unique<server_process>("--nodes " + nodes_flag({&n1, &n2}) +
                                              " --cluster-secret-file " + secret.path());
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  watcher.join();
  ASSERT_TRUE(asked) << "the service never asked node 2 for its instance";
  ASSERT_TRUE(server);
  const auto err = server->stderr_text();
  EXPECT_NE(err.find("troupe serve: node " + n2.address() + ": down: lost"), std::string::npos)
      << err;
  EXPECT_NE(err.find("troupe serve: node " + n1.address() + ": up"), std::string::npos) << err;
  const auto inst = server->admin("instances");
  ASSERT_EQ(inst.size(), 1u) << inst.dump();
  EXPECT_EQ(inst[0]["node"], n1.address());
  client::connection c(server->endpoint());
  auto res = client::run(c, {greedy(1, 8)}, 60s);
  EXPECT_FALSE(res.at(0).error);
  const auto nodes = server->admin("nodes");
  bool reported = false;
  for (const auto& n : nodes)
    reported = reported || (n["address"] == n2.address() && n["state"] == "down");
  EXPECT_TRUE(reported) << nodes.dump();
}

// `spawn NODE N` through troupe shell: the node starts more instances for
// the service at run time; they join the router and serve.
TEST(ClusterNodes, SpawnStartsMoreInstancesOnANode) {
  secret_file secret("cluster-test-secret-spawn");
  node_process n1(secret.path());
  server_process server("--nodes " + n1.address() + " --cluster-secret-file " + secret.path() +
                        " --router round-robin");
  auto r = run_process(troupe_bin() + " shell --server " + shell_quote(server.endpoint()) +
                       " --exec " + shell_quote("spawn " + n1.address() + " 2 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = nlohmann::json::parse(r.out);
  EXPECT_EQ(got["instances"].size(), 3u) << got.dump();
  const auto inst = server.admin("instances");
  ASSERT_EQ(inst.size(), 3u) << inst.dump();
  for (const auto& i : inst) {
    EXPECT_EQ(i["node"], n1.address());
    EXPECT_EQ(i["state"], "serving");
  }
  // Round-robin puts three requests on the three instances.
  client::connection c(server.endpoint());
  std::set<uint64_t> used;
  for (uint64_t id = 1; id <= 3; ++id) {
    auto res = client::run(c, {greedy(id, 8)}, 60s);
    ASSERT_FALSE(res.at(0).error);
    used.insert(res.at(0).finished.instances(0));
  }
  EXPECT_EQ(used.size(), 3u);
  auto bad = run_process(troupe_bin() + " shell --server " + shell_quote(server.endpoint()) +
                         " --exec 'spawn " + n1.address() + " 0'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("give 1 to 64 instances"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace troupe::testing
