// troupe serve's admin actor and metrics endpoint, as users reach them: a
// real server process (its admin actor on a port it picks, --metrics-port),
// the `troupe client admin` command, and plain HTTP GET /metrics.
// Cancelling through admin ends a stream mid-way and its KV pages come
// back; `troupe client --server EP admin kv --json` holds its contract with
// nothing else given; --admin-port -1 makes admin fail clearly; the metrics
// name what they should and move with traffic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "net.hpp"
#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

// `troupe serve` with its admin actor (on a port it picks, as by default)
// and the metrics endpoint, as a child process.
class admin_server : public server_process {
 public:
  admin_server()
      : server_process("--metrics-port " + std::to_string(free_port()),
                       "troupe serve: metrics on ") {
    if (admin_port() == 0 || metrics_port() == 0)
      throw std::runtime_error("no admin or metrics line: " + startup_text());
  }

  // `troupe client --server EP admin ARGS --json`, its stdout as JSON: the
  // command-line contract, the admin endpoint found through the server's
  // Pong; with `explicit_admin`, given as --admin HOST:PORT.
  nlohmann::json admin(const std::string& args, bool explicit_admin = false) const {
    const std::string at =
        explicit_admin ? " --admin 127.0.0.1:" + std::to_string(admin_port()) : "";
    auto r = run_process(troupe_bin() + " client --server " + shell_quote(endpoint()) + " admin" +
                         at + " " + args + " --json");
    if (r.exit_code != 0)
      throw std::runtime_error("admin " + args + ": exit " + std::to_string(r.exit_code) + ": " +
                               r.err);
    return nlohmann::json::parse(r.out);
  }
};

class AdminMetrics : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new admin_server(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static inline admin_server* server_ = nullptr;
};

TEST_F(AdminMetrics, KvJsonContract) {
  const auto kv = server_->admin("kv");
  for (const char* key : {"used_pages", "free_pages", "reusable_pages", "total_pages"}) {
    ASSERT_TRUE(kv.contains(key)) << key << " missing in " << kv.dump();
    EXPECT_TRUE(kv[key].is_number_integer()) << key;
  }
  EXPECT_GT(kv["total_pages"].get<int>(), 0);
  EXPECT_EQ(kv["used_pages"].get<int>(), 0);
  EXPECT_EQ(
      kv["total_pages"].get<int>(),
      kv["free_pages"].get<int>() + kv["used_pages"].get<int>() + kv["reusable_pages"].get<int>());
  const auto insts = server_->admin("instances");
  ASSERT_EQ(insts.size(), 1u);
  EXPECT_EQ(insts[0]["kv_check"], "");
}

// The admin port the server printed is the one its Pong names, and
// --admin HOST:PORT reaches the same actor.
TEST_F(AdminMetrics, PongNamesTheAdminPortAndExplicitAdminWorks) {
  client::connection c(server_->endpoint());
  auto pong = c.pong(10s);
  ASSERT_TRUE(pong);
  EXPECT_EQ(static_cast<int>(pong->admin_port()), server_->admin_port());
  const auto kv = server_->admin("kv", true);
  EXPECT_EQ(kv["total_pages"], server_->admin("kv")["total_pages"]);
  EXPECT_EQ(server_->admin("instances", true).size(), 1u);
}

TEST_F(AdminMetrics, CancelMidStreamThroughAdminGivesPagesBack) {
  client::connection c(server_->endpoint());
  c.generate(long_request(71));
  c.generate(long_request(72));
  client::result r71, r72;
  auto find = [&](uint64_t id) { return id == 71 ? &r71 : id == 72 ? &r72 : nullptr; };
  bool cancelled = false;
  while (!r71.done() || !r72.done()) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m) << "no answer";
    client::apply(*m, find);
    if (!cancelled && r71.token_ids.size() >= 3 && r72.token_ids.size() >= 3) {
      // Both in flight, holding pages.
      const auto reqs = server_->admin("requests");
      std::vector<uint64_t> ids;
      for (const auto& q : reqs) ids.push_back(q["request_id"].get<uint64_t>());
      EXPECT_NE(std::find(ids.begin(), ids.end(), 71u), ids.end()) << reqs.dump();
      EXPECT_NE(std::find(ids.begin(), ids.end(), 72u), ids.end()) << reqs.dump();
      EXPECT_GT(server_->admin("kv")["used_pages"].get<int>(), 0);
      EXPECT_EQ(server_->admin("trace 71")["finish"], "in_flight");
      EXPECT_EQ(server_->admin("cancel 71")["cancelled"], 1);
      EXPECT_EQ(server_->admin("cancel 72")["cancelled"], 1);
      cancelled = true;
    }
  }
  ASSERT_TRUE(cancelled);
  for (auto* r : {&r71, &r72}) {
    ASSERT_FALSE(r->error) << r->error->message();
    EXPECT_EQ(r->finished.reason(), wire::CANCELLED);
    EXPECT_LT(r->finished.completion_tokens(), 240u);
  }
  // The pages come back once the instance has let the sequences go.
  int used = -1;
  for (int i = 0; i < 50 && used != 0; ++i) {
    used = server_->admin("kv")["used_pages"].get<int>();
    if (used != 0) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(used, 0);
  const auto t = server_->admin("trace 71");
  EXPECT_EQ(t["finish"], "cancelled");
  EXPECT_EQ(t["completion_tokens"].get<uint32_t>(), r71.finished.completion_tokens());

  // Unknown ids: a cancel that finds nothing and a trace that does not exist fail.
  auto bad = run_process(troupe_bin() + " client --server x admin --admin 127.0.0.1:1 kv");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THROW(server_->admin("cancel 99999"), std::runtime_error);
  EXPECT_THROW(server_->admin("trace 99999"), std::runtime_error);
}

