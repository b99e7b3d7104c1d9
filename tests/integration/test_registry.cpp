// An elastic cluster through a real etcd (issue 37): `troupe node`s
// register under a lease, `troupe serve`s read the registry and take nodes
// as they come and go, while serving.  Real processes on 127.0.0.1 (etcd
// from Debian's etcd-server, troupe nodes and services); every child is
// killed by its pid when its object goes, pass or fail; every wait is
// bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "etcd_process.hpp"
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

const std::string kPrompt = "Once upon a time, there was a little girl named Lily";

// A node's lease: short, so a killed node leaves the registry within seconds.
const std::string kNodeFlags = " --registry-ttl-s 2";

bool have_etcd() {
  return run_process("command -v etcd").exit_code == 0;
}

// One greedy request to completion.
client::result run_one(const std::string& endpoint, uint64_t id, int tokens) {
  client::connection c(endpoint);
  auto rs = client::run(c, {greedy_request(id, kPrompt, tokens)}, 90s);
  return rs.at(0);
}

// The service's nodes by address -> state.
std::map<std::string, std::string> node_states(const server_process& s) {
  std::map<std::string, std::string> out;
  for (const auto& n : s.admin("nodes")) out[n["address"]] = n["state"];
  return out;
}

// Waits (bounded) until `pred(node_states)` holds; the last states seen.
template <class Pred>
std::map<std::string, std::string> wait_nodes(const server_process& s, Pred pred,
                                              std::chrono::seconds limit) {
  const auto until = clock_type::now() + limit;
  auto states = node_states(s);
  while (!pred(states) && clock_type::now() < until) {
    std::this_thread::sleep_for(200ms);
    states = node_states(s);
  }
  return states;
}

std::string dump(const std::map<std::string, std::string>& m) {
  std::string s;
  for (const auto& [a, st] : m) s += a + "=" + st + " ";
  return s.empty() ? "(none)" : s;
}

// `n` greedy streams of `tokens` on one connection.
struct streams {
  explicit streams(const std::string& endpoint, int n, int tokens, uint64_t first = 1)
      : c(endpoint), rs(size_t(n)), first(first) {
    for (int i = 0; i < n; ++i) c.generate(greedy_request(first + uint64_t(i), kPrompt, tokens));
  }
  client::result* find(uint64_t id) {
    return id >= first && id < first + rs.size() ? &rs[id - first] : nullptr;
  }
  bool all_started(size_t k) const {
    for (const auto& r : rs)
      if (r.token_ids.size() < k && !r.done()) return false;
    return true;
  }
  bool all_done() const {
    for (const auto& r : rs)
      if (!r.done()) return false;
    return true;
  }
  ::testing::AssertionResult wait_started(size_t k) {
    if (receive_until(
            c, [this](uint64_t id) { return find(id); }, [&] { return all_started(k); }, 60s))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "streams did not start";
  }
  ::testing::AssertionResult finish() {
    if (receive_until(
            c, [this](uint64_t id) { return find(id); }, [&] { return all_done(); }, 90s))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "no message for 90 s";
  }
  client::connection c;
  std::vector<client::result> rs;
  uint64_t first;
};

// Each test: a real etcd of its own, a cluster secret, and the flags that
// point nodes (short leases) and services at them.
class Registry : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(have_etcd()) << "etcd is missing: bash tools/setup.sh deps installs etcd-server";
    etcd = std::make_unique<etcd_process>();
    node_reg = " --registry " + etcd->url() + kNodeFlags;
    reg = " --registry " + etcd->url() + " --cluster-secret-file " + secret.path();
  }
  secret_file secret{"cluster-test-secret-registry"};
  std::unique_ptr<etcd_process> etcd;
  std::string node_reg, reg;
};

// A node started on a thread that lives until the test ends (a child dies
// with the thread that forked it): for a node that must come after a
// service whose start waits for it.
class late_node {
 public:
  late_node(std::string secret, std::string args, std::chrono::milliseconds after)
      : thread_([this, secret, args, after] {
          std::this_thread::sleep_for(after);
          try {
            node_ = std::make_unique<node_process>(secret, args);
          } catch (const std::exception& e) {
            error_ = e.what();
          }
          started_.set_value();
          end_.get_future().wait();
          node_.reset();
        }) {}
  ~late_node() {
    end_.set_value();
    thread_.join();
  }
  node_process& get() {
    started_seen_.wait();
    if (!node_) throw std::runtime_error("the late node did not start: " + error_);
    return *node_;
  }

