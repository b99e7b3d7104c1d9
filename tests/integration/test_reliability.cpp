// Regression tests for the defects a hostile user found in a live
// `troupe serve` (issue 9): each reproduces its defect against a real
// server process on loopback and fails without its fix.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "process.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

wire::Generate long_request(uint64_t id) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text("Once upon a time");
  g.set_max_tokens(240);
  g.set_ignore_eos(true);
  return g;
}

// Reads until every id in `ids` has its terminal message (Finished, or an
// Error naming it); returns each one's finish reason name or error code name.
std::map<uint64_t, std::string> terminals(client::connection& c, const std::set<uint64_t>& ids,
                                          std::chrono::milliseconds silence = 30s) {
  std::map<uint64_t, std::string> out;
  while (out.size() < ids.size()) {
    auto m = c.receive(silence);
    if (!m) break;
    if (m->has_finished() && ids.count(m->finished().request_id())) {
      EXPECT_FALSE(out.count(m->finished().request_id())) << "two terminal messages";
      out[m->finished().request_id()] = wire::FinishReason_Name(m->finished().reason());
    } else if (m->has_error() && m->error().has_request_id() &&
               ids.count(m->error().request_id())) {
      EXPECT_FALSE(out.count(m->error().request_id())) << "two terminal messages";
      out[m->error().request_id()] = wire::ErrorCode_Name(m->error().code());
    }
  }
  return out;
}

void expect_idle(const nlohmann::json& instances) {
  for (const auto& i : instances) {
    EXPECT_EQ(i["running"], 0) << i.dump();
    EXPECT_EQ(i["waiting"], 0) << i.dump();
    EXPECT_EQ(i["kv"]["used_pages"], 0) << i.dump();
  }
}

// Defect 2: a Cancel right behind its Generate used to reach the request
// actor before the instance's enqueue reply; the actor quit, never saw the
// reply, and the sequence decoded on with its pages held.
TEST(Reliability, CancelRacingTheEnqueueEndsTheSequence) {
  server_process server;
  client::connection c(server.endpoint());
  std::set<uint64_t> ids;
  for (uint64_t id = 1; id <= 100; ++id) {
    c.generate(long_request(id));
    c.cancel(id);
    ids.insert(id);
  }
  auto got = terminals(c, ids);
  ASSERT_EQ(got.size(), ids.size());
  for (const auto& [id, how] : got) EXPECT_EQ(how, "CANCELLED") << "request " << id;
  expect_idle(server.wait_engine_idle(5s));
}

// The same race with deadline_ms = 1: on a busy engine the deadline fires
// before the enqueue is answered.
TEST(Reliability, DeadlineRacingTheEnqueueEndsTheSequence) {
  server_process server;
  client::connection c(server.endpoint());
  std::set<uint64_t> busy;
  for (uint64_t id = 1001; id <= 1008; ++id) {
    c.generate(long_request(id));
    busy.insert(id);
  }
  std::set<uint64_t> ids;
  for (uint64_t id = 1; id <= 200; ++id) {
    auto g = long_request(id);
    g.set_deadline_ms(1);
    c.generate(g);
    ids.insert(id);
  }
  auto got = terminals(c, ids);
  ASSERT_EQ(got.size(), ids.size());
  for (const auto& [id, how] : got) EXPECT_EQ(how, "TIMEOUT") << "request " << id;
  for (uint64_t id : busy) c.cancel(id);
  EXPECT_EQ(terminals(c, busy).size(), busy.size());
  expect_idle(server.wait_engine_idle(5s));
}

}  // namespace
}  // namespace troupe::testing
