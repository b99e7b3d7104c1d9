// troupe serve as users run it: a real server process on loopback, real
// client processes and the client library.  Streamed answers match offline
// greedy `troupe generate` token for token, cancel and deadlines end a
// stream early, bad input gets an Error naming the problem while the server
// keeps serving, and SIGTERM lets in-flight requests finish.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "process.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new server_process(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static const std::string& endpoint() { return server_->endpoint(); }
  static inline server_process* server_ = nullptr;
};

wire::Generate text_request(uint64_t id, const std::string& text, int max_tokens) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text(text);
  g.set_max_tokens(max_tokens);
  return g;
}

// The next message, failing the test when none comes in time.
wire::ServerMessage next(client::connection& c, std::chrono::milliseconds t = 20s) {
  auto m = c.receive(t);
  if (!m) {
    ADD_FAILURE() << "no message from the server in " << t.count() << " ms";
    return {};
  }
  return *m;
}

// Waits for an Error; skips other messages (of requests still running).
wire::Error expect_error(client::connection& c) {
  for (int i = 0; i < 1000; ++i) {
    auto m = next(c);
    if (m.has_error()) return m.error();
    if (m.body_case() == wire::ServerMessage::BODY_NOT_SET) break;
  }
  ADD_FAILURE() << "no Error came";
  return {};
}

void expect_error_about(const wire::Error& e, wire::ErrorCode code, const std::string& what) {
  EXPECT_EQ(e.code(), code) << wire::ErrorCode_Name(e.code()) << ": " << e.message();
  EXPECT_NE(e.message().find(what), std::string::npos)
      << "expected '" << what << "' in: " << e.message();
}

TEST_F(Serve, ThreeClientProcessesMatchOfflineGreedy) {
  const std::vector<std::vector<std::string>> prompts = {
      {"Once upon a time", "The little dog", "Tom and Anna went"},
      {"One day, a bird", "The sun was", "Lily had a red ball"},
      {"There was a big tree", "Mom said", "The cat"}};
  const int n = 32;
  // The references: each prompt alone through `troupe generate`.
  std::map<std::string, nlohmann::json> want;
  for (const auto& group : prompts)
    for (const auto& p : group) {
      auto r = run_process(troupe_bin() + " generate -m stories15m -n " + std::to_string(n) +
                           " --json -p " + shell_quote(p));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      want[p] = nlohmann::json::parse(r.out);
    }
  // Three client processes at once, three pipelined streamed requests each.
  std::string cmd;
  const std::string base = "/tmp/troupe_serve_clients_" + std::to_string(::getpid());
  for (size_t i = 0; i < prompts.size(); ++i) {
    cmd += troupe_bin() + " client --json -n " + std::to_string(n) + " --server " +
           shell_quote(endpoint());
    for (const auto& p : prompts[i]) cmd += " -p " + shell_quote(p);
    cmd += " >" + base + "_" + std::to_string(i) + ".out 2>&1 & ";
  }
  cmd += "wait";
  auto all = run_process(cmd);
  ASSERT_EQ(all.exit_code, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string path = base + "_" + std::to_string(i) + ".out";
    std::istringstream lines(slurp(path));
    std::remove(path.c_str());
    for (const auto& p : prompts[i]) {
      std::string line;
      ASSERT_TRUE(std::getline(lines, line)) << "client " << i << ": no answer for " << p;
      auto got = nlohmann::json::parse(line);
      ASSERT_FALSE(got.contains("error")) << got.dump();
      EXPECT_EQ(got["token_ids"], want[p]["token_ids"]) << "prompt '" << p << "'";
      // The client's text is its streamed deltas concatenated.
      EXPECT_EQ(got["text"], want[p]["text"]) << "prompt '" << p << "'";
      EXPECT_EQ(got["finish_reason"], want[p]["finish_reason"]) << "prompt '" << p << "'";
      EXPECT_GT(got["chunks"].get<int>(), 1) << "not streamed: " << line;
      EXPECT_EQ(got["usage"]["prompt_tokens"], want[p]["usage"]["prompt_tokens"]);
      EXPECT_GT(got["timing"]["ttft_ms"].get<double>(), 0.0);
    }
  }
}