 private:
  std::unique_ptr<node_process> node_;
  std::string error_;
  std::promise<void> started_, end_;
  std::shared_future<void> started_seen_ = started_.get_future().share();
  std::thread thread_;
};

// A service started with no node at all takes a node started after it;
// a second node joins under load; the first is killed -9 and its requests
// recover on the second, then it leaves the registry; a second service
// shares the remaining node's instances; the first service is killed -9
// while both stream there, and the second's streams go on untouched.
TEST_F(Registry, NodesJoinAndLeaveServicesWhileTheyServe) {
  const auto want = offline_tokens("stories15m", kPrompt, 120);

  late_node n1(secret.path(), node_reg, 1500ms);
  auto s1 = std::make_unique<server_process>(reg + " --router round-robin");
  EXPECT_NE(s1->stderr_text().find("no instance yet; waiting for a node to join"),
            std::string::npos)
      << s1->stderr_text();
  {
    auto r = run_one(s1->endpoint(), 1, 40);
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, std::vector<int32_t>(want.begin(), want.begin() + 40));
  }

  // A second node joins while 8 streams run.
  streams load(s1->endpoint(), 8, 120, 10);
  ASSERT_TRUE(load.wait_started(4));
  node_process n2(secret.path(), node_reg + " --instances 2");
  auto states = wait_nodes(
      *s1, [&](const auto& m) { return m.count(n2.address()) && m.at(n2.address()) == "up"; }, 60s);
  ASSERT_EQ(states[n2.address()], "up") << dump(states);
  ASSERT_EQ(s1->admin("instances").size(), 3u);

  // The first node dies: its streams recover on the second, and the
  // registry's lease (2 s) takes it out of the service.
  n1.get().kill9();
  ASSERT_TRUE(load.finish());
  for (const auto& r : load.rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
  }
  states = wait_nodes(
      *s1, [&](const auto& m) { return !m.count(n1.get().address()); }, 30s);
  EXPECT_FALSE(states.count(n1.get().address()))
      << "the dead node is still listed: " << dump(states);
  for (const auto& i : s1->admin("instances")) EXPECT_EQ(i["node"], n2.address());

  {  // s1 serves on the remaining node (its streams may have ended on the first)
    auto r = run_one(s1->endpoint(), 150, 40);
    ASSERT_FALSE(r.error) << r.error->message();
  }
  // A second service finds the remaining node in the registry and shares
  // its instances: the node starts none for it, and the second service
  // sees the requests the first one finished there.
  server_process s2(reg);
  states = node_states(s2);
  EXPECT_EQ(states, (std::map<std::string, std::string>{{n2.address(), "up"}})) << dump(states);
  std::this_thread::sleep_for(2500ms);  // past the link's resource refresh (2 s)
  EXPECT_EQ(s2.admin("nodes").at(0)["hosted"], 2) << "the node started instances for s2";
  auto sum = [](const nlohmann::json& instances, const char* key) {
    int64_t n = 0;
    for (const auto& i : instances) n += i[key].get<int64_t>();
    return n;
  };
  EXPECT_GE(sum(s2.admin("instances"), "finished"), 1)
      << "s2 does not see s1's requests: " << s2.admin("instances").dump();
  // Both services stream through the same instances; the first dies
  // under load, and the second's streams go on where they are.
  streams on_s1(s1->endpoint(), 4, 120, 200);
  streams on_s2(s2.endpoint(), 4, 120, 100);
  ASSERT_TRUE(on_s1.wait_started(4));
  ASSERT_TRUE(on_s2.wait_started(4));
  s1.reset();
  ASSERT_TRUE(on_s2.finish());
  for (const auto& r : on_s2.rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
    EXPECT_EQ(r.finished.instances_size(), 1) << "a stream of the second service moved";
  }
  // The dead service's sequences leave the shared instances (their sinks
  // are gone), and the node keeps serving the second.
  const auto until = clock_type::now() + 30s;
  auto held = [&] {
    auto is = s2.admin("instances");
    return sum(is, "running") + sum(is, "waiting");
  };
  while (held() > 0 && clock_type::now() < until) std::this_thread::sleep_for(200ms);
  EXPECT_EQ(held(), 0) << "the dead service's sequences stay on the shared instances";
  auto r = run_one(s2.endpoint(), 300, 120);
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
}

