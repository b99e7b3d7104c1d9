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
    const auto inst = server.wait_instances(2, std::chrono::seconds(30));
    ASSERT_EQ(inst.size(), 2u) << inst.dump() << "\nserver: " << server.stderr_text();
    client::connection c(server.endpoint());
    // A stream of 160 tokens can end before the first `admin migrate` (a
    // process of its own) lands on a loaded 2-core host: then the stream
    // is sent again, up to 3 times, until one was moved mid-stream.  Every
    // stream must keep offline's tokens.
    int moved = 0;
    for (uint64_t id = 7; id < 10 && moved == 0; ++id) {
      c.generate(greedy_request(id, "Once upon a time", 160));
      client::result r;
      auto find = [&](uint64_t got) { return got == id ? &r : nullptr; };
      ASSERT_TRUE(receive_until(
          c, find, [&] { return !r.token_ids.empty() || r.done(); }, 30s));
      moved = migrate_back_and_forth(server, c, r, find, id, 9, 3);
      ASSERT_TRUE(receive_until(
          c, find, [&] { return r.done(); }, 60s));
      ASSERT_FALSE(r.error) << r.error->message();
      EXPECT_EQ(r.token_ids, want) << "request " << id;
    }
    EXPECT_GE(moved, 1) << "no stream of three was moved before it ended";
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

// A pipelined instance of `troupe serve` whose second stage runs on a
// `troupe node` (engine.pipeline_nodes): a greedy stream keeps offline's
// tokens while an admin `layers` command moves a layer onto the node's
// stage mid-stream (the new stage loads on the node, its KV copied there).
// Bad moves are refused, named.
TEST(PipelineNodes, AStageOnANodeKeepsOfflineTokensThroughALayerMoveByHand) {
  secret_file secret("cluster-test-secret-pipeline-stage");
  node_process n1(secret.path());
  const auto want = offline_tokens("stories15m", "Once upon a time", 160);
  // The pipeline's own migration off: its moves would race the one asked for.
  server_process server("--pipeline-parallel 2 --pipeline-nodes local," + n1.address() +
                        " --cluster-secret-file " + secret.path() +
                        " --kv-mb 32 --pipeline-rebalance 0");
  const auto inst = server.admin("instances");
  ASSERT_EQ(inst.size(), 1u) << inst.dump();
  const std::string id = std::to_string(inst[0]["id"].get<uint64_t>());
  EXPECT_NE(n1.stderr_text().find("loading a pipeline stage of stories15m (layers 3..5"),
            std::string::npos)
      << n1.stderr_text();
  client::connection c(server.endpoint());
  c.generate(greedy_request(7, "Once upon a time", 160));
  client::result r;
  auto find = [&](uint64_t rid) { return rid == 7 ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.token_ids.size() >= 8 || r.done(); }, 30s));
  // Stories15M's 6 layers split 3 + 3; one more goes to the node's stage.
  const auto moved = server.admin_command("layers " + id + " 0 1 1");
  ASSERT_EQ(moved.exit_code, 0) << moved.out << moved.err;
  EXPECT_NE(moved.out.find("the stages start at layers 0, 2"), std::string::npos) << moved.out;
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.done(); }, 60s));
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
  // Refusals: not neighbours, more layers than the donor can give.
  const auto far = server.admin_command("layers " + id + " 0 5 1");
  EXPECT_NE(far.exit_code, 0);
  EXPECT_NE(far.err.find("not neighbours"), std::string::npos) << far.err;
  const auto many = server.admin_command("layers " + id + " 1 0 4");
  EXPECT_NE(many.exit_code, 0);
  EXPECT_NE(many.err.find("it can give 1 to 3"), std::string::npos) << many.err;
}

// A node's pipelined instance whose second stage runs on a third process:
// kill -9 of that stage's node ends the pipeline and its instance, and the
// request that ran there recovers on the service's local instance with
// offline's tokens.
TEST(PipelineNodes, LosingAStagesNodeRecoversItsRequestElsewhere) {
  secret_file secret("cluster-test-secret-pipeline-stage-kill");
  node_process stage_node(secret.path()), host(secret.path());
  const std::string cfg = "/tmp/troupe_pipeline_stage_kill_" + std::to_string(::getpid()) + ".toml";
  {
    std::FILE* f = std::fopen(cfg.c_str(), "w");
    std::fprintf(f, "[cluster]\nsecret_file = \"%s\"\n", secret.path().c_str());
    std::fprintf(f,
                 "\n[[cluster.node]]\naddress = \"%s\"\ninstances = 1\nkv_mb = 32\n"
                 "pipeline_parallel = 2\npipeline_nodes = [\"local\", \"%s\"]\n",
                 host.address().c_str(), stage_node.address().c_str());
    std::fclose(f);
  }
  const auto want = offline_tokens("stories15m", "Once upon a time", 200);
  server_process server("--config " + cfg + " --local-instances 1 --router round-robin");
  std::remove(cfg.c_str());
  const auto inst = server.wait_instances(2, std::chrono::seconds(30));
  ASSERT_EQ(inst.size(), 2u) << inst.dump() << "\nserver: " << server.stderr_text()
                             << "\nhost node: " << host.stderr_text()
                             << "\nstage node: " << stage_node.stderr_text();
  client::connection c(server.endpoint());
  // Round-robin: one request on each instance.
  std::vector<client::result> rs(2);
  for (uint64_t rid = 1; rid <= 2; ++rid) c.generate(greedy_request(rid, "Once upon a time", 200));
  auto find = [&](uint64_t rid) { return rid >= 1 && rid <= 2 ? &rs[rid - 1] : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return rs[0].token_ids.size() >= 8 && rs[1].token_ids.size() >= 8; }, 30s));
  stage_node.kill9();
  ASSERT_TRUE(receive_until(
      c, find, [&] { return rs[0].done() && rs[1].done(); }, 60s));
  int recovered = 0;
  for (const auto& x : rs) {
    ASSERT_FALSE(x.error) << x.error->message();
    EXPECT_EQ(x.token_ids, want) << "request " << x.request_id;
    if (x.finished.instances_size() > 1) ++recovered;
  }
  EXPECT_EQ(recovered, 1);
  EXPECT_NE(host.stderr_text().find("its device ended"), std::string::npos) << host.stderr_text();
}

}  // namespace
}  // namespace troupe::testing