TEST_F(Serve, StreamedDeltasConcatenateAndStopStringsCut) {
  client::connection c(endpoint());
  // Reference: the whole answer.
  auto full = client::run(c, {text_request(1, "Once upon a time", 40)}, 30s).at(0);
  ASSERT_FALSE(full.error) << full.error->message();
  EXPECT_EQ(full.finished.reason(), wire::LENGTH);
  EXPECT_EQ(full.token_ids.size(), 40u);
  EXPECT_EQ(full.finished.completion_tokens(), 40u);
  std::string joined;
  for (const auto& d : full.deltas) joined += d;
  EXPECT_EQ(joined, full.text);
  // A stop string in the middle: output ends right before it.
  const auto at = full.text.find("Lily");
  ASSERT_NE(at, std::string::npos) << full.text;
  auto g = text_request(2, "Once upon a time", 40);
  g.add_stop("Lily");
  auto cut = client::run(c, {g}, 30s).at(0);
  ASSERT_FALSE(cut.error) << cut.error->message();
  EXPECT_EQ(cut.finished.reason(), wire::STOP);
  EXPECT_EQ(cut.finished.stop_matched(), "Lily");
  EXPECT_EQ(cut.text, full.text.substr(0, at));
  EXPECT_LT(cut.token_ids.size(), 40u);
  // Non-streaming: one chunk with everything.
  auto whole = text_request(3, "Once upon a time", 40);
  whole.set_stream(false);
  auto one = client::run(c, {whole}, 30s).at(0);
  EXPECT_EQ(one.deltas.size(), 1u);
  EXPECT_EQ(one.text, full.text);
  EXPECT_EQ(one.token_ids, full.token_ids);
}

TEST_F(Serve, CancelMidStreamAndDeadline) {
  client::connection c(endpoint());
  auto g = text_request(5, "Once upon a time", 200);
  g.set_ignore_eos(true);
  c.generate(g);
  client::result r;
  auto find = [&](uint64_t id) { return id == 5 ? &r : nullptr; };
  bool cancelled = false;
  while (!r.done()) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m) << "no answer";
    client::apply(*m, find);
    if (!cancelled && r.token_ids.size() >= 3) {
      c.cancel(5);
      cancelled = true;
    }
  }
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.finished.reason(), wire::CANCELLED);
  EXPECT_LT(r.finished.completion_tokens(), 200u);
  EXPECT_EQ(r.finished.completion_tokens(), r.token_ids.size());

  // Cancel of a request that is not in flight.
  c.cancel(5);
  expect_error_about(expect_error(c), wire::UNKNOWN_REQUEST, "5");

  auto d = text_request(6, "Once upon a time", 200);
  d.set_ignore_eos(true);
  d.set_deadline_ms(100);
  auto t = client::run(c, {d}, 30s).at(0);
  ASSERT_FALSE(t.error) << t.error->message();
  EXPECT_EQ(t.finished.reason(), wire::TIMEOUT);
  EXPECT_LT(t.finished.completion_tokens(), 200u);
}

