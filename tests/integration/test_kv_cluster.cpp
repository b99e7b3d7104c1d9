// The KV store across processes (issue 39): nodes connect to each other,
// a migrated sequence's KV goes node to node (the service process never
// reads it), a request keeps copies of its KV on another node and resumes
// from them after kill -9 of its own, and a prompt pulls its pages from
// the store of the node that holds them.  Real `troupe node` processes on
// 127.0.0.1, stories15M; every child is killed by its pid at the end and
// every wait is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
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

// About 110 tokens of stories15M: several 16-token pages of prompt.
const std::string kLongPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "sunshine. One day, she saw a big red ball in the park. She ran to the ball and kicked it "
    "very hard. The ball went up into the sky and came down in a tree. Lily was sad because she "
    "could not reach the ball. Her friend Tom came and helped her climb the tree to get it.";

std::string nodes_flag(const std::vector<const node_process*>& nodes) {
  std::string s;
  for (const auto* n : nodes) {
    if (!s.empty()) s += ',';
    s += n->address();
  }
  return s;
}

// Bytes the process has read through read()/recv() so far (its sockets
// included): /proc/PID/io's rchar.
uint64_t bytes_read(pid_t pid) {
  const std::string io = slurp("/proc/" + std::to_string(pid) + "/io");
  const auto at = io.find("rchar: ");
  return at == std::string::npos ? 0 : std::stoull(io.substr(at + 7));
}

// The node address of instance `id` (admin instances).
std::string node_of(const server_process& server, uint64_t id) {
  for (const auto& i : server.admin("instances"))
    if (i["id"].get<uint64_t>() == id) return i["node"].get<std::string>();
  return "";
}

nlohmann::json instance(const server_process& server, uint64_t id) {
  for (const auto& i : server.admin("instances"))
    if (i["id"].get<uint64_t>() == id) return i;
  return {};
}

// Each node connects to the other; a long sequence migrated between them
// moves its KV node to node: the service process reads far less than the
// blob while it moves, and the stream keeps its tokens.
TEST(KvCluster, MigrationMovesTheKvNodeToNode) {
  secret_file secret("kv-cluster-direct");
  node_process n1(secret.path()), n2(secret.path());
  server_process server("--nodes " + nodes_flag({&n1, &n2}) + " --cluster-secret-file " +
                        secret.path() + " --router round-robin");
  // One of them connected to the other (the one whose address sorts after
  // the other's), while their instances loaded.
  const auto until = clock_type::now() + 20s;
  nlohmann::json nodes;
  auto peers = [&] { return nodes[0]["peers"].size() + nodes[1]["peers"].size(); };
  while (clock_type::now() < until) {
    nodes = server.admin("nodes");
    if (nodes.size() == 2 && peers() == 1) break;
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_EQ(nodes.size(), 2u);
  ASSERT_EQ(peers(), 1u) << nodes.dump();
  const int later = nodes[0]["address"] > nodes[1]["address"] ? 0 : 1;
  EXPECT_EQ(nodes[later]["peers"], nlohmann::json::array({nodes[1 - later]["address"]}))
      << nodes.dump();

  const auto want = offline_tokens("stories15m", kLongPrompt, 120);
  client::connection c(server.endpoint());
  c.generate(greedy_request(7, kLongPrompt, 120));
  client::result r;
  auto find = [&](uint64_t id) { return id == 7 ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.token_ids.size() >= 60 || r.done(); }, 30s));
  ASSERT_FALSE(r.done());
  const uint64_t before = bytes_read(server.pid());
  const auto where = server.admin("trace 7")["instances"].back().get<uint64_t>();
  auto res = server.admin_command("migrate 7 " + std::string(where == 1 ? "2" : "1"));
  ASSERT_EQ(res.exit_code, 0) << res.err;
  const uint64_t during = bytes_read(server.pid()) - before;
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.done(); }, 60s));
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
  const auto t = server.admin("trace 7");
  EXPECT_EQ(t["migrations"].get<int>(), 1) << t.dump();
  const uint64_t blob = t["migrated_bytes"].get<uint64_t>();
  // 170+ tokens of 6 layers x 6 heads x 48 x K,V in f16: over a megabyte.
  EXPECT_GT(blob, 1000000u);
  // What the service read meanwhile: token batches, stats, the admin call.
  EXPECT_LT(during, blob / 4) << "the blob went through the service process";
  std::printf("[ kv ] migration of %llu bytes: the service process read %llu bytes meanwhile\n",
              static_cast<unsigned long long>(blob), static_cast<unsigned long long>(during));
}

