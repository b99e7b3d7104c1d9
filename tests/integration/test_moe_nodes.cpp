// Expert parallelism across processes (issue 15): a `troupe serve` whose
// engines spread the skewed MoE fixture's experts over two sub-devices each,
// one engine in the server and one on a real `troupe node`.  The expert
// controller reads both engines' loads and swaps experts in both with its
// two-phase protocol, the node's over the cluster's TLS, while requests
// stream; every request's tokens equal offline greedy.  An engine spawned on
// the node after the swap joins on the initial placement, and the
// controller brings it to its own.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "node_process.hpp"
#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

const std::string kModel = "moe-8x2-skew";
const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog ran"};
constexpr int kTokens = 64;

TEST(MoeNodes, TheControllerSwapsExpertsInANodesEngineUnderLoad) {
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : kPrompts) want.push_back(offline_tokens(kModel, p, kTokens));
  secret_file secret("moe-nodes-test-secret");
  node_process node(secret.path());
  server_process server("--local-instances 1 --nodes " + node.address() +
                            " --cluster-secret-file " + secret.path() +
                            " --expert-devices 2 --expert-threshold 1.05 "
                            "--expert-interval-ms 20 --router round-robin",
                        "troupe serve: listening on ", kModel);
  // The node's engine joins the controller as its instance joins the router.
  nlohmann::json ex;
  for (int i = 0; i < 100; ++i) {
    ex = server.admin("experts");
    if (ex["engines"] == 2) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(ex["engines"], 2) << ex.dump();
  EXPECT_EQ(ex["devices"], 2) << ex.dump();

  // Rounds of requests from two client processes (round-robin: both
  // engines serve) until a swap has happened and a round ran after it.
  int rounds_after_swap = 0;
  for (int round = 0; round < 30 && rounds_after_swap < 1; ++round) {
    const bool swapped = server.admin("experts")["swaps"].get<int>() > 0;
    std::vector<std::future<process_result>> clients;
    for (int c = 0; c < 2; ++c) {
      std::string cmd = troupe_bin() + " client --server " + shell_quote(server.endpoint()) +
                        " -n " + std::to_string(kTokens) + " --ignore-eos --json";
      for (int i = 0; i < 4; ++i) cmd += " -p " + shell_quote(kPrompts[(c + i) % 2]);
      clients.push_back(std::async(std::launch::async, [cmd] { return run_process(cmd); }));
    }
    std::set<uint64_t> used;
    for (int c = 0; c < 2; ++c) {
      auto r = clients[c].get();
      ASSERT_EQ(r.exit_code, 0) << r.err;
      std::istringstream lines(r.out);
      int i = 0;
      for (std::string line; std::getline(lines, line); ++i) {
        auto j = nlohmann::json::parse(line);
        EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), want[(c + i) % 2])
            << "round " << round << ": " << line;
        for (auto id : j["usage"]["instances"]) used.insert(id.get<uint64_t>());
      }
      EXPECT_EQ(i, 4);
    }
    EXPECT_EQ(used, (std::set<uint64_t>{1, 2})) << "both engines serve";
    if (swapped) ++rounds_after_swap;
  }
  ex = server.admin("experts");
  EXPECT_GE(ex["swaps"].get<int>(), 1) << ex.dump();
  EXPECT_EQ(ex["aborted"].get<int>(), 0) << ex.dump();
  EXPECT_EQ(ex["engines"], 2) << ex.dump();
  std::printf("[moe-nodes] %d swap(s) over 2 engines (one on a node): imbalance %.3f -> %.3f\n",
              ex["swaps"].get<int>(), ex["last_before"].get<double>(),
              ex["last_after"].get<double>());

  // A third engine, on the node, at run time: it reports the initial
  // placement (epoch 0) until the controller aligns it.
  auto spawn = run_process(troupe_bin() + " shell --server " + shell_quote(server.endpoint()) +
                           " --exec " + shell_quote("spawn " + node.address() + " 1"));
  ASSERT_EQ(spawn.exit_code, 0) << spawn.out << spawn.err;
  const uint64_t epoch = ex["epoch"].get<uint64_t>();
  bool aligned = false;
  for (int i = 0; i < 200 && !aligned; ++i) {
    ex = server.admin("experts");
    const auto epochs = ex["engine_epochs"].get<std::vector<uint64_t>>();
    aligned = epochs.size() == 3 && ex["aligned"].get<int>() >= 1;
    for (const auto e : epochs) aligned = aligned && e == ex["epoch"].get<uint64_t>();
    if (!aligned) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(aligned) << ex.dump();
  EXPECT_GE(ex["epoch"].get<uint64_t>(), epoch);
  // The three engines answer as offline greedy (the new one is id 3).
  auto r =
      run_process(troupe_bin() + " client --server " + shell_quote(server.endpoint()) + " -n " +
                  std::to_string(kTokens) + " --ignore-eos --json -p " + shell_quote(kPrompts[0]) +
                  " -p " + shell_quote(kPrompts[1]) + " -p " + shell_quote(kPrompts[0]));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  int i = 0;
  for (std::string line; std::getline(lines, line); ++i)
    EXPECT_EQ(nlohmann::json::parse(line)["token_ids"].get<std::vector<int32_t>>(), want[i % 2])
        << line;
  EXPECT_EQ(i, 3);
}

}  // namespace
}  // namespace troupe::testing
