#include "bench/bench_openai.hpp"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace troupe::bench {

std::vector<std::string> sse_parser::push(std::string_view bytes) {
  pending_.append(bytes);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    out.emplace_back(line);
  }
  pending_.erase(0, start);
  return out;
}

openai_backend::openai_backend(openai_options opts) : opts_(std::move(opts)) {}

namespace {

std::string http_error_code(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "connect";
    case httplib::Error::ConnectionTimeout:
      return "connect_timeout";
    case httplib::Error::Read:
      return "read";  // the server closed the stream, or was silent past the timeout
    case httplib::Error::Write:
      return "write";
    case httplib::Error::Canceled:
      return "stream_error";
    default:
      return "http_client";
  }
}

}  // namespace

void openai_backend::run(const bench_request& req, const request_context& ctx,
                         request_record& rec) {
  nlohmann::json body = {{"max_tokens", req.output_len > 0 ? req.output_len : 16},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"temperature", ctx.temperature},
                         {"ignore_eos", ctx.ignore_eos}};
  if (req.prompt_tokens.empty())
    body["prompt"] = req.prompt_text;
  else
    body["prompt"] = req.prompt_tokens;
  if (!opts_.model.empty()) body["model"] = opts_.model;

  httplib::Client cli(opts_.base_url);
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(ctx.timeout);
  cli.set_connection_timeout(
      std::min(timeout, std::chrono::microseconds(std::chrono::seconds(10))));
  cli.set_read_timeout(timeout);
  cli.set_write_timeout(timeout);

  httplib::Request hreq;
  hreq.method = "POST";
  hreq.path = opts_.endpoint;
  hreq.body = body.dump();
  hreq.set_header("Content-Type", "application/json");
  hreq.set_header("Accept", "text/event-stream");
  if (!opts_.api_key.empty()) hreq.set_header("Authorization", "Bearer " + opts_.api_key);

  int status = 0;
  std::string error_body;  // a non-200 response's body, for the message
  sse_parser sse;
  bool done = false;
  int counted_tokens = 0;
  std::optional<int> usage_tokens;
  std::string stream_error;
  hreq.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  hreq.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 400) error_body.append(data, std::min<size_t>(len, 400));
      return true;
    }
    for (const auto& payload : sse.push(std::string_view(data, len))) {
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      nlohmann::json j = nlohmann::json::parse(payload, nullptr, false);
      if (j.is_discarded()) {
        stream_error = "unparsable event: " + payload.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        stream_error = j["error"].dump().substr(0, 400);
        return false;
      }
      if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
        const auto& choice = (*c)[0];
        auto text = choice.find("text");
        if (text != choice.end() && text->is_string() &&
            !text->get_ref<const std::string&>().empty()) {
          rec.chunk_times.push_back(ctx.now());
          rec.chunk_tokens.push_back(1);
          ++counted_tokens;
          if (ctx.tokens_seen) ++*ctx.tokens_seen;
        }
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer())
          usage_tokens = (*u)["completion_tokens"].get<int>();
        if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer())
          rec.prompt_tokens = (*u)["prompt_tokens"].get<int>();
        // OpenAI's prompt cache count (llama-server sends it too).
        if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
          if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer())
            rec.cached_tokens = c->get<int>();
      }
      // llama-server's own: prompt tokens taken from its cache.
      if (auto t = j.find("timings"); t != j.end() && t->is_object() && rec.cached_tokens < 0)
        if (auto c = t->find("cache_n"); c != t->end() && c->is_number_integer())
          rec.cached_tokens = c->get<int>();
    }
    return true;
  };

  httplib::Response hres;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(hreq, hres, err);
  rec.output_tokens = usage_tokens.value_or(counted_tokens);
  if (!stream_error.empty()) {
    rec.error_code = "stream_error";
    rec.error_message = stream_error;
  } else if (!sent) {
    rec.error_code = http_error_code(err);
    rec.error_message = opts_.base_url + opts_.endpoint + ": " + httplib::to_string(err);
  } else if (hres.status != 200) {
    rec.error_code = "http_" + std::to_string(hres.status);
    rec.error_message = error_body.empty() ? hres.body.substr(0, 400) : error_body;
  } else if (rec.chunk_times.empty()) {
    // vLLM's rule: without a chunk there is no TTFT, so the request failed.
    rec.error_code = "no_output";
    rec.error_message = "the stream ended without a token";
  } else if (!done && !usage_tokens) {
    rec.error_code = "truncated";
    rec.error_message = "the stream ended without [DONE]";
  } else {
    rec.success = true;
  }
}

}  // namespace troupe::bench