TEST_F(Serve, BadInputGetsErrorsAndServingGoesOn) {
  client::connection c(endpoint());
  // Random bytes (an invalid wire type first, so they cannot parse).
  std::string junk = "\xff\xff\xff\xff";
  for (int i = 0; i < 60; ++i) junk += static_cast<char>((i * 73 + 11) & 0xff);
  c.send_raw(junk);
  expect_error_about(expect_error(c), wire::MALFORMED, "troupe.wire.ClientMessage");
  // A truncated protobuf.
  wire::ClientMessage full;
  full.set_protocol_version(wire::PROTOCOL_VERSION_CURRENT);
  *full.mutable_generate() = text_request(10, "Once upon a time there was a dog", 8);
  const auto bytes = full.SerializeAsString();
  c.send_raw(bytes.substr(0, bytes.size() / 2));
  expect_error_about(expect_error(c), wire::MALFORMED, "do not parse");
  // An unknown protocol version.
  full.set_protocol_version(99);
  c.send_raw(full.SerializeAsString());
  expect_error_about(expect_error(c), wire::UNSUPPORTED_VERSION, "99");
  // An empty frame: malformed, not an old client (zero bytes once parsed as
  // a message of version 0).
  c.send_raw("");
  expect_error_about(expect_error(c), wire::MALFORMED, "empty");
  // An empty prompt.
  c.generate(text_request(11, "", 8));
  auto e = expect_error(c);
  expect_error_about(e, wire::INVALID_ARGUMENT, "empty prompt");
  EXPECT_TRUE(e.has_request_id());
  EXPECT_EQ(e.request_id(), 11u);
  // NaN temperature.
  auto nan = text_request(12, "Once", 8);
  nan.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
  c.generate(nan);
  expect_error_about(expect_error(c), wire::INVALID_ARGUMENT, "temperature");
  // A prompt longer than the context (256 tokens for stories15M).
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "Once upon a time ";
  c.generate(text_request(13, long_text, 8));
  expect_error_about(expect_error(c), wire::CONTEXT_OVERFLOW, "context");
  // Prompt + max_tokens over the context.
  c.generate(text_request(14, "Once upon a time", 1000));
  expect_error_about(expect_error(c), wire::CONTEXT_OVERFLOW, "max_tokens 1000");
  // A 10 MB frame.
  c.send_raw(std::string(10 << 20, 'x'));
  expect_error_about(expect_error(c), wire::FRAME_TOO_LARGE, "10485760");
  // A duplicate request id while the first is in flight.
  auto first = text_request(15, "Once upon a time", 60);
  first.set_ignore_eos(true);
  c.generate(first);
  c.generate(text_request(15, "The cat", 8));
  client::result r;
  std::optional<wire::Error> dup;
  while (!r.done() || !dup) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m) << "no answer";
    if (m->has_error() && m->error().code() == wire::DUPLICATE_REQUEST_ID) {
      dup = m->error();
      continue;
    }
    client::apply(*m, [&](uint64_t id) { return id == 15 ? &r : nullptr; });
  }
  expect_error_about(*dup, wire::DUPLICATE_REQUEST_ID, "15");
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.finished.reason(), wire::LENGTH);
  EXPECT_EQ(r.token_ids.size(), 60u);
  // Token ids outside the vocabulary; a chat prompt for a model without a template.
  wire::Generate bad_ids;
  bad_ids.set_request_id(17);
  bad_ids.mutable_tokens()->add_ids(1);
  bad_ids.mutable_tokens()->add_ids(1 << 30);
  c.generate(bad_ids);
  expect_error_about(expect_error(c), wire::INVALID_ARGUMENT, "outside the vocabulary");
  wire::Generate chat;
  chat.set_request_id(18);
  auto* msg = chat.mutable_chat()->add_messages();
  msg->set_role("user");
  msg->set_content("hi");
  c.generate(chat);
  expect_error_about(expect_error(c), wire::INVALID_ARGUMENT, "chat template");
  // No body at all.
  wire::ClientMessage empty;
  c.send(empty);
  expect_error_about(expect_error(c), wire::MALFORMED, "no body");
  // Still serving, on this connection and on a new one.
  auto ok = client::run(c, {text_request(16, "Once upon a time", 8)}, 30s).at(0);
  ASSERT_FALSE(ok.error) << ok.error->message();
  EXPECT_EQ(ok.token_ids.size(), 8u);
  client::connection other(endpoint());
  EXPECT_TRUE(other.ping(5s));
}

TEST_F(Serve, VanishedClientBothersNobody) {
  {
    client::connection gone(endpoint());
    auto g = text_request(1, "Once upon a time", 200);
    g.set_ignore_eos(true);
    gone.generate(g);
    ASSERT_TRUE(gone.receive(10s));  // accepted: it runs; then the client vanishes
  }
  client::connection c(endpoint());
  auto ok = client::run(c, {text_request(1, "Once upon a time", 16)}, 30s).at(0);
  ASSERT_FALSE(ok.error) << ok.error->message();
  EXPECT_EQ(ok.token_ids.size(), 16u);
}

TEST_F(Serve, PingFromTheCommandLine) {
  auto r = run_process(troupe_bin() + " client --server " + shell_quote(endpoint()) + " ping");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pong"), std::string::npos) << r.out;
  // Nobody there: a clear error, not a hang.
  auto none =
      run_process(troupe_bin() + " client --server tcp://127.0.0.1:9 --timeout-ms 300 ping");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("no answer from tcp://127.0.0.1:9"), std::string::npos) << none.err;
}

