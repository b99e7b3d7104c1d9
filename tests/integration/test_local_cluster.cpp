// Several engine instances in one `troupe serve` (--local-instances) behind
// the router (issue 10, in one process): round-robin places on each;
// a streaming request moved between instances through admin keeps its
// tokens identical to offline greedy and the sources' pages come back;
// drain stops placements on an instance until it holds nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

const std::string kPrompt = "Once upon a time, there was a little girl named Lily";

std::vector<int32_t> offline_greedy(const std::string& prompt, int n) {
  return offline_tokens("stories15m", prompt, n);
}

wire::Generate greedy(uint64_t id, int n) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text(kPrompt);
  g.set_max_tokens(n);
  g.set_ignore_eos(true);
  return g;
}

TEST(LocalCluster, RoundRobinPlacesOnEveryInstanceAndMatchesOffline) {
  server_process server("--local-instances 2 --router round-robin");
  const auto want = offline_greedy(kPrompt, 24);
  client::connection c(server.endpoint());
  std::vector<wire::Generate> reqs;
  for (uint64_t id = 1; id <= 6; ++id) reqs.push_back(greedy(id, 24));
  std::set<uint64_t> used;
  for (const auto& r : client::run(c, reqs, 60s)) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
    ASSERT_EQ(r.finished.instances_size(), 1);
    used.insert(r.finished.instances(0));
  }
  EXPECT_EQ(used, (std::set<uint64_t>{1, 2}));
  const auto inst = server.admin("instances");
  ASSERT_EQ(inst.size(), 2u);
  for (const auto& i : inst) {
    for (const char* k : {"id", "node", "role", "state", "running", "waiting", "used_pages"})
      EXPECT_TRUE(i.contains(k)) << k << " in " << i.dump();
    EXPECT_EQ(i["state"], "serving");
  }
}

// Five moves of one streaming request, alternating instances, while three
// others keep the engine busy (so it streams long enough).
TEST(LocalCluster, AStreamMovedFiveTimesKeepsItsTokens) {
  server_process server("--local-instances 2");
  const auto want = offline_greedy(kPrompt, 200);
  client::connection busy(server.endpoint());
  for (uint64_t id = 100; id < 103; ++id) busy.generate(greedy(id, 200));
  client::connection c(server.endpoint());
  c.generate(greedy(7, 200));
  client::result r;
  auto find = [&](uint64_t id) { return id == 7 ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return !r.token_ids.empty() || r.done(); }, 30s));
  const int moved = migrate_back_and_forth(server, c, r, find, 7, 6, 6);
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.done(); }, 60s));
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.token_ids, want);
  EXPECT_GE(moved, 5);
  const auto t = server.admin("trace 7");
  EXPECT_GE(t["migrations"].get<int>(), 5) << t.dump();
  EXPECT_GE(t["instances"].size(), 6u) << t.dump();
  EXPECT_GT(t["migrated_bytes"].get<uint64_t>(), 0u);
  for (uint64_t id = 100; id < 103; ++id) busy.cancel(id);
  const auto inst = server.wait_engine_idle(15s);
  for (const auto& i : inst) EXPECT_EQ(i["used_pages"], 0) << i.dump();
}

// Drain under load: it returns once instance 1 holds nothing; meanwhile
// and after, every new request goes to instance 2; all finish.
TEST(LocalCluster, DrainStopsPlacementsAndWaitsForTheInstance) {
  server_process server("--local-instances 2 --router round-robin");
  client::connection c(server.endpoint());
  for (uint64_t id = 1; id <= 4; ++id) c.generate(greedy(id, 60));
  auto drain = server.admin_command("drain 1");
  EXPECT_EQ(drain.exit_code, 0) << drain.err;
  std::vector<wire::Generate> later;
  for (uint64_t id = 11; id <= 14; ++id) later.push_back(greedy(id, 8));
  client::connection c2(server.endpoint());
  for (const auto& r : client::run(c2, later, 60s)) {
    ASSERT_FALSE(r.error) << r.error->message();
    ASSERT_EQ(r.finished.instances_size(), 1);
    EXPECT_EQ(r.finished.instances(0), 2u) << "request " << r.request_id;
  }
  std::vector<client::result> first(4);
  auto find = [&](uint64_t id) { return id >= 1 && id <= 4 ? &first[id - 1] : nullptr; };
  auto all_done = [&] {
    for (const auto& f : first)
      if (!f.done()) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, all_done, 60s));
  for (const auto& f : first) EXPECT_EQ(f.finished.reason(), wire::LENGTH);
  const auto inst = server.admin("instances");
  EXPECT_EQ(inst[0]["state"], "draining");
  EXPECT_EQ(inst[0]["used_pages"], 0);
}