// kill -9 of the node a request runs on, with KV copies on: the request
// resumes on the other node from the copy (its trace counts the tokens
// loaded from the store), and its greedy tokens equal an uninterrupted run.
TEST(KvCluster, KillNineResumesFromTheKvCopies) {
  secret_file secret("kv-cluster-copies");
  node_process n1(secret.path()), n2(secret.path());
  server_process server("--nodes " + nodes_flag({&n1, &n2}) + " --cluster-secret-file " +
                        secret.path() +
                        " --router round-robin --kv-host-mb 64 --kv-copy always --kv-copy-pages 2");
  const auto want = offline_tokens("stories15m", kLongPrompt, 150);
  // Round-robin places the first request on instance 1: its node dies.
  const std::string node = node_of(server, 1);
  client::connection c(server.endpoint());
  c.generate(greedy_request(3, kLongPrompt, 150));
  client::result r;
  auto find = [&](uint64_t id) { return id == 3 ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.token_ids.size() >= 40 || r.done(); }, 30s));
  ASSERT_FALSE(r.done());
  (node == n1.address() ? n1 : n2).kill9();
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.done(); }, 60s));
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
  const auto t = server.admin("trace 3");
  EXPECT_EQ(t["recoveries"].get<int>(), 1) << t.dump();
  EXPECT_EQ(t["instances"], nlohmann::json::array({1, 2})) << t.dump();
  // The resumed admission loaded the copied pages, generated tokens' too:
  // 40 tokens had streamed (132 tokens: 8 full pages, copied two at a
  // time, the last pair perhaps not yet), so at least 6 of the 7 full
  // pages before the last token (92 of them prompt: 5 pages).
  EXPECT_GE(t["tier_tokens"].get<int>(), 96) << t.dump();
  const auto resumed = instance(server, 2);
  EXPECT_GE(resumed["loaded_pages"].get<uint64_t>(), 6u) << resumed.dump();
}

// Three nodes with stores: a prompt's pages copied to node 2 are pulled
// by node 3's instance when the same prompt is placed there, instead of
// computed; the answer is the same.
TEST(KvCluster, APromptPullsItsPagesFromAnotherNodesStore) {
  secret_file secret("kv-cluster-pull");
  node_process n1(secret.path()), n2(secret.path()), n3(secret.path());
  server_process server("--nodes " + nodes_flag({&n1, &n2, &n3}) + " --cluster-secret-file " +
                        secret.path() +
                        " --router round-robin --kv-host-mb 64 --kv-copy always --kv-copy-pages 2");
  const auto want = offline_tokens("stories15m", kLongPrompt, 16);
  client::connection c(server.endpoint());
  // Round-robin: instance 1 (copies to node 2's store), then instance 2
  // (another prompt), then instance 3.
  auto first = client::run(c, {greedy_request(1, kLongPrompt, 16)}, 60s).at(0);
  ASSERT_FALSE(first.error) << first.error->message();
  EXPECT_EQ(first.token_ids, want);
  auto filler = client::run(c, {greedy_request(2, "Tom had a small dog called Max", 8)}, 60s);
  ASSERT_FALSE(filler.at(0).error);
  // The router hears of node 2's store in its next polls.
  std::this_thread::sleep_for(1s);
  auto third = client::run(c, {greedy_request(3, kLongPrompt, 16)}, 60s).at(0);
  ASSERT_FALSE(third.error) << third.error->message();
  EXPECT_EQ(third.token_ids, want);
  const auto t = server.admin("trace 3");
  EXPECT_EQ(t["instances"][0].get<uint64_t>(), 3u) << t.dump();
  EXPECT_NE(t["placement"].get<std::string>().find("pulls"), std::string::npos) << t.dump();
  // Every full page before the one holding the prompt's last token.
  const int pages = (t["prompt_tokens"].get<int>() - 1) / 16;
  EXPECT_GE(pages, 5);
  EXPECT_EQ(t["tier_tokens"].get<int>(), pages * 16) << t.dump();
  EXPECT_EQ(instance(server, 3)["pulled_pages"].get<int>(), pages);
  // The link it pulled over, measured for the router's next pull rule:
  // one store, every pulled page, some time.
  const auto links = instance(server, 3)["pull_links"];
  ASSERT_EQ(links.size(), 1u) << links.dump();
  EXPECT_EQ(links[0]["pages"].get<int>(), pages) << links.dump();
  EXPECT_GT(links[0]["ms"].get<double>(), 0.0) << links.dump();
}

}  // namespace
}  // namespace troupe::testing
