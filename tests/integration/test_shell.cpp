// troupe shell (issue 12) against a live `troupe serve`: every read command
// through --exec parsed as JSON; every error it must word clearly (an
// unknown command with the nearest one, an unknown id, a bad argument, a
// command that is not there yet, a read-only secret, a server gone); and
// the shell driven as a person would through a pseudo-terminal: Tab
// completes a request id, `watch` refreshes and leaves on a key, `migrate`,
// `drain` and `kill` take effect while the client's tokens stay identical
// to offline greedy, and the history file keeps the commands.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "net/secret.hpp"
#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

process_result shell(const server_process& server, const std::string& args,
                     const std::string& env = "") {
  return run_process(env + " " + troupe_bin() + " shell --server " +
                     shell_quote(server.endpoint()) + " " + args);
}

std::vector<json> json_lines(const std::string& out) {
  std::vector<json> docs;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) docs.push_back(json::parse(line));
  return docs;
}

// Streams a long greedy request until it has `n` tokens (then leaves it
// streaming; the caller drains it).
void wait_tokens(client::connection& c, client::result& r, uint64_t id, size_t n) {
  auto find = [&](uint64_t x) { return x == id ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.token_ids.size() >= n || r.done(); }, 60s));
}

TEST(Shell, ExecPrintsJsonForEveryReadCommand) {
  server_process server("--local-instances 2");
  client::connection c(server.endpoint());
  c.generate(long_request(7));
  client::result r;
  wait_tokens(c, r, 7, 2);
  auto res = shell(server,
                   "--exec 'instances --json; requests --json; nodes --json; kv --json; "
                   "kv 1 --json; trace 7 --json; metrics --json; config --json'");
  ASSERT_EQ(res.exit_code, 0) << res.err;
  auto docs = json_lines(res.out);
  ASSERT_EQ(docs.size(), 8u) << res.out;
  const auto& inst = docs[0];
  ASSERT_EQ(inst.size(), 2u);
  for (const auto& i : inst) {
    EXPECT_TRUE(i.contains("id") && i.contains("role") && i.contains("state")) << i.dump();
    EXPECT_EQ(i["state"], "serving");
  }
  const auto& reqs = docs[1];
  bool seen = false;
  for (const auto& q : reqs)
    if (q["id"] == 7) {
      seen = true;
      EXPECT_TRUE(q["state"] == "running" || q["state"] == "migrating") << q.dump();
      EXPECT_GE(q["instance"].get<int>(), 1);
      EXPECT_GT(q["prompt_tokens"].get<int>(), 0);
    }
  EXPECT_TRUE(seen || r.done()) << reqs.dump();
  EXPECT_TRUE(docs[2].is_array() && docs[2].empty()) << "no nodes: local instances only";
  EXPECT_GT(docs[3]["total_pages"].get<int>(), 0);
  EXPECT_GT(docs[4]["total_pages"].get<int>(), 0);
  EXPECT_EQ(docs[5]["request_id"], 7);
  EXPECT_EQ(docs[6]["instances"], 2);
  EXPECT_EQ(docs[7]["engine"]["model"], "stories15m");
  EXPECT_EQ(docs[7]["service"]["local_instances"], 2);

  // Tables for people: headers and one row per instance.
  res = shell(server, "--exec 'instances; requests; kv'");
  ASSERT_EQ(res.exit_code, 0) << res.err;
  EXPECT_NE(res.out.find("ID  NODE"), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("STATE"), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("prefix hit rate"), std::string::npos) << res.out;
  c.cancel(7);
}

