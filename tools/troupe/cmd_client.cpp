// troupe client: sends prompts to a `troupe serve` and streams the answers
// (or prints one JSON object per prompt with --json); `troupe client ping`
// checks that a server answers.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tools/client/client.hpp"
#include "tools/client/failover.hpp"
#include "tools/troupe/cluster_view.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct client_flags {
  std::string server;
  std::string cluster;  // with --server etcd://...: which cluster's services
  std::vector<std::string> prompts;
  std::string chat;
  std::string system;
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool offline = false;
  bool json = false;
  bool no_stream = false;
  unsigned deadline_ms = 0;
  int timeout_ms = 30000;
  int draft_tokens = -1;  // -1: the server's default
};

wire::Generate make_request(const client_flags& f, uint64_t id) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_max_tokens(f.max_tokens);
  auto* s = g.mutable_sampling();
  s->set_temperature(f.temperature);
  s->set_top_k(f.top_k);
  s->set_top_p(f.top_p);
  s->set_seed(f.seed);
  for (const auto& st : f.stop) g.add_stop(st);
  g.set_ignore_eos(f.ignore_eos);
  g.set_stream(!f.no_stream);
  g.set_request_class(f.offline ? wire::OFFLINE : wire::ONLINE);
  g.set_deadline_ms(f.deadline_ms);
  if (f.draft_tokens >= 0) g.set_draft_tokens(f.draft_tokens);
  return g;
}

int run_client(const client_flags& f) {
  if (f.prompts.empty() && f.chat.empty())
    throw std::invalid_argument(
        "give --prompt (one or more) or --chat (a non-empty message), or a command (ping, admin)");
  if (!f.prompts.empty() && !f.chat.empty())
    throw std::invalid_argument("give --prompt (one or more) or --chat, not both");
  // etcd://...: the cluster's services as its registry lists them, the
  // least loaded first.
  const bool from_registry = f.server.rfind("etcd://", 0) == 0;
  const auto endpoints = from_registry
                             ? rank_service_endpoints(read_cluster(f.server, f.cluster).services)
                             : client::split_endpoints(f.server);
  if (endpoints.empty())
    throw std::runtime_error("the registry " + f.server + " lists no service of the cluster");
  std::vector<wire::Generate> reqs;
  if (!f.chat.empty()) {
    auto g = make_request(f, 1);
    if (!f.system.empty()) {
      auto* m = g.mutable_chat()->add_messages();
      m->set_role("system");
      m->set_content(f.system);
    }
    auto* m = g.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(f.chat);
    reqs.push_back(std::move(g));
  } else {
    for (size_t i = 0; i < f.prompts.size(); ++i) {
      auto g = make_request(f, i + 1);
      g.set_text(f.prompts[i]);
      reqs.push_back(std::move(g));
    }
  }
  // One request streams to stdout as it comes; several are pipelined and
  // printed in order when done.
  const bool live = !f.json && reqs.size() == 1;
  auto show = [&](const wire::TokenChunk& c) {
    if (!live) return;
    std::fwrite(c.text().data(), 1, c.text().size(), stdout);
    std::fflush(stdout);
  };
  std::vector<client::result> results;
  if (endpoints.size() == 1 && !from_registry) {
    client::connection conn(endpoints[0]);
    results = client::run(conn, reqs, std::chrono::milliseconds(f.timeout_ms), show);
  } else {
    // Several services of one cluster: a lost one's requests go again to
    // the next that answers (client/failover.hpp).
    client::failover_options o;
    o.timeout = std::chrono::milliseconds(f.timeout_ms);
    o.on_chunk = show;
    o.on_failover = [live](const std::string& was, const std::string& next, size_t n) {
      if (live) std::printf("\n");
      if (next.empty())
        std::fprintf(stderr, "[troupe client: the service at %s was lost; no other answers]\n",
                     was.c_str());
      else
        std::fprintf(stderr,
                     "[troupe client: the service at %s was lost; %zu requests sent again to "
                     "%s, from their start]\n",
                     was.c_str(), n, next.c_str());
    };
    results = client::run_failover(endpoints, reqs, o);
  }
  int rc = 0;
  for (const auto& r : results) {
    if (f.json) {
      nlohmann::json j;
      j["request_id"] = r.request_id;
      // When the Accepted and the last message arrived here (ms since the
      // Unix epoch): lines of several clients can be lined up.
      j["accepted_unix_ms"] = r.accepted ? nlohmann::json(r.accepted_unix_ms) : nlohmann::json();
      j["finished_unix_ms"] = r.finished_unix_ms;
      if (r.error) {
        j["error"] = r.error->message();
        j["code"] = wire::ErrorCode_Name(r.error->code());
      } else {
        j["token_ids"] = r.token_ids;
        j["text"] = r.text;
        j["finish_reason"] = client::to_string(r.finished.reason());
        j["chunks"] = r.deltas.size();
        j["usage"] = {{"prompt_tokens", r.finished.prompt_tokens()},
                      {"completion_tokens", r.finished.completion_tokens()},
                      {"cached_tokens", r.finished.cached_tokens()},
                      {"instances", std::vector<uint64_t>(r.finished.instances().begin(),
                                                          r.finished.instances().end())}};
        j["timing"] = {{"queue_ms", r.finished.queue_ms()},
                       {"ttft_ms", r.finished.ttft_ms()},
                       {"tpot_ms", r.finished.tpot_ms()}};
        if (!r.finished.error().empty()) j["error"] = r.finished.error();
      }
      std::cout << j.dump() << std::endl;
    } else if (!r.error) {
      if (!live) std::fwrite(r.text.data(), 1, r.text.size(), stdout);
      std::printf("\n");
      std::fprintf(stderr,
                   "[request %llu] %u prompt tokens, %u generated, finish: %s, ttft %.1f ms, "
                   "tpot %.1f ms\n",
                   static_cast<unsigned long long>(r.request_id), r.finished.prompt_tokens(),
                   r.finished.completion_tokens(), client::to_string(r.finished.reason()).c_str(),
                   r.finished.ttft_ms(), r.finished.tpot_ms());
    }
    if (r.error) {
      std::fprintf(stderr, "error: request %llu: %s: %s\n",
                   static_cast<unsigned long long>(r.request_id),
                   wire::ErrorCode_Name(r.error->code()).c_str(), r.error->message().c_str());
      rc = 1;
    } else if (r.finished.reason() == wire::ERROR) {
      std::fprintf(stderr, "error: request %llu: %s\n",
                   static_cast<unsigned long long>(r.request_id), r.finished.error().c_str());
      rc = 1;
    }
  }
  return rc;
}