// Recovery: an instance killed mid-stream (admin kill, fault injection);
// every request it served is placed again and resumes from the tokens it
// streamed: all finish, greedy tokens identical, no client sees an error.
// With no instance left, requests end promptly with UNAVAILABLE.
TEST(LocalCluster, KilledInstanceRequestsFinishElsewhereUnchanged) {
  server_process server("--local-instances 2 --router round-robin");
  const auto want = offline_greedy(kPrompt, 120);
  client::connection c(server.endpoint());
  std::vector<client::result> rs(6);
  auto find = [&](uint64_t id) { return id >= 1 && id <= 6 ? &rs[id - 1] : nullptr; };
  for (uint64_t id = 1; id <= 6; ++id) c.generate(greedy(id, 120));
  // Once every request streams, kill instance 1.
  auto streaming = [&] {
    for (const auto& r : rs)
      if (r.token_ids.size() < 4 && !r.done()) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, streaming, 30s));
  auto kill = run_process(troupe_bin() + " client --server " + shell_quote(server.endpoint()) +
                          " admin kill 1 --json");
  ASSERT_EQ(kill.exit_code, 0) << kill.err;
  auto all_done = [&] {
    for (const auto& r : rs)
      if (!r.done()) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, all_done, 60s)) << "requests stopped after the kill";
  int recovered = 0;
  for (const auto& r : rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.finished.reason(), wire::LENGTH);
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
    if (r.finished.instances_size() > 1) {
      ++recovered;
      EXPECT_EQ(r.finished.instances(0), 1u);
      EXPECT_EQ(r.finished.instances(1), 2u);
    }
  }
  EXPECT_EQ(recovered, 3);  // round-robin put three on instance 1
  const auto inst = server.admin("instances");
  EXPECT_EQ(inst[0]["state"], "down");
  EXPECT_EQ(inst[1]["state"], "serving");
  // The last instance goes too: requests end with UNAVAILABLE, not silence.
  c.generate(greedy(20, 200));
  client::result last;
  while (last.token_ids.empty() && !last.done()) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m);
    client::apply(*m, [&](uint64_t id) { return id == 20 ? &last : nullptr; });
  }
  ASSERT_EQ(run_process(troupe_bin() + " client --server " + shell_quote(server.endpoint()) +
                        " admin kill 2 --json")
                .exit_code,
            0);
  while (!last.done()) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m) << "no terminal message with every instance down";
    client::apply(*m, [&](uint64_t id) { return id == 20 ? &last : nullptr; });
  }
  ASSERT_TRUE(last.error);
  EXPECT_EQ(last.error->code(), wire::UNAVAILABLE) << last.error->message();
}

// Prefix-aware placement: once an instance caches a group's shared
// prefix, every later request of that group goes there (the router
// compares the prompt's full-page hashes with the instances' cached ones),
// and the prefix cache serves those pages.
TEST(LocalCluster, PrefixPolicySendsEachSharedPrefixGroupToOneInstance) {
  server_process server("--local-instances 2 --router prefix");
  const std::vector<std::string> groups = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree and ran to get it.",
      "Tom had a small dog called Max. Every morning they walked to the river and looked at the "
      "ducks. Max liked to bark at the ducks, and Tom laughed every time the ducks flew away.",
      "The sun was hot and the sky was blue. Sara and her mom went to the beach with a big bag of "
      "toys. Sara built a castle with a tall tower and a deep hole for the water to come in."};
  client::connection c(server.endpoint());
  auto ask = [&](uint64_t id, const std::string& text) {
    wire::Generate g;
    g.set_request_id(id);
    g.set_text(text);
    g.set_max_tokens(4);
    auto r = client::run(c, {g}, 60s);
    EXPECT_FALSE(r.at(0).error);
    EXPECT_EQ(r.at(0).finished.instances_size(), 1);
    return r.at(0).finished.instances(0);
  };
  std::vector<uint64_t> home;
  for (size_t g = 0; g < groups.size(); ++g) home.push_back(ask(100 + g, groups[g]));
  std::this_thread::sleep_for(500ms);  // the router's snapshots (every 100 ms) see the pages
  uint64_t id = 200;
  for (int round = 0; round < 3; ++round)
    for (size_t g = 0; g < groups.size(); ++g)
      EXPECT_EQ(ask(id++, groups[g] + " Then " + std::to_string(round) + " more."), home[g])
          << "group " << g << ", round " << round;
  EXPECT_GT(server.admin("kv")["prefix_hit_rate"].get<double>(), 0.3);
  const auto t = server.admin("trace 200");
  EXPECT_NE(t["placement"].get<std::string>().find("cached prefix pages"), std::string::npos)
      << t.dump();
}

// The slo policy's prefill-time model is fitted from the steps the
// instances measure (their stats carry the last steps' rows and times):
// before any step it predicts nothing, after some traffic it predicts a
// positive TTFT and says so in the placement's trace.
TEST(LocalCluster, SloPolicyLearnsStepTimesFromTheInstances) {
  server_process server("--local-instances 2 --router slo");
  client::connection c(server.endpoint());
  auto predicted = [&](uint64_t id) {
    auto r = client::run(c, {greedy(id, 8)}, 60s);
    EXPECT_FALSE(r.at(0).error);
    const auto why = server.admin("trace " + std::to_string(id))["placement"].get<std::string>();
    const auto at = why.find("predicted TTFT ");
    EXPECT_NE(at, std::string::npos) << why;
    return at == std::string::npos ? -1.0 : std::stod(why.substr(at + 15));
  };
  EXPECT_EQ(predicted(1), 0.0) << "no step measured yet";
  for (uint64_t id = 2; id < 6; ++id) predicted(id);
  std::this_thread::sleep_for(500ms);  // the router's snapshots (every 100 ms) carry the steps
  EXPECT_GT(predicted(6), 0.0);
}

}  // namespace
}  // namespace troupe::testing
