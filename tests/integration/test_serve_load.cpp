// troupe serve under load, with real processes on loopback: one server and
// three `troupe client` processes keep 50 streamed requests in flight, each
// answered with exactly the tokens of offline greedy `troupe generate`; a
// burst beyond the queue bound gets fast "overloaded" errors while the
// admitted requests all finish.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "process.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

// 50 distinct story openings: 10 beginnings x 5 subjects.
std::vector<std::string> fifty_prompts() {
  const char* begin[] = {"Once upon a time", "One day",        "In a small town", "Long ago",
                         "Every morning",    "On a sunny day", "At the park",     "In the forest",
                         "Last summer",      "After school"};
  const char* who[] = {"Lily", "Tom", "a little dog", "a big bear", "the old man"};
  std::vector<std::string> out;
  for (const char* b : begin)
    for (const char* w : who) out.push_back(std::string(b) + ", " + w);
  return out;
}

// The most requests open at once: each is open from its Accepted to its
// Finished (times taken by the clients, on one machine's clock); at equal
// times a finish counts first.
int max_in_flight(const std::vector<std::pair<double, double>>& spans) {
  std::vector<std::pair<double, int>> events;
  for (const auto& [accepted, finished] : spans) {
    events.push_back({accepted, +1});
    events.push_back({finished, -1});
  }
  std::sort(events.begin(), events.end());
  int open = 0, most = 0;
  for (const auto& e : events) most = std::max(most, open += e.second);
  return most;
}

TEST(ServeLoad, FiftyStreamsFromThreeClientProcessesMatchOfflineGreedy) {
  const auto prompts = fifty_prompts();
  ASSERT_EQ(prompts.size(), 50u);
  // 48 tokens each past EOS: every request decodes for as long as the
  // others, so all 50 are open together even when the clients start apart.
  const std::string gen_flags = " -n 48 --ignore-eos --json";

  // The references: every prompt alone, one after another, in one offline
  // `troupe generate` (one model load).
  std::string cmd = troupe_bin() + " generate -m stories15m" + gen_flags;
  for (const auto& p : prompts) cmd += " -p " + shell_quote(p);
  auto ref = run_process(cmd);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  std::vector<nlohmann::json> want;
  {
    std::istringstream lines(ref.out);
    for (std::string line; std::getline(lines, line);) want.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(want.size(), prompts.size());

  // Room for all 50 at once: running sequences and the waiting queue.
  server_process server("--max-seqs 64 --max-queue 64");
  // Three client processes at once: 17 + 17 + 16 pipelined streamed requests.
  const std::vector<std::pair<size_t, size_t>> parts = {{0, 17}, {17, 34}, {34, 50}};
  const std::string base = "/tmp/troupe_serve_load_" + std::to_string(::getpid());
  cmd.clear();
  for (size_t c = 0; c < parts.size(); ++c) {
    cmd += troupe_bin() + " client --server " + shell_quote(server.endpoint()) + gen_flags;
    for (size_t i = parts[c].first; i < parts[c].second; ++i)
      cmd += " -p " + shell_quote(prompts[i]);
    cmd += " >" + base + "_" + std::to_string(c) + ".out 2>&1 & ";
  }
  cmd += "wait";
  auto all = run_process(cmd);
  ASSERT_EQ(all.exit_code, 0);

  std::vector<std::pair<double, double>> spans;
  for (size_t c = 0; c < parts.size(); ++c) {
    const std::string path = base + "_" + std::to_string(c) + ".out";
    std::istringstream lines(slurp(path));
    std::remove(path.c_str());
    for (size_t i = parts[c].first; i < parts[c].second; ++i) {
      const auto& p = prompts[i];
      std::string line;
      ASSERT_TRUE(std::getline(lines, line)) << "client " << c << ": no answer for " << p;
      auto got = nlohmann::json::parse(line);
      ASSERT_FALSE(got.contains("error")) << got.dump();
      const auto reason = got["finish_reason"].get<std::string>();
      EXPECT_TRUE(reason == "length" || reason == "eos") << "prompt '" << p << "': " << reason;
      EXPECT_EQ(got["finish_reason"], want[i]["finish_reason"]) << "prompt '" << p << "'";
      EXPECT_EQ(got["token_ids"], want[i]["token_ids"]) << "prompt '" << p << "'";
      // The client's text is its streamed deltas concatenated.
      EXPECT_EQ(got["text"], want[i]["text"]) << "prompt '" << p << "'";
      EXPECT_GT(got["chunks"].get<int>(), 1) << "not streamed: " << line;
      ASSERT_TRUE(got["accepted_unix_ms"].is_number()) << line;
      const double accepted = got["accepted_unix_ms"].get<double>();
      const double finished = got["finished_unix_ms"].get<double>();
      EXPECT_LE(accepted, finished) << line;
      spans.push_back({accepted, finished});
    }
  }
  ASSERT_EQ(spans.size(), 50u);
  // All 50 between Accepted and Finished at one moment.
  EXPECT_EQ(max_in_flight(spans), 50);
}

wire::Generate burst_request(uint64_t id, int max_tokens) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text("Once upon a time");
  g.set_max_tokens(max_tokens);
  g.set_ignore_eos(true);
  return g;
}