TEST(Shell, ErrorsAreClearAndNeverHang) {
  server_process server;
  auto expect_error = [&](const std::string& cmd, const std::string& words,
                          const std::string& env = "") {
    auto r = shell(server, "--exec " + shell_quote(cmd), env);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find(words), std::string::npos) << cmd << ": " << r.err;
  };
  expect_error("instnces", "did you mean 'instances'?");
  expect_error("trace 999999", "no request with id 999999");
  expect_error("migrate x 1", "migrate: give a request id, not 'x'");
  expect_error("kv 42", "no instance 42");
  expect_error("watch bogus", "no view 'bogus'");
  // Off a terminal no key ends a watch: a count is needed, and a number.
  expect_error("watch instances --count 0", "needs a terminal");
  expect_error("watch instances --count -1", "--count must be refreshes");
  expect_error("watch instances --count abc", "--count must be refreshes");
  expect_error("role 1 both", "role: give prefill, decode, mixed or encode");
  expect_error("role 9 prefill", "no serving instance 9");
  expect_error("spawn 127.0.0.1:1 2", "no node 127.0.0.1:1 in this service");
  // Started without --nodes or a registry: no node can join (it said
  // request_receiver_down, or nothing in 5 s, before).
  expect_error("node add 127.0.0.1:1 1", "this service takes no nodes");
  // The key's own range (the schema's), then the limits' rule across keys.
  expect_error("set max_seqs 100000", "set max_seqs: must be an integer in [1, 65536]");
  expect_error("set max_seqs 1000", "max_seqs must not exceed max_batch_tokens");
  expect_error("set kv_mb 10", "'kv_mb' cannot change live (max_batch_tokens, max_seqs");
  expect_error("set page_size 8", "cannot change live");
  expect_error("set router fastest", "must be one of round-robin, least-load, prefix, slo");
  expect_error("preempt 31337", "no request with id 31337");
  // One failing command fails the run; the others still ran.
  auto mixed = shell(server, "--exec 'kv --json; bogus'");
  EXPECT_NE(mixed.exit_code, 0);
  EXPECT_EQ(json_lines(mixed.out).size(), 1u) << mixed.out;
  // Commands from a pipe.
  auto piped = run_process("printf 'instances\\nhelp migrate\\n' | " + troupe_bin() +
                           " shell --server " + shell_quote(server.endpoint()));
  EXPECT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_NE(piped.out.find("ID  NODE"), std::string::npos) << piped.out;
  EXPECT_NE(piped.out.find("migrate ID INSTANCE"), std::string::npos) << piped.out;
  // A read-only secret reads but cannot control.
  const std::string read_secret =
      read_secret_file(run_secret_path("admin-read", server.admin_port()));
  const std::string ro = "TROUPE_ADMIN_SECRET=" + read_secret;
  EXPECT_EQ(shell(server, "--exec 'instances --json'", ro).exit_code, 0);
  expect_error("kill 1", "forbidden", ro);
  // A server gone: bounded, said, non-zero.
  server.signal(SIGKILL);
  server.wait_exit(10s);
  const auto t0 = std::chrono::steady_clock::now();
  auto gone = shell(server, "--admin-timeout-ms 1000 --exec instances");
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_NE(gone.err.find("no answer"), std::string::npos) << gone.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
}

// preempt and set change the live service: the preempted request still
// streams the tokens of offline greedy; the limits and the policy change
// on every instance.
TEST(Shell, PreemptAndSetTakeEffect) {
  // SmolLM2: the request must still stream when the shell comes.
  const std::string model = "smollm2-135m-instruct";
  server_process server("--local-instances 2 --router least-load", "troupe serve: listening on ",
                        model);
  const auto want = offline_tokens(model, "Once upon a time", 240);
  client::connection c(server.endpoint());
  c.generate(long_request(9));
  client::result r;
  wait_tokens(c, r, 9, 3);
  auto res =
      shell(server, "--exec 'preempt 9 --json; set max_seqs 8 --json; set router prefix --json'");
  ASSERT_EQ(res.exit_code, 0) << res.err;
  auto docs = json_lines(res.out);
  ASSERT_EQ(docs.size(), 3u) << res.out;
  EXPECT_EQ(docs[0]["preempted"], true);
  EXPECT_NE(docs[1]["changed"].get<std::string>().find("-> 8 on 2 instances"), std::string::npos)
      << docs[1];
  EXPECT_EQ(docs[2]["changed"], "router: least-load -> prefix");
  auto find = [&](uint64_t x) { return x == 9 ? &r : nullptr; };
  ASSERT_TRUE(receive_until(
      c, find, [&] { return r.done(); }, 60s));
  ASSERT_FALSE(r.error);
  EXPECT_EQ(r.token_ids, want);
  EXPECT_GE(server.admin("trace 9")["preemptions"].get<int>(), 1);
  // A request placed now says the new policy.
  auto next = client::run(c, {long_request(10)}, 60s);
  EXPECT_NE(server.admin("trace 10")["placement"].get<std::string>().find("prefix"),
            std::string::npos);
}

// The shell on a pseudo-terminal, typed into as a person would.
class pty_shell {
 public:
  pty_shell(const std::string& args) {
    winsize ws{};
    ws.ws_row = 40;
    ws.ws_col = 160;
    pid_ = ::forkpty(&fd_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      ::setenv("TERM", "xterm", 1);
      const std::string cmd = "exec " + troupe_bin() + " shell " + args;
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~pty_shell() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(fd_);
  }
  void type(const std::string& keys) { (void)!::write(fd_, keys.data(), keys.size()); }
  // Reads until `what` appears after what earlier expects consumed.
  bool expect(const std::string& what, std::chrono::milliseconds timeout = 20s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto at = out_.find(what, seen_);
      if (at != std::string::npos) {
        seen_ = at + what.size();
        return true;
      }
      if (std::chrono::steady_clock::now() >= until) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      out_.append(buf, static_cast<size_t>(n));
    }
  }
  const std::string& output() const { return out_; }
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      char buf[4096];
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) (void)!::read(fd_, buf, sizeof buf);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string out_;
  size_t seen_ = 0;
};