int run_ping(const client_flags& f) {
  if (f.server.rfind("etcd://", 0) == 0 || client::split_endpoints(f.server).size() > 1)
    throw std::invalid_argument("ping takes one endpoint; give --server one address");
  client::connection conn(f.server);
  const auto t0 = std::chrono::steady_clock::now();
  if (!conn.ping(std::chrono::milliseconds(f.timeout_ms))) {
    std::fprintf(stderr, "error: no answer from %s within %d ms\n", f.server.c_str(), f.timeout_ms);
    return 1;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("pong from %s in %.2f ms\n", f.server.c_str(), ms);
  return 0;
}

}  // namespace

void add_client(CLI::App& app) {
  auto f = std::make_shared<client_flags>();
  auto* cmd = app.add_subcommand("client", "send prompts to a troupe server");
  cmd->add_option("-s,--server", f->server,
                  "server endpoint (tcp://host:port, ipc://path); several services of one "
                  "cluster, comma-separated: the first that answers serves, and when it is lost "
                  "the unfinished requests go again to the next; or etcd://HOST:PORT: the "
                  "services its registry lists, the least loaded first")
      ->required();
  cmd->add_option("--cluster", f->cluster,
                  "with --server etcd://...: the cluster's fingerprint (default: the one the "
                  "registry holds)")
      ->check(cluster_fingerprint_check());
  cmd->add_option("-p,--prompt", f->prompts, "raw prompt text; repeat for pipelined requests")
      ->allow_extra_args(false);
  cmd->add_option("--chat", f->chat, "a user message, rendered with the model's chat template");
  cmd->add_option("--system", f->system, "system message for --chat");
  cmd->add_option("-n,--max-tokens", f->max_tokens, "most tokens to generate")
      ->default_val(128)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", f->temperature, "0 = greedy")->default_val(0.0f);
  cmd->add_option("--top-k", f->top_k, "0 = off")->default_val(0);
  cmd->add_option("--top-p", f->top_p, "1 = off")->default_val(1.0f);
  cmd->add_option("--seed", f->seed, "sampling seed")->default_val(0)->check(whole_number());
  cmd->add_option("--stop", f->stop, "stop string (repeatable)");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_flag("--offline", f->offline, "offline class (batch job, preempted first)");
  cmd->add_flag("--no-stream", f->no_stream, "ask for the whole answer in one chunk");
  cmd->add_option("--deadline-ms", f->deadline_ms, "server-side deadline (0: none)");
  cmd->add_option("--draft-tokens", f->draft_tokens,
                  "speculative decoding: n-gram draft tokens per step (0: off; default: the "
                  "server's)")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--timeout-ms", f->timeout_ms, "give up after this long without an answer")
      ->default_val(30000)
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_flag("--json", f->json,
                "print one JSON object per prompt: token_ids, text, finish_reason, usage, timing, "
                "accepted_unix_ms, finished_unix_ms");
  auto* ping = cmd->add_subcommand("ping", "check that the server answers (exit 0 if it does)");
  auto* admin = add_client_admin(*cmd, f->server, f->json);
  cmd->callback([f, ping, admin] {
    if (admin->parsed()) return;  // its own subcommands ran
    int rc = ping->parsed() ? run_ping(*f) : run_client(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