TEST(ServeOverload, BurstBeyondTheQueueBoundGetsFastOverloadedErrors) {
  // One sequence runs, four may wait: of a burst of 40, at least 35 are refused.
  const int running_cap = 1, queue_bound = 4, per_client = 20, clients = 2, n = 48;
  server_process server("--max-seqs " + std::to_string(running_cap) + " --max-queue " +
                        std::to_string(queue_bound));
  // Two clients (connections) send their 20 pipelined requests at once.
  std::vector<std::vector<client::result>> results(clients);
  {
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        client::connection conn(server.endpoint());
        std::vector<wire::Generate> reqs;
        for (int i = 1; i <= per_client; ++i) reqs.push_back(burst_request(i, n));
        results[c] = client::run(conn, reqs, 60s);
      });
    for (auto& t : threads) t.join();
  }
  std::vector<const client::result*> overloaded, admitted;
  for (const auto& rs : results)
    for (const auto& r : rs) {
      if (r.error) {
        EXPECT_EQ(r.error->code(), wire::OVERLOADED)
            << wire::ErrorCode_Name(r.error->code()) << ": " << r.error->message();
        EXPECT_NE(r.error->message().find("overloaded"), std::string::npos) << r.error->message();
        overloaded.push_back(&r);
      } else {
        // Every admitted request finishes, with all its tokens.
        EXPECT_TRUE(r.finished.reason() == wire::LENGTH || r.finished.reason() == wire::EOS)
            << client::to_string(r.finished.reason());
        EXPECT_EQ(r.token_ids.size(), static_cast<size_t>(n));
        admitted.push_back(&r);
      }
    }
  EXPECT_GE(static_cast<int>(overloaded.size()), clients * per_client - queue_bound - running_cap);
  ASSERT_GE(admitted.size(), 1u);
  // Fast: every refusal came before the first admitted request finished.
  double first_finish = admitted.front()->finished_unix_ms;
  for (const auto* r : admitted) first_finish = std::min(first_finish, r->finished_unix_ms);
  for (const auto* r : overloaded)
    EXPECT_LT(r->finished_unix_ms, first_finish)
        << "request " << r->request_id << " was refused only after an admitted one finished";
  // Still serving: a ping, and a request once the queue has drained.
  client::connection c(server.endpoint());
  EXPECT_TRUE(c.ping(10s));
  auto later = client::run(c, {burst_request(99, 4)}, 30s).at(0);
  EXPECT_FALSE(later.error) << later.error->message();
  EXPECT_EQ(later.finished.reason(), wire::LENGTH);
}

}  // namespace
}  // namespace troupe::testing