// etcd dies under load: serving goes on with the nodes known; a node
// started meanwhile cannot register.  etcd returns: the new node registers
// and joins, and the first node's registration goes on (it stays).
TEST_F(Registry, ServingOutlivesAnEtcdOutage) {
  const auto want = offline_tokens("stories15m", kPrompt, 120);
  node_process n1(secret.path(), node_reg);
  server_process s(reg);
  streams load(s.endpoint(), 4, 120);
  ASSERT_TRUE(load.wait_started(4));
  etcd->kill9();
  ASSERT_TRUE(load.finish());
  for (const auto& r : load.rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want);
  }
  // Longer than the lease: the service keeps the node it knew.
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(node_states(s), (std::map<std::string, std::string>{{n1.address(), "up"}}));
  {
    auto r = run_one(s.endpoint(), 50, 120);
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want);
  }
  node_process n2(secret.path(), node_reg);
  EXPECT_NE(n2.stderr_text().find("not yet registered"), std::string::npos) << n2.stderr_text();

  etcd->start();
  auto states = wait_nodes(
      s, [&](const auto& m) { return m.size() == 2 && m.at(n2.address()) == "up"; }, 60s);
  EXPECT_EQ(states,
            (std::map<std::string, std::string>{{n1.address(), "up"}, {n2.address(), "up"}}))
      << dump(states);
  // Both registered again, so both stay (a few lease periods later).
  std::this_thread::sleep_for(5s);
  EXPECT_EQ(node_states(s).size(), 2u) << dump(node_states(s));
}

