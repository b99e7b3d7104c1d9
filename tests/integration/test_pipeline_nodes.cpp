// Pipelined instances on `troupe node` processes (issue 35): a service
// whose [[cluster.node]] tables say pipeline_parallel = 2 gets, on each of
// two real nodes, an instance whose device is a pipeline of two stages;
// a greedy stream moved back and forth between the two nodes' pipelined
// instances keeps offline's tokens.  A table asking more stages than the
// model's layers is refused by the node, named.  Every child is killed by
// its pid, every wait bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "node_process.hpp"
#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

// A cluster config naming the nodes, each with one instance of `stages`.
std::string write_config(const secret_file& secret, const node_process& a, const node_process& b,
                         int stages) {
  const std::string cfg = "/tmp/troupe_pipeline_nodes_" + std::to_string(::getpid()) + "_" +
                          std::to_string(stages) + ".toml";
  std::FILE* f = std::fopen(cfg.c_str(), "w");
  std::fprintf(f, "[cluster]\nsecret_file = \"%s\"\n", secret.path().c_str());
  for (const auto* n : {&a, &b})
    std::fprintf(f,
                 "\n[[cluster.node]]\naddress = \"%s\"\ninstances = 1\nkv_mb = 32\n"
                 "pipeline_parallel = %d\n",
                 n->address().c_str(), stages);
  std::fclose(f);
  return cfg;
}

TEST(PipelineNodes, PipelinedInstancesOnTwoNodesKeepAMigratedStream) {
  secret_file secret("cluster-test-secret-pipeline-nodes");
  node_process n1(secret.path()), n2(secret.path());
  const auto want = offline_tokens("stories15m", "Once upon a time", 160);
  {
    const auto cfg = write_config(secret, n1, n2, 2);
    server_process server("--config " + cfg);
    std::remove(cfg.c_str());
    ASSERT_EQ(server.admin("instances").size(), 2u);
    client::connection c(server.endpoint());
    c.generate(greedy_request(7, "Once upon a time", 160));
    client::result r;
    auto find = [&](uint64_t id) { return id == 7 ? &r : nullptr; };
    ASSERT_TRUE(receive_until(
        c, find, [&] { return !r.token_ids.empty() || r.done(); }, 30s));
    const int moved = migrate_back_and_forth(server, c, r, find, 7, 9, 3);
    ASSERT_TRUE(receive_until(
        c, find, [&] { return r.done(); }, 60s));
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want);
    EXPECT_GE(moved, 1);
  }
  // Seven stages of six layers: the node refuses, and says why.
  const auto cfg = write_config(secret, n1, n2, 7);
  try {
    server_process server("--config " + cfg);
    ADD_FAILURE() << "a service of 7-stage pipelines of 6 layers started";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("more stages than the model's 6 layers"),
              std::string::npos)
        << e.what();
  }
  std::remove(cfg.c_str());
}

}  // namespace
}  // namespace troupe::testing