TEST_F(Serve, TokenIdPromptsEqualTextPrompts) {
  client::connection c(endpoint());
  auto by_text = client::run(c, {text_request(1, "Once upon a time", 12)}, 30s).at(0);
  ASSERT_FALSE(by_text.error) << by_text.error->message();
  // stories15M: BOS, then "Once upon a time".
  wire::Generate g;
  g.set_request_id(2);
  g.set_max_tokens(12);
  for (int32_t t : {1, 9038, 2501, 263, 931}) g.mutable_tokens()->add_ids(t);
  auto by_ids = client::run(c, {g}, 30s).at(0);
  ASSERT_FALSE(by_ids.error) << by_ids.error->message();
  EXPECT_EQ(by_ids.token_ids, by_text.token_ids);
  EXPECT_EQ(by_ids.text, by_text.text);
  EXPECT_EQ(by_ids.finished.prompt_tokens(), 5u);
}

// OpenAI's logit_bias on the wire: a banned token is never drawn, a forced
// one always, greedy and sampled alike (drawn on the device or the host);
// ids outside the vocabulary are refused.
TEST_F(Serve, LogitBiasForcesAndBansTokens) {
  client::connection c(endpoint());
  auto plain = client::run(c, {text_request(1, "Once upon a time", 8)}, 30s).at(0);
  ASSERT_FALSE(plain.error) << plain.error->message();
  ASSERT_FALSE(plain.token_ids.empty());

  auto banned = text_request(2, "Once upon a time", 8);
  (*banned.mutable_sampling()->mutable_logit_bias())[plain.token_ids[0]] = -100;
  auto forced = text_request(3, "Once upon a time", 8);
  forced.set_ignore_eos(true);
  (*forced.mutable_sampling()->mutable_logit_bias())[263] = 100;
  auto sampled = forced;
  sampled.set_request_id(4);
  sampled.mutable_sampling()->set_temperature(0.8f);
  sampled.mutable_sampling()->set_seed(11);
  auto rs = client::run(c, {banned, forced, sampled}, 60s);
  for (const auto& r : rs) ASSERT_FALSE(r.error) << r.error->message();
  ASSERT_FALSE(rs[0].token_ids.empty());
  EXPECT_NE(rs[0].token_ids[0], plain.token_ids[0]);
  for (const auto& r : {rs[1], rs[2]}) {
    ASSERT_EQ(r.token_ids.size(), 8u);
    for (int32_t t : r.token_ids) EXPECT_EQ(t, 263);
  }

  auto outside = text_request(5, "Once upon a time", 4);
  (*outside.mutable_sampling()->mutable_logit_bias())[32000] = 1;
  c.generate(outside);
  expect_error_about(expect_error(c), wire::INVALID_ARGUMENT,
                     "logit_bias: token 32000 is outside the vocabulary");
  auto huge = text_request(6, "Once upon a time", 4);
  (*huge.mutable_sampling()->mutable_logit_bias())[5] = 1000;
  c.generate(huge);
  expect_error_about(expect_error(c), wire::INVALID_ARGUMENT, "must be in [-100, 100]");
}

TEST(ServeShutdown, SigtermLetsInFlightRequestsFinish) {
  server_process server("--grace-s 30");
  client::connection c(server.endpoint());
  auto g = text_request(1, "Once upon a time", 100);
  g.set_ignore_eos(true);
  c.generate(g);
  auto first = c.receive(20s);
  ASSERT_TRUE(first && first->has_accepted());
  server.signal(SIGTERM);
  client::result r;
  while (!r.done()) {
    auto m = c.receive(30s);
    ASSERT_TRUE(m) << "no answer after SIGTERM";
    client::apply(*m, [&](uint64_t id) { return id == 1 ? &r : nullptr; });
  }
  ASSERT_FALSE(r.error) << r.error->message();
  EXPECT_EQ(r.finished.reason(), wire::LENGTH);
  EXPECT_EQ(r.token_ids.size(), 100u);
  EXPECT_EQ(server.wait_exit(20s), 0) << server.stderr_text();
}