// The cluster's global state in etcd: a node publishes its load and KV
// summary, a service its endpoints and load, at every renewal; `troupe
// cluster` shows them; `troupe client --server etcd://...` finds the
// services there (the least loaded first); a service that stops withdraws
// its record, one killed -9 leaves with its lease.
TEST_F(Registry, GlobalStateIsPublishedAndClientsFindServicesThere) {
  const auto want = offline_tokens("stories15m", kPrompt, 120);
  node_process n1(secret.path(), node_reg + " --instances 2");
  auto s1 = std::make_unique<server_process>(reg + kNodeFlags);
  auto s2 = std::make_unique<server_process>(reg + kNodeFlags);
  const std::string url = etcd->url();
  auto cluster = [&] {
    auto r = run_process(troupe_bin() + " cluster --registry " + url + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)
                            : nlohmann::json{{"nodes", nlohmann::json::array()},
                                             {"services", nlohmann::json::array()}};
  };
  // Bounded wait until `pred(cluster view)` holds; the last view.
  auto wait_view = [&](auto pred, std::chrono::seconds limit) {
    const auto until = clock_type::now() + limit;
    auto v = cluster();
    while (!pred(v) && clock_type::now() < until) {
      std::this_thread::sleep_for(300ms);
      v = cluster();
    }
    return v;
  };
  // Both services up, and the node's record renewed since its instances
  // are (a renewal every 0.67 s with a 2 s lease).
  auto v = wait_view(
      [](const auto& v) {
        return v["services"].size() == 2 && v["nodes"].size() == 1 &&
               v["nodes"][0]["load"]["instances"] == 2;
      },
      15s);
  ASSERT_EQ(v["services"].size(), 2u) << v.dump();
  ASSERT_EQ(v["nodes"].size(), 1u) << v.dump();
  std::set<std::string> eps;
  for (const auto& sv : v["services"]) eps.insert(sv["endpoints"][0].get<std::string>());
  EXPECT_EQ(eps, (std::set<std::string>{s1->endpoint(), s2->endpoint()}));
  // The two services share the node's two instances (a renewal later
  // still 2, not 4).
  std::this_thread::sleep_for(1500ms);
  v = cluster();
  ASSERT_EQ(v["nodes"].size(), 1u) << v.dump();
  EXPECT_EQ(v["nodes"][0]["load"]["instances"], 2) << v.dump();
  EXPECT_GT(v["nodes"][0]["load"]["total_pages"].get<int64_t>(), 0) << v.dump();

  // Under load the records say so (within a few renewals).  On a loaded
  // machine a burst can end between two renewals: up to three bursts of
  // 16 streams of 200 tokens.
  bool seen = false;
  for (int burst = 0; burst < 3 && !seen; ++burst) {
    streams load(s1->endpoint(), 16, 200, 10 + 100 * uint64_t(burst));
    ASSERT_TRUE(load.wait_started(2));
    v = wait_view(
        [](const auto& v) {
          return v["nodes"].size() == 1 && v["nodes"][0]["load"]["running"].template get<int>() > 0;
        },
        10s);
    seen = v["nodes"].size() == 1 && v["nodes"][0]["load"]["running"].get<int>() > 0;
    ASSERT_TRUE(load.finish());
  }
  EXPECT_TRUE(seen) << v.dump();

  // A client finds the services in the registry.
  auto r = run_process(troupe_bin() + " client --server " + url + " -p " + shell_quote(kPrompt) +
                       " -n 120 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].get<std::vector<int32_t>>(), want);

  // s1 stops: its record is withdrawn at once; s2 is killed -9: its
  // record leaves with its lease (2 s); clients then find none.
  s1->signal(SIGTERM);
  v = wait_view([](const auto& v) { return v["services"].size() == 1; }, 15s);
  ASSERT_EQ(v["services"].size(), 1u) << v.dump();
  EXPECT_EQ(v["services"][0]["endpoints"][0], s2->endpoint());
  s1.reset();
  s2.reset();
  v = wait_view([](const auto& v) { return v["services"].empty(); }, 15s);
  EXPECT_TRUE(v["services"].empty()) << v.dump();
  auto none = run_process(troupe_bin() + " client --server " + url + " -p hi -n 4");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("lists no service"), std::string::npos) << none.err;
}

// By hand: `node add` takes a node that is not registered, `node remove`
// drains a node's requests elsewhere and releases its instances; a removed
// registered node is not taken again while it stays registered.
TEST_F(Registry, NodeAddAndRemoveByHand) {
  const auto want = offline_tokens("stories15m", kPrompt, 120);
  node_process n1(secret.path(), node_reg);
  node_process loose(secret.path());  // not in the registry
  server_process s(reg + " --metrics-port " + std::to_string(free_port()),
                   "troupe serve: metrics on ");
  ASSERT_NE(s.metrics_port(), 0) << s.startup_text();
  auto shell = [&](const std::string& cmds) {
    return run_process(troupe_bin() + " shell --server " + shell_quote(s.endpoint()) +
                       " --admin-timeout-ms 120000 -e " + shell_quote(cmds));
  };
  auto added = shell("node add " + loose.address() + " 2");
  ASSERT_EQ(added.exit_code, 0) << added.out << added.err;
  EXPECT_EQ(node_states(s),
            (std::map<std::string, std::string>{{n1.address(), "up"}, {loose.address(), "up"}}));
  ASSERT_EQ(s.admin("instances").size(), 3u);
  std::vector<std::string> n1_series;  // its instances' label in /metrics
  for (const auto& i : s.admin("instances"))
    if (i["node"] == n1.address())
      n1_series.push_back("instance=\"" + i["name"].get<std::string>() + "\"");
  ASSERT_FALSE(n1_series.empty());
  auto metrics_name = [&](const std::string& label) {
    return http_get(s.metrics_port(), "/metrics").find(label) != std::string::npos;
  };
  for (int tries = 0; tries < 50 && !metrics_name(n1_series[0]); ++tries)
    std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(metrics_name(n1_series[0])) << "the node's instance has no series yet";

  streams load(s.endpoint(), 6, 120);
  ASSERT_TRUE(load.wait_started(4));
  auto removed = shell("node remove " + n1.address());
  ASSERT_EQ(removed.exit_code, 0) << removed.out << removed.err;
  EXPECT_NE(removed.out.find("drained"), std::string::npos) << removed.out;
  ASSERT_TRUE(load.finish());
  for (const auto& r : load.rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want);
  }
  std::this_thread::sleep_for(2s);  // four registry reads: it stays out
  EXPECT_EQ(node_states(s), (std::map<std::string, std::string>{{loose.address(), "up"}}));
  // Its instances' series leave /metrics (a probe found them served forever).
  for (const auto& label : n1_series) {
    for (int tries = 0; tries < 50 && metrics_name(label); ++tries)
      std::this_thread::sleep_for(200ms);
    if (!metrics_name(label)) continue;
    std::string lines, text = http_get(s.metrics_port(), "/metrics");
    for (size_t at = text.find(label); at != std::string::npos; at = text.find(label, at + 1))
      lines += text.substr(text.rfind('\n', at) + 1, text.find('\n', at) - text.rfind('\n', at));
    ADD_FAILURE() << label << " still in /metrics:\n" << lines;
  }
  auto again = shell("node remove " + n1.address());
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE((again.out + again.err).find("no node " + n1.address()), std::string::npos)
      << again.out << again.err;
  // Added by hand again, it serves again.
  ASSERT_EQ(shell("node add " + n1.address()).exit_code, 0);
  EXPECT_EQ(node_states(s).size(), 2u);
}

