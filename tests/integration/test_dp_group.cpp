// A data-parallel group of two replicas in one `troupe serve` (issue 15,
// item 4; REFERENCES.md 6.7): admission by most free KV, and under a
// skewed load (one replica's KV emptied by a finished long prompt while the
// other holds every decoding sequence) the group moves sequences to the
// idle replica.  Every request's tokens equal offline greedy, whether it
// moved or not; the MoE fixture runs its replicas in lockstep, so the idle
// replica runs dummy steps until work comes.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "node_process.hpp"
#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

const std::string kModel = "moe-8x2-skew";
const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog ran"};
constexpr int kTokens = 200;

// A prompt of about 190 tokens: the fixture's context is 256.
std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 17; ++i) p += "the little dog ran to the park and ";
  return p;
}

// The long prompt goes first (to replica 1, both empty); once it streams,
// every short request goes to replica 2, which has more free KV while the
// long one is there; when it ends (after 48 tokens) replica 1 is empty and
// replica 2 holds four decoding sequences.
std::vector<client::result> skewed_load(const server_process& server) {
  client::connection c(server.endpoint());
  std::vector<client::result> res(5);
  for (uint64_t id = 1; id <= 5; ++id) res[id - 1].request_id = id;
  auto find = [&](uint64_t id) { return id >= 1 && id <= 5 ? &res[id - 1] : nullptr; };
  c.generate(greedy_request(1, long_prompt(), 48));
  EXPECT_TRUE(receive_until(
      c, find, [&] { return !res[0].token_ids.empty() || res[0].done(); }, 30s));
  for (uint64_t id = 2; id <= 5; ++id) c.generate(greedy_request(id, kPrompts[id % 2], kTokens));
  EXPECT_TRUE(receive_until(
      c, find,
      [&] {
        for (const auto& r : res)
          if (!r.done()) return false;
        return true;
      },
      60s));
  return res;
}

// The moves under skewed_load: every request's tokens equal offline greedy,
// the moves seen in the requests are the group's, replica 1 took them and
// idled in lockstep meanwhile, and every page came back.
void expect_moves_keep_every_token(const server_process& server) {
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : kPrompts) want.push_back(offline_tokens(kModel, p, kTokens));
  const auto results = skewed_load(server);
  ASSERT_EQ(results.size(), 5u);
  int moved = 0;
  for (const auto& r : results) {
    ASSERT_FALSE(r.error) << "request " << r.request_id << ": " << r.error->message();
    if (r.request_id == 1) continue;
    EXPECT_EQ(r.token_ids, want[r.request_id % 2]) << "request " << r.request_id;
    // Each started on replica 2 (the first instance in its list).
    ASSERT_GE(r.finished.instances_size(), 1) << r.request_id;
    EXPECT_EQ(r.finished.instances(0), 2u) << "request " << r.request_id;
    moved += r.finished.instances_size() > 1 ? 1 : 0;
  }
  const auto dp = server.admin("dp");
  EXPECT_GE(dp["migrations"].get<int>(), 1) << dp.dump();
  EXPECT_EQ(moved, dp["migrations"].get<int>()) << dp.dump();
  EXPECT_TRUE(dp["config"]["lockstep"].get<bool>()) << "an MoE group steps together";
  EXPECT_GT(dp["rounds"].get<int>(), kTokens);
  ASSERT_EQ(dp["replicas"].size(), 2u);
  EXPECT_GE(dp["replicas"][0]["moved_in"].get<int>(), 1) << dp.dump();
  EXPECT_GT(dp["replicas"][0]["dummy_steps"].get<int>(), 0) << "replica 1 idled in lockstep";
  EXPECT_NE(dp["last_decision"].get<std::string>(), "");
  // Every page came back but the one each replica keeps for dummy steps.
  nlohmann::json inst;
  for (int i = 0; i < 100; ++i) {
    inst = server.admin("instances");
    bool settled = true;
    for (const auto& x : inst) settled = settled && x["used_pages"].get<int>() == 1;
    if (settled) break;
    std::this_thread::sleep_for(50ms);
  }
  for (const auto& x : inst) EXPECT_EQ(x["used_pages"].get<int>(), 1) << x.dump();
}

TEST(DpGroup, MovesSequencesFromTheLoadedReplicaAndKeepsEveryToken) {
  server_process server("--local-instances 2 --dp-group --dp-interval-ms 20 --kv-mb 16",
                        "troupe serve: listening on ", kModel);
  expect_moves_keep_every_token(server);
}

// The same group across processes: replica 1 in the server, replica 2 on a
// real `troupe node` (it joins the group when its node links); the lockstep
// rounds and the moves go over the cluster's TLS.
TEST(DpGroup, ANodesInstanceJoinsAndSequencesMoveAcrossProcesses) {
  secret_file secret("dp-group-test-secret");
  node_process node(secret.path());
  server_process server("--local-instances 1 --nodes " + node.address() +
                            " --cluster-secret-file " + secret.path() +
                            " --dp-group --dp-interval-ms 20 --kv-mb 16",
                        "troupe serve: listening on ", kModel);
  // The server waits for the node's link to settle before it listens; on
  // a loaded machine the first connect may time out, and the link retries
  // (within 5 s): a missing instance after that means the node was
  // refused or down: its reason is in the server's log, the node's side
  // in the node's.
  auto inst = server.admin("instances");
  for (int i = 0; i < 150 && inst.size() < 2; ++i) {
    std::this_thread::sleep_for(100ms);
    inst = server.admin("instances");
  }
  ASSERT_EQ(inst.size(), 2u) << inst.dump() << "\nserver stderr:\n"
                             << server.stderr_text() << "\nnode stderr:\n"
                             << node.stderr_text();
  EXPECT_EQ(inst[1]["node"], node.address()) << inst.dump();
  // The node's instance joins the group as its link reports it.
  nlohmann::json dp;
  for (int i = 0; i < 100; ++i) {
    dp = server.admin("dp");
    if (dp["replicas"].size() == 2 && dp["replicas"][1]["capacity_tokens"].get<int64_t>() > 0)
      break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(dp["replicas"].size(), 2u) << dp.dump();
  EXPECT_EQ(dp["replicas"][1]["state"], "serving") << dp.dump();
  expect_moves_keep_every_token(server);
}

TEST(DpGroup, WithoutRebalancingTheSkewStaysAndNothingMoves) {
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : kPrompts) want.push_back(offline_tokens(kModel, p, kTokens));
  server_process server(
      "--local-instances 2 --dp-group --dp-interval-ms 20 --dp-rebalance false --kv-mb 16",
      "troupe serve: listening on ", kModel);
  for (const auto& r : skewed_load(server)) {
    ASSERT_FALSE(r.error) << r.error->message();
    if (r.request_id == 1) continue;
    EXPECT_EQ(r.token_ids, want[r.request_id % 2]) << "request " << r.request_id;
    EXPECT_EQ(r.finished.instances_size(), 1);
  }
  const auto dp = server.admin("dp");
  EXPECT_EQ(dp["migrations"].get<int>(), 0);
  EXPECT_GT(dp["max_gap_tokens"].get<int>(), 4 * 10) << dp.dump();
  EXPECT_GT(dp["mean_gap_over_mean"].get<double>(), 1.0) << dp.dump();
}

}  // namespace
}  // namespace troupe::testing