TEST(ServeConfig, BadValuesAreRefusedByKey) {
  auto r =
      run_process(troupe_bin() + " serve -m stories15m --listen 'tcp://127.0.0.1:*' --page-size 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("engine.page_size"), std::string::npos) << r.err;
  const std::string path = "/tmp/troupe_serve_cfg_" + std::to_string(::getpid()) + ".toml";
  {
    std::ofstream f(path);
    f << "[service]\nmax_queue = 0\n";
  }
  r = run_process(troupe_bin() + " serve -m stories15m --listen 'tcp://127.0.0.1:*' --config " +
                  path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("service.max_queue"), std::string::npos) << r.err;
  {
    std::ofstream f(path);
    f << "[engine]\nmodle = \"x\"\n";
  }
  r = run_process(troupe_bin() + " serve --listen 'tcp://127.0.0.1:*' --config " + path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown key 'engine.modle'"), std::string::npos) << r.err;
  {
    // The old name of engine.queue_steps is taken, with a note.
    std::ofstream f(path);
    f << "[engine]\npipeline = false\n[service]\nmax_queue = 0\n";
  }
  r = run_process(troupe_bin() + " serve -m stories15m --listen 'tcp://127.0.0.1:*' --config " +
                  path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("engine.pipeline is deprecated; use engine.queue_steps"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("service.max_queue"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

// One settings schema (runtime/config/settings.def): each layer overrides
// the one before it, key by key: default < TROUPE_<KEY> < the TOML file < the
// command line; admin config shows what came out.
TEST(ServeConfig, LayersApplyInOrderDefaultEnvironmentFileCommandLine) {
  const std::string path = "/tmp/troupe_serve_layers_" + std::to_string(::getpid()) + ".toml";
  {
    std::ofstream f(path);
    f << "[engine]\ngraph = false\nmax_seqs = 12\n[service]\nmax_queue = 77\n";
  }
  // The child inherits these; they are gone again before any other test.
  ::setenv("TROUPE_STEP_OVERLAP", "0", 1);  // env only: wins over the default
  ::setenv("TROUPE_GRAPH", "1", 1);         // the file says false: the file wins
  ::setenv("TROUPE_FUSE_STEP", "0", 1);     // the command line says true: it wins
  std::unique_ptr<server_process> server;
  try {
    server =
        std::make_unique<server_process>("--config " + path + " --fuse-step true --max-queue 99");
  } catch (...) {
    for (const char* v : {"TROUPE_STEP_OVERLAP", "TROUPE_GRAPH", "TROUPE_FUSE_STEP"}) ::unsetenv(v);
    throw;
  }
  for (const char* v : {"TROUPE_STEP_OVERLAP", "TROUPE_GRAPH", "TROUPE_FUSE_STEP"}) ::unsetenv(v);
  std::remove(path.c_str());
  auto cfg = server->admin("config");
  EXPECT_EQ(cfg["engine"]["step_overlap"], false) << cfg;
  EXPECT_EQ(cfg["engine"]["graph"], false) << cfg;
  EXPECT_EQ(cfg["engine"]["fuse_step"], true) << cfg;
  EXPECT_EQ(cfg["engine"]["max_seqs"], 12) << cfg;
  EXPECT_EQ(cfg["service"]["max_queue"], 99) << cfg;
  EXPECT_EQ(cfg["engine"]["chunk_size"], 128) << "the default" << cfg;
  EXPECT_FALSE(cfg["engine"].contains("pipeline")) << "aliases are not shown" << cfg;
  // Node overrides are checked by their key when the file is read.
  {
    std::ofstream f(path);
    f << "[[cluster.node]]\naddress = \"127.0.0.1:1\"\nmax_seqs = 0\n";
  }
  auto r = run_process(troupe_bin() +
                       " serve -m stories15m --listen 'tcp://127.0.0.1:*' --config " + path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cluster.node: max_seqs: must be an integer in [1, 65536]"),
            std::string::npos)
      << r.err;
  {
    std::ofstream f(path);
    f << "[[cluster.node]]\naddress = \"127.0.0.1:1\"\nmodel = \"x\"\n";
  }
  r = run_process(troupe_bin() + " serve -m stories15m --listen 'tcp://127.0.0.1:*' --config " +
                  path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown key 'model' (known: address, instances, platform"),
            std::string::npos)
      << r.err;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace troupe::testing