// Issue 37 item 5: autoscaling on two nodes of this machine (2 cores each:
// up to 2 instances a node).  The service starts with one instance on
// each; a load step (40 greedy streams, 2 sequences an instance) starts
// instances up to the maximum of 4; once the load is gone they are retired
// (drained first) back to 2.  Every stream equals offline greedy; the
// share of requests whose first token came within 2 s is printed.
TEST_F(Registry, AutoscalingGrowsUnderALoadStepAndShrinksAfter) {
  const auto want = offline_tokens("stories15m", kPrompt, 160);
  node_process n1(secret.path(), node_reg), n2(secret.path(), node_reg);
  server_process s(reg +
                   " --autoscale 2:4 --max-seqs 2 --window-ms 500 --autoscale-cooldown-s 2 "
                   "--ttft-target-ms 600000");
  EXPECT_NE(s.stderr_text().find("autoscaling 2:4 instances"), std::string::npos);
  auto count = [&] { return s.admin("instances").size(); };
  const auto until = clock_type::now() + 60s;
  while (count() < 2 && clock_type::now() < until) std::this_thread::sleep_for(200ms);
  ASSERT_EQ(count(), 2u);

  // Watch the fleet while the load runs.
  std::atomic<bool> stop{false};
  std::atomic<size_t> most{0};
  std::thread watcher([&] {
    while (!stop) {
      try {
        most = std::max(most.load(), count());
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(300ms);
    }
  });
  streams load(s.endpoint(), 40, 160);
  const bool finished = load.finish();
  stop = true;
  watcher.join();
  ASSERT_TRUE(finished);
  int fast = 0;
  for (const auto& r : load.rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
    fast += r.finished.ttft_ms() < 2000 ? 1 : 0;
  }
  EXPECT_EQ(most.load(), 4u) << s.stderr_text();
  // Queued requests of the full instances moved to the new ones.
  EXPECT_NE(s.stderr_text().find("queued requests of full instance"), std::string::npos);
  std::printf("[ autoscale ] most instances %zu; TTFT within 2 s: %d of %zu requests\n",
              most.load(), fast, load.rs.size());
  RecordProperty("ttft_within_2s", std::to_string(fast) + "/" + std::to_string(load.rs.size()));

  // Idle: back to the minimum, one retirement per cooldown.
  const auto back = clock_type::now() + 60s;
  while (count() > 2 && clock_type::now() < back) std::this_thread::sleep_for(300ms);
  EXPECT_EQ(count(), 2u) << s.stderr_text();
  EXPECT_NE(s.stderr_text().find("retire instance"), std::string::npos);
  // Still serving, equal to offline.
  auto r = run_one(s.endpoint(), 500, 160);
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
}

}  // namespace
}  // namespace troupe::testing
