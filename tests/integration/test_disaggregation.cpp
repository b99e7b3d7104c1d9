// Prefill/decode disaggregation and role switching on real instances
// (issue 11): two stories15M instances in one `troupe serve --pd`, one
// prefill and one decode.  Each request prefills on instance 1, its KV
// moves to instance 2, and the client sees one stream whose greedy tokens
// equal a mixed instance's; the trace names both instances and the
// transfer.  Roles flip by admin message under load with no request lost.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

const std::string kPrompt = "Once upon a time, there was a little girl named Lily";

wire::Generate greedy(uint64_t id, int n, const std::string& prompt = kPrompt) {
  return greedy_request(id, prompt, n);
}

TEST(Disaggregation, PrefillOnOneInstanceDecodeOnTheOtherSameTokens) {
  server_process server("--local-instances 2 --pd --roles prefill,decode");
  const std::vector<std::string> prompts = {kPrompt, "The dog ran to the park and",
                                            "Tom had a red ball. One day"};
  client::connection c(server.endpoint());
  std::vector<wire::Generate> reqs;
  for (uint64_t id = 1; id <= 6; ++id) reqs.push_back(greedy(id, 40, prompts[id % 3]));
  for (const auto& r : client::run(c, reqs, 90s)) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, offline_tokens("stories15m", prompts[r.request_id % 3], 40))
        << "request " << r.request_id;
    EXPECT_EQ(r.finished.instances_size(), 2) << "request " << r.request_id;
    const auto t = server.admin("trace " + std::to_string(r.request_id));
    EXPECT_EQ(t["prefill_instance"], 1) << t.dump();
    EXPECT_EQ(t["decode_instance"], 2) << t.dump();
    EXPECT_GT(t["transfer_bytes"].get<uint64_t>(), 0u) << t.dump();
    EXPECT_GT(t["transfer_ms"].get<double>(), 0.0) << t.dump();
    EXPECT_NE(t["decode_placement"].get<std::string>().find("D pool"), std::string::npos)
        << t.dump();
  }
  const auto inst = server.admin("instances");
  ASSERT_EQ(inst.size(), 2u);
  EXPECT_EQ(inst[0]["pool"], "P");
  EXPECT_EQ(inst[1]["pool"], "D");
  EXPECT_EQ(inst[0]["exported"], 6);
  EXPECT_EQ(inst[1]["imported"], 6);
  // Every page came back on both.
  for (const auto& i : server.wait_engine_idle(15s)) EXPECT_EQ(i["used_pages"], 0) << i.dump();
}

// Flips by message while requests stream: P,D -> D,P -> mixed; every
// request finishes with offline greedy's tokens.
TEST(Disaggregation, RoleFlipsUnderLoadLoseNothing) {
  server_process server("--local-instances 2 --pd --roles prefill,decode");
  const auto want = offline_tokens("stories15m", kPrompt, 60);
  client::connection c(server.endpoint());
  const int n = 12;
  std::vector<client::result> rs(n);
  auto find = [&](uint64_t id) { return id >= 1 && id <= uint64_t(n) ? &rs[id - 1] : nullptr; };
  for (uint64_t id = 1; id <= 4; ++id) c.generate(greedy(id, 60));
  ASSERT_TRUE(receive_until(
      c, find, [&] { return !rs[0].token_ids.empty(); }, 30s));
  auto flip = [&](const std::string& args) {
    auto r = server.admin_command("role " + args);
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  };
  auto a = flip("2 prefill");
  EXPECT_NE(a.dump().find("D -> D->P"), std::string::npos) << a.dump();
  flip("1 decode");
  for (uint64_t id = 5; id <= 8; ++id) c.generate(greedy(id, 60));
  ASSERT_TRUE(receive_until(
      c, find, [&] { return !rs[4].token_ids.empty() || rs[4].done(); }, 30s));
  flip("1 mixed");
  flip("2 mixed");
  for (uint64_t id = 9; id <= uint64_t(n); ++id) c.generate(greedy(id, 60));
  auto all_done = [&] {
    for (const auto& r : rs)
      if (!r.done()) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, all_done, 120s));
  for (const auto& r : rs) {
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want) << "request " << r.request_id;
  }
  const auto inst = server.admin("instances");
  EXPECT_EQ(inst[0]["pool"], "M");
  EXPECT_EQ(inst[1]["pool"], "M");
  // Requests 5-8 prefilled on instance 2 (P after the flip, once drained)
  // or 2 as D->P: either way not on instance 1, which was decode then.
  for (uint64_t id = 5; id <= 8; ++id) {
    const auto t = server.admin("trace " + std::to_string(id));
    EXPECT_EQ(t["prefill_instance"], 2) << t.dump();
  }
  auto bad = server.admin_command("role 1 sideways");
  EXPECT_NE(bad.exit_code, 0);
}

// D->P preemption by migration (issue 36): instance 2 (D) is decoding
// when it is flipped to prefill; its streams move, KV and all, to instance
// 3 (D) at once, so it is a plain P instance while they still stream,
// rather than a D->P one until they finish.  The clients see offline
// greedy's tokens.  SmolLM2, so that the streams outlast the flip by
// seconds (stories15M's end within the admin command's start-up).
TEST(Disaggregation, AFlipToPrefillMigratesTheDecodingStreams) {
  const std::string model = "smollm2-135m-instruct";
  server_process server("--local-instances 3 --pd --roles prefill,decode,decode",
                        "troupe serve: listening on ", model);
  const int n = 4, len = 400;
  const auto want = offline_tokens(model, kPrompt, len);
  client::connection c(server.endpoint());
  std::vector<client::result> rs(n);
  auto find = [&](uint64_t id) { return id >= 1 && id <= uint64_t(n) ? &rs[id - 1] : nullptr; };
  for (uint64_t id = 1; id <= uint64_t(n); ++id) c.generate(greedy(id, len));
  // Every stream has tokens from its decode instance (the first comes from
  // the prefill instance; one still arriving at the flip is not decoding
  // yet, and finishes where it lands).
  auto streaming = [&] {
    for (const auto& r : rs)
      if (r.token_ids.size() < 3) return false;
    return true;
  };
  ASSERT_TRUE(receive_until(c, find, streaming, 60s));
  auto r = server.admin_command("role 2 prefill");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("D -> D->P"), std::string::npos) << r.out;
  // Settled to P while the streams go on, on instance 3: one snapshot of
  // the instances shows both.
  nlohmann::json inst;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < until) {
    inst = server.admin("instances");
    if (inst[1]["pool"] == "P") break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(inst[1]["pool"], "P") << inst.dump();
  EXPECT_GT(inst[2]["decoding"].get<int>(), 0)
      << "the streams ended before instance 2 settled: nothing was migrated";
  ASSERT_TRUE(receive_until(
      c, find,
      [&] {
        return std::all_of(rs.begin(), rs.end(), [](const client::result& x) { return x.done(); });
      },
      90s));
  int migrated = 0;
  for (uint64_t id = 1; id <= uint64_t(n); ++id) {
    const auto& x = rs[id - 1];
    ASSERT_FALSE(x.error) << x.error->message();
    EXPECT_EQ(x.token_ids, want) << "request " << id;
    const auto t = server.admin("trace " + std::to_string(id));
    migrated += t["migrations"].get<int>();
  }
  EXPECT_GE(migrated, 1);
  for (const auto& i : server.wait_engine_idle(15s)) EXPECT_EQ(i["used_pages"], 0) << i.dump();
}

}  // namespace
}  // namespace troupe::testing
