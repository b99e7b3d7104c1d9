// The benchmark's OpenAI-compatible streaming backend and its driver,
// against a small in-process HTTP server that streams known server-sent
// events: chunk timing and token counts, usage, the request body, and the
// failure paths (HTTP errors, a stream cut off, a silent server, nobody
// listening) ending as failed records rather than hangs.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/bench_driver.hpp"
#include "bench/bench_openai.hpp"

namespace troupe::bench {
namespace {

using namespace std::chrono_literals;

std::string event(const nlohmann::json& j) {
  return "data: " + j.dump() + "\n\n";
}
std::string text_event(const std::string& t) {
  return event({{"choices", {{{"index", 0}, {"text", t}, {"finish_reason", nullptr}}}}});
}

// A server streaming three tokens, an empty final choice and a usage block.
class fake_server {
 public:
  fake_server() {
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard lock(mu_);
        bodies_.push_back(nlohmann::json::parse(req.body));
      }
      const auto mode = bodies_.back().value("model", std::string("ok"));
      if (mode == "busy") {
        res.status = 503;
        res.set_content("{\"error\": \"busy\"}", "application/json");
        return;
      }
      if (mode == "silent") std::this_thread::sleep_for(1500ms);
      res.set_chunked_content_provider("text/event-stream", [mode](size_t,
                                                                   httplib::DataSink& sink) {
        const std::string all =
            text_event("Hel") + ": keep-alive comment\n\n" + text_event("lo") + text_event(" you") +
            event({{"choices", {{{"text", ""}, {"finish_reason", "length"}}}}}) +
            event({{"choices", nlohmann::json::array()},
                   {"usage", {{"prompt_tokens", 7}, {"completion_tokens", 3}}}}) +
            "data: [DONE]\n\n";
        if (mode == "dies") {
          sink.write(all.data(), all.find("data:", 10));  // the first event, then gone
          return false;
        }
        // Odd piece sizes so events straddle writes.
        for (size_t at = 0; at < all.size(); at += 37) {
          sink.write(all.data() + at, std::min<size_t>(37, all.size() - at));
          std::this_thread::sleep_for(2ms);
        }
        sink.done();
        return true;
      });
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    for (int i = 0; i < 200 && !svr_.is_running(); ++i) std::this_thread::sleep_for(5ms);
  }
  ~fake_server() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  nlohmann::json last_body() {
    std::lock_guard lock(mu_);
    return bodies_.back();
  }

