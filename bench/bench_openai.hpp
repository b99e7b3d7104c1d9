#pragma once
// The serving benchmark's peer adapter: an OpenAI-compatible completions
// endpoint with streaming (llama-server's /v1/completions, vLLM, ...), read
// as `vllm bench serve --backend openai` reads it: server-sent events, one
// timestamp per chunk that carries text, the output token count from the
// final usage block when the server sends one (else one token per chunk).
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_driver.hpp"

namespace troupe::bench {

// Splits a server-sent-event byte stream into "data:" payloads; bytes may
// arrive in any pieces.  Comments (":...") and other fields are skipped.
class sse_parser {
 public:
  // Appends bytes; returns the payloads of the lines completed by them.
  std::vector<std::string> push(std::string_view bytes);

 private:
  std::string pending_;
};

struct openai_options {
  std::string base_url = "http://127.0.0.1:8080";  // scheme://host:port
  std::string endpoint = "/v1/completions";
  std::string model;    // "model" in the body; empty leaves it out
  std::string api_key;  // Authorization: Bearer, when set
};

class openai_backend final : public bench_backend {
 public:
  explicit openai_backend(openai_options opts);
  std::string name() const override { return "openai"; }
  void run(const bench_request& req, const request_context& ctx, request_record& rec) override;

 private:
  openai_options opts_;
};

}  // namespace troupe::bench
