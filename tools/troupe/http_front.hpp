#pragma once
// troupe serve's OpenAI-compatible HTTP front (issue 13): GET /health,
// GET /v1/models and /v1/models/{id}, POST /v1/completions and
// /v1/chat/completions, streamed as server-sent events or whole, and
// llama-server's POST /tokenize and /detokenize; API keys (Authorization:
// Bearer), CORS for listed origins, OpenAI's error body for every error.  A thin adapter: each HTTP
// request is a client of the server's own ZeroMQ endpoint (tools/client/openai_api.hpp translates),
// so it goes through the same gateway, admission control, request actors, router and metrics as
// every other client.  A client that disconnects mid-stream has its requests cancelled (their pages
// freed).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/service/metrics.hpp"
#include "tools/client/openai_api.hpp"
#include "tools/client/openai_endpoints.hpp"
#include "tools/troupe/http_connection_guard.hpp"

namespace troupe::cli {

struct http_front_options {
  std::string host = "127.0.0.1";
  int port = 0;                      // 0: one the OS picks
  std::string model;                 // the name /v1/models lists and requests must name
  std::string endpoint;              // the server's own ZeroMQ endpoint (tcp://127.0.0.1:PORT)
  openai::token_text_fn token_text;  // a token id's text (logprobs)
  std::function<std::string(const std::vector<int32_t>&)> detokenize;  // echo of token prompts
  std::function<bool()> draining;                                      // /health says 503 once true
  std::function<bool()> serving;  // /health says 503 while false (no instance can serve)
  // GET /metrics: the Prometheus text; blocking (asks the service's
  // actors), so called off the event loop, every second, and served cached.
  std::function<std::string()> metrics;
  // Where the front records its own gauges (connections, unfinished bytes,
  // refusals), every second and at each GET /metrics: the service's
  // registry, so that --metrics-port's endpoint shows them too.  None: they
  // are appended to the HTTP port's /metrics only.
  std::shared_ptr<metrics_registry> registry;
  size_t max_body_bytes = 8 << 20;
  http_connection_limits limits;  // connections open, bytes of requests being read
  // The gateway's frame limit (0: none checked): a call whose Generate is
  // larger is answered 400 here (as FRAME_TOO_LARGE is), never sent.
  size_t max_frame_bytes = 0;
  // /tokenize: text -> ids (add_special: BOS where the model adds one).
  std::function<std::vector<int32_t>(const std::string&, bool add_special)> tokenize;
  int32_t vocab_size = 0;                 // /detokenize refuses ids outside it
  std::vector<std::string> api_keys;      // empty: no key checked
  std::vector<std::string> cors_origins;  // origins answered with CORS headers ("*": any)
  // How the model's chat template writes tools (from its family).
  openai::tool_format tools = openai::tool_format::hermes;
};

class http_front {
 public:
  // Binds (throws naming service.http_port when it cannot) and serves on
  // a thread of its own.
  explicit http_front(http_front_options o);
  ~http_front();
  http_front(const http_front&) = delete;
  http_front& operator=(const http_front&) = delete;
  int port() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::cli