 private:
  httplib::Server svr_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<nlohmann::json> bodies_;
};

request_context test_context() {
  request_context ctx;
  const auto t0 = std::chrono::steady_clock::now();
  ctx.now = [t0] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  ctx.timeout = 400ms;
  return ctx;
}

openai_options options(const std::string& url, const std::string& model = "") {
  openai_options o;
  o.base_url = url;
  o.model = model;
  return o;
}

request_record run_one(const std::string& url, const std::string& model,
                       const bench_request& req = {}) {
  openai_backend backend(options(url, model));
  request_record rec;
  auto ctx = test_context();
  rec.send_time = ctx.now();
  backend.run(req, ctx, rec);
  rec.end_time = ctx.now();
  return rec;
}

TEST(BenchOpenAI, SseParserAcrossPieces) {
  sse_parser p;
  EXPECT_TRUE(p.push("da").empty());
  EXPECT_TRUE(p.push("ta: {\"a\"").empty());
  EXPECT_EQ(p.push(": 1}\r\n\r\n: ping\n\nevent: x\ndata:[DONE]\n"),
            (std::vector<std::string>{"{\"a\": 1}", "[DONE]"}));
}

TEST(BenchOpenAI, StreamsChunksAndUsage) {
  fake_server server;
  bench_request req;
  req.prompt_tokens = {5, 6, 7};
  req.output_len = 3;
  auto rec = run_one(server.url(), "ok", req);
  ASSERT_TRUE(rec.success) << rec.error_code << ": " << rec.error_message;
  EXPECT_EQ(rec.chunk_times.size(), 3u);  // the empty final choice carries no token
  EXPECT_EQ(rec.output_tokens, 3);
  EXPECT_EQ(rec.prompt_tokens, 7);  // the server's count wins
  EXPECT_TRUE(std::is_sorted(rec.chunk_times.begin(), rec.chunk_times.end()));
  EXPECT_GT(rec.ttft(), 0.0);
  auto body = server.last_body();
  EXPECT_EQ(body["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(body["max_tokens"], 3);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["ignore_eos"], false);
}

TEST(BenchOpenAI, HttpErrorIsReported) {
  fake_server server;
  auto rec = run_one(server.url(), "busy");
  EXPECT_FALSE(rec.success);
  EXPECT_EQ(rec.error_code, "http_503");
  EXPECT_NE(rec.error_message.find("busy"), std::string::npos);
}

TEST(BenchOpenAI, DyingServerFailsTheRequest) {
  fake_server server;
  auto rec = run_one(server.url(), "dies");
  EXPECT_FALSE(rec.success);
  EXPECT_TRUE(rec.error_code == "read" || rec.error_code == "truncated") << rec.error_code;
  EXPECT_EQ(rec.chunk_times.size(), 1u);
}

TEST(BenchOpenAI, SilentServerTimesOut) {
  fake_server server;
  const auto t0 = std::chrono::steady_clock::now();
  auto rec = run_one(server.url(), "silent");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1400ms);
  EXPECT_FALSE(rec.success);
  EXPECT_EQ(rec.error_code, "read");
}

TEST(BenchOpenAI, UnreachableServerIsReportedNotHung) {
  // Bind a port without listening, then free it: connections are refused.
  int port = 0;
  {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
    close(fd);
  }
  openai_backend backend(options("http://127.0.0.1:" + std::to_string(port)));
  driver_options opts;
  opts.arrivals = {0, 0, 0, 0};
  opts.progress = false;
  opts.request.timeout = 400ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto result = run_benchmark(backend, std::vector<bench_request>(4), opts);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  auto m = compute_metrics(result.records, result.duration_s);
  EXPECT_EQ(m.failed, 4u);
  EXPECT_EQ(m.errors["connect"], 4u) << to_json(m).dump();
}

TEST(BenchOpenAI, DriverRespectsConcurrencyAndSchedule) {
  fake_server server;
  openai_backend backend(options(server.url(), "ok"));
  random_spec spec;
  spec.input_len = 8;
  spec.output_len = 3;
  auto reqs = random_dataset(6, spec, 1);
  driver_options opts;
  opts.arrivals = {0, 0, 0, 0, 0.05, 0.05};
  opts.max_concurrency = 2;
  opts.num_warmups = 1;
  opts.progress = false;
  auto result = run_benchmark(backend, reqs, opts);
  ASSERT_EQ(result.records.size(), 6u);
  auto m = compute_metrics(result.records, result.duration_s);
  EXPECT_EQ(m.completed, 6u);
  EXPECT_LE(m.max_concurrency, 2u);
  EXPECT_EQ(m.total_output_tokens, 18);
  EXPECT_GE(result.records[4].send_time, 0.05);

  // A duration cut sends only what is scheduled before it.
  opts.arrivals = {0, 0, 5, 5, 5, 5};
  opts.duration_s = 1;
  opts.num_warmups = 0;
  EXPECT_EQ(run_benchmark(backend, reqs, opts).records.size(), 2u);
}

// A backend that answers at once, recording when each request went.
class instant_backend final : public bench_backend {
 public:
  std::string name() const override { return "instant"; }
  void run(const bench_request& req, const request_context& ctx, request_record& rec) override {
    rec.chunk_times = {ctx.now()};
    rec.chunk_tokens = {1};
    rec.output_tokens = 1;
    rec.cached_tokens = req.turn * 10;
    rec.prompt_tokens = 20;
    rec.success = true;
  }
};

// Later turns go after their previous turn ended plus the think time, not
// on the schedule, and the records stay in dataset order.
TEST(BenchDriver, MultiTurnTurnsFollowTheirConversation) {
  multi_turn_spec spec;
  spec.turns = 3;
  spec.system_len = 4;
  spec.user_len = 2;
  spec.think_s = 0.1;
  auto reqs = multi_turn_dataset(6, spec, 1);
  instant_backend backend;
  driver_options opts;
  opts.arrivals = {0, 0.05, 9, 9, 9, 9};  // two conversations: the first two arrivals
  opts.progress = false;
  auto result = run_benchmark(backend, reqs, opts);
  ASSERT_EQ(result.records.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(result.records[i].index, i);
    EXPECT_EQ(result.records[i].turn, int(i % 3));
    if (i % 3 > 0) {
      EXPECT_GE(result.records[i].send_time, result.records[i - 1].end_time + 0.1);
    }
  }
  EXPECT_GE(result.records[3].send_time, 0.05);
  EXPECT_LT(result.duration_s, 5.0);  // the schedule's later arrivals were not waited for
  auto m = compute_metrics(result.records, result.duration_s);
  EXPECT_NEAR(m.cached_share, (0 + 10 + 20) * 2 / 120.0, 1e-9);
  EXPECT_NEAR(m.later_turns_cached_share, (10 + 20) * 2 / 80.0, 1e-9);
  EXPECT_EQ(m.later_turns_ttft_ms.count, 4u);
}

}  // namespace
}  // namespace troupe::bench