// A history file in another format (notes, a bash history) is left as it
// is, not replaced by libedit's after the first command (a probe lost a
// 3000-line file so); a device is not read at all.
TEST(Shell, AFileThatIsNotItsHistoryIsLeftAsItIs) {
  server_process server;
  const std::string notes = "/tmp/troupe_shell_notes_" + std::to_string(::getpid());
  std::string text;
  for (int i = 1; i <= 3000; ++i) text += std::to_string(i) + "\n";
  {
    std::ofstream out(notes);
    out << text;
  }
  struct remove_at_end {
    std::string path;
    ~remove_at_end() { std::remove(path.c_str()); }
  } cleanup{notes};
  for (const std::string& file : {notes, std::string("/dev/zero")}) {
    pty_shell sh("--server " + shell_quote(server.endpoint()) + " --history-file " + file);
    ASSERT_TRUE(sh.expect("troupe> ")) << sh.output();
    EXPECT_NE(sh.output().find("no history kept in " + file), std::string::npos) << sh.output();
    sh.type("instances\n");
    ASSERT_TRUE(sh.expect("ID  NODE")) << sh.output();
    sh.type("quit\n");
    EXPECT_EQ(sh.wait_exit(10s), 0);
  }
  EXPECT_EQ(slurp(notes), text);
}

TEST(Shell, DrivenThroughATerminal) {
  // SmolLM2: slow enough on this machine (tens of ms a token) that a
  // request still streams while a person types.
  const std::string model = "smollm2-135m-instruct";
  const std::string prompt = "Once upon a time";
  const int n = 480;
  const auto want = offline_tokens(model, prompt, n);
  server_process server("--local-instances 3 --router round-robin", "troupe serve: listening on ",
                        model);
  const std::string history = "/tmp/troupe_shell_history_" + std::to_string(::getpid());
  std::remove(history.c_str());
  pty_shell sh("--server " + shell_quote(server.endpoint()) + " --history-file " + history);
  ASSERT_TRUE(sh.expect("troupe> ")) << sh.output();

  client::connection c(server.endpoint());
  auto start = [&](uint64_t id, client::result& r) {
    wire::Generate g;
    g.set_request_id(id);
    g.set_text(prompt);
    g.set_max_tokens(n);
    g.set_ignore_eos(true);
    c.generate(g);
    wait_tokens(c, r, id, 3);
  };
  auto finish = [&](uint64_t id, client::result& r) {
    auto find = [&](uint64_t x) { return x == id ? &r : nullptr; };
    ASSERT_TRUE(receive_until(
        c, find, [&] { return r.done(); }, 60s));
    ASSERT_FALSE(r.error) << r.error->message();
    EXPECT_EQ(r.token_ids, want) << "request " << id;
  };
  auto where = [&](uint64_t id) {
    return server.admin("trace " + std::to_string(id))["instances"].back().get<int>();
  };

  // Tab completes a request id in flight.
  client::result a;
  start(424242, a);
  // (libedit redraws the completed word with cursor moves: the trace shows
  // the whole id came from the completion.)
  sh.type("trace 4242\t");
  ASSERT_TRUE(sh.expect("42 ")) << sh.output();
  sh.type("\n");
  ASSERT_TRUE(sh.expect("request_id: 424242")) << sh.output();
  ASSERT_TRUE(sh.expect("troupe> "));

  // watch refreshes in place and leaves on a key.
  sh.type("watch requests --interval 0.2\n");
  ASSERT_TRUE(sh.expect("refresh 2")) << sh.output();
  sh.type("q");
  ASSERT_TRUE(sh.expect("troupe> ")) << sh.output();

  // migrate: the request moves; its tokens stay those of offline greedy.
  const int from = where(424242);
  const int to = from % 3 + 1;
  sh.type("migrate 424242 " + std::to_string(to) + "\n");
  ASSERT_TRUE(sh.expect("migrate: done")) << sh.output();
  EXPECT_EQ(where(424242), to);

  // drain: its requests move off; it takes no new ones.
  sh.type("drain " + std::to_string(to) + "\n");
  ASSERT_TRUE(sh.expect("drain: done", 60s)) << sh.output();
  // (The drain is done when the instance holds nothing; the request actor
  // re-points itself as the export answers, which may be a moment later.)
  int after_drain = where(424242);
  for (int i = 0; i < 100 && after_drain == to; ++i) {
    std::this_thread::sleep_for(50ms);
    after_drain = where(424242);
  }
  ASSERT_NE(after_drain, to);

  // kill: the request recovers on the instance left.
  sh.type("kill " + std::to_string(after_drain) + "\n");
  ASSERT_TRUE(sh.expect("kill: done")) << sh.output();
  finish(424242, a);
  const auto t = server.admin("trace 424242");
  EXPECT_GE(t["migrations"].get<int>(), 2) << t.dump();
  EXPECT_EQ(t["recoveries"].get<int>(), 1) << t.dump();

  sh.type("bogus\n");
  ASSERT_TRUE(sh.expect("did you mean")) << sh.output();
  sh.type("quit\n");
  EXPECT_EQ(sh.wait_exit(10s), 0);
  const std::string kept = slurp(history);
  // (libedit's history file encodes a space as \040.)
  EXPECT_NE(kept.find("trace\\040424242"), std::string::npos) << kept;
  EXPECT_NE(kept.find("drain"), std::string::npos) << kept;
  std::remove(history.c_str());
}

}  // namespace
}  // namespace troupe::testing