TEST_F(AdminMetrics, MetricsNameWhatTheyShouldAndMove) {
  auto before = http_get(server_->metrics_port(), "/metrics");
  ASSERT_NE(before.find("200 OK"), std::string::npos) << before;
  // Listed before any request of this test (and from the start).
  EXPECT_NE(before.find("# TYPE troupe_time_to_first_token_seconds histogram"), std::string::npos);
  const double length_before =
      std::max(0.0, sample(before, "troupe_requests_total{finish=\"length\"}"));
  const double gen_before = std::max(0.0, sample(before, "troupe_generation_tokens_total"));

  client::connection c(server_->endpoint());
  wire::Generate g;
  g.set_request_id(1);
  g.set_text("Once upon a time");
  g.set_max_tokens(8);
  g.set_ignore_eos(true);
  // The fixture's first request: its steps may compile kernels (a cold
  // PoCL cache after a kernel change took over 30 s on a loaded 2-core
  // CI run beside another server doing the same).
  auto r = client::run(c, {g}, 120s).at(0);
  ASSERT_FALSE(r.error) << r.error->message();
  ASSERT_EQ(r.finished.reason(), wire::LENGTH);

  const auto text = http_get(server_->metrics_port(), "/metrics");
  for (const char* name :
       {"troupe_requests_total", "troupe_prompt_tokens_total", "troupe_generation_tokens_total",
        "troupe_time_to_first_token_seconds", "troupe_time_per_output_token_seconds",
        "troupe_queue_time_seconds", "troupe_kv_pages_used", "troupe_kv_pages_free",
        "troupe_kv_pages_reusable", "troupe_kv_pages_total", "troupe_prefix_cache_hit_rate",
        "troupe_preemptions_total", "troupe_queue_length", "troupe_step_seconds_total",
        "troupe_steps_total", "troupe_requests_in_flight", "troupe_sequences"})
    EXPECT_NE(text.find("# TYPE " + std::string(name) + " "), std::string::npos) << name;
  EXPECT_EQ(sample(text, "troupe_requests_total{finish=\"length\"}"), length_before + 1);
  EXPECT_EQ(sample(text, "troupe_generation_tokens_total"), gen_before + 8);
  EXPECT_GE(sample(text, "troupe_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(sample(text, "troupe_kv_pages_used{instance=\"instance-1\"}"), 0);
  EXPECT_EQ(sample(text, "troupe_requests_in_flight"), 0);
  EXPECT_GT(sample(text, "troupe_steps_total{instance=\"instance-1\"}"), 0);
  EXPECT_NE(http_get(server_->metrics_port(), "/nothing").find("404"), std::string::npos);
}

// With the admin endpoint off, the Pong says so and `admin` fails at once
// with an error naming the cause (no hang, nonzero exit).
TEST(AdminMetricsConfig, AdminOffMakesAdminFailClearly) {
  server_process server("--admin-port -1");
  EXPECT_EQ(server.admin_port(), 0) << server.startup_text();
  client::connection c(server.endpoint());
  auto pong = c.pong(10s);
  ASSERT_TRUE(pong);
  EXPECT_EQ(pong->admin_port(), 0u);
  auto r = run_process("timeout 60 " + troupe_bin() + " client --server " +
                       shell_quote(server.endpoint()) + " admin kv --json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "admin kv hung";
  EXPECT_NE(r.err.find("has no admin endpoint"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  // Nobody at --server: a clear error too.
  r = run_process("timeout 60 " + troupe_bin() +
                  " client --server tcp://127.0.0.1:9 admin --admin-timeout-ms 300 kv");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "admin kv hung";
  EXPECT_NE(r.err.find("no answer from tcp://127.0.0.1:9"), std::string::npos) << r.err;
}

// A taken port stops the start with the key's name, and nothing hangs.
TEST(AdminMetricsConfig, BusyOrBadPortIsRefusedWithTheKey) {
  const held_port held = listen_local();
  ASSERT_GE(held.fd, 0);
  const std::string busy = std::to_string(held.port);
  const std::string serve =
      "timeout 60 " + troupe_bin() + " serve -m stories15m --listen 'tcp://127.0.0.1:*' ";
  for (const std::string key : {"metrics_port", "admin_port"}) {
    std::string flag = "--" + key;
    flag[flag.find('_')] = '-';
    auto r = run_process(serve + flag + " " + busy);
    EXPECT_EQ(r.exit_code, 1) << key << ": " << r.err;
    EXPECT_NE(r.err.find("service." + key), std::string::npos) << r.err;
    r = run_process(serve + flag + " 70000");
    EXPECT_EQ(r.exit_code, 1) << key << ": " << r.err;
    EXPECT_NE(r.err.find("service." + key), std::string::npos) << r.err;
  }
  ::close(held.fd);
}

}  // namespace
}  // namespace troupe::testing
