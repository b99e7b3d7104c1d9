#include "tools/troupe/http_front.hpp"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <random>
#include <stdexcept>
#include <thread>

#include "runtime/secret.hpp"
#include "tools/client/client.hpp"

namespace troupe::cli {

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// One choice as its messages arrive.
struct progress {
  openai::choice got;
  bool accepted = false;
  bool ended = false;
  std::optional<openai::api_error> error;
};

struct call_state {
  openai::call c;
  std::vector<progress> choices;
  std::unique_ptr<client::connection> conn;
  std::string id;
  int64_t created = 0;

  bool all(bool progress::*flag) const {
    for (const auto& p : choices)
      if (!(p.*flag) && !p.error) return false;
    return true;
  }
  const openai::api_error* first_error() const {
    for (const auto& p : choices)
      if (p.error) return &*p.error;
    return nullptr;
  }
  void cancel_open() {
    for (size_t i = 0; i < choices.size(); ++i)
      if (!choices[i].ended && !choices[i].error) conn->cancel(i + 1);
  }
};

// Folds one server message into its choice; the index, or -1.
int fold(call_state& s, const wire::ServerMessage& m) {
  auto at = [&](uint64_t id) -> progress* {
    return id >= 1 && id <= s.choices.size() ? &s.choices[id - 1] : nullptr;
  };
  if (m.has_accepted()) {
    if (auto* p = at(m.accepted().request_id())) {
      p->accepted = true;
      p->got.prompt_tokens = m.accepted().prompt_tokens();
      return int(m.accepted().request_id() - 1);
    }
  } else if (m.has_chunk()) {
    if (auto* p = at(m.chunk().request_id())) {
      const auto& ch = m.chunk();
      p->got.text += ch.text();
      p->got.token_ids.insert(p->got.token_ids.end(), ch.token_ids().begin(), ch.token_ids().end());
      p->got.logprobs.insert(p->got.logprobs.end(), ch.logprobs().begin(), ch.logprobs().end());
      return int(ch.request_id() - 1);
    }
  } else if (m.has_finished()) {
    if (auto* p = at(m.finished().request_id())) {
      const auto& f = m.finished();
      p->accepted = p->ended = true;
      p->got.prompt_tokens = f.prompt_tokens();
      p->got.completion_tokens = f.completion_tokens();
      if (auto r = openai::finish_reason(f.reason())) {
        p->got.finish = *r;
      } else {
        openai::api_error e;
        e.status = f.reason() == wire::CANCELLED ? 503 : 500;
        e.type = "server_error";
        e.message = "the request ended: " + wire::FinishReason_Name(f.reason()) +
                    (f.error().empty() ? "" : ": " + f.error());
        p->error = e;
      }
      return int(f.request_id() - 1);
    }
  } else if (m.has_error() && m.error().has_request_id()) {
    if (auto* p = at(m.error().request_id())) {
      p->error = openai::from_wire(m.error());
      return int(m.error().request_id() - 1);
    }
  }
  return -1;
}

// Receives until `done` holds; false after `quiet` of silence.
template <class Done, class Each>
bool pump(call_state& s, Done done, Each each, std::chrono::milliseconds quiet) {
  auto last = std::chrono::steady_clock::now();
  while (!done()) {
    auto m = s.conn->receive(50ms);
    if (!m) {
      if (std::chrono::steady_clock::now() - last > quiet) return false;
      if (!each(-1)) return true;  // the caller gave up (its client left)
      continue;
    }
    last = std::chrono::steady_clock::now();
    if (!each(fold(s, *m))) return true;
  }
  return true;
}

void send_error(httplib::Response& res, const openai::api_error& e) {
  res.status = e.status;
  res.set_content(openai::error_body(e).dump(), "application/json");
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(prefix) + buf;
}

// The body, read through the route's content reader with the limit held
// for every transfer encoding: httplib 0.11 applies its payload limit to a
// Content-Length body only and reads a chunked one whole, of any size.
// False when the body is larger (or the client stopped sending).
bool read_body(const httplib::ContentReader& reader, size_t limit, std::string& body,
               bool& too_large) {
  too_large = false;
  return reader([&](const char* data, size_t n) {
    if (n > limit - body.size()) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
}

// Whether the header carries one of the keys; every key is compared, each
// in constant time.
bool key_accepted(const std::vector<std::string>& keys, const std::string& authorization) {
  const auto given = openai::bearer_key(authorization);
  bool ok = false;
  for (const auto& k : keys) ok = (given && secrets_equal(*given, k)) || ok;
  return ok;
}

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  return sink.write(ev.data(), ev.size());
}

}  // namespace

struct http_front::impl {
  http_front_options opts;
  httplib::Server server;
  std::thread thread;
  int port = 0;

  // A POST body as JSON, read within the body limit; nullopt once the
  // error response is set.
  std::optional<nlohmann::ordered_json> json_body(const httplib::Request& req,
                                                  httplib::Response& res,
                                                  const httplib::ContentReader& reader) {
    std::string text;
    // A declared length over the limit is refused unread (httplib reads
    // none of it either).
    bool too_large = req.get_header_value<uint64_t>("Content-Length") > opts.max_body_bytes;
    if (too_large || !read_body(reader, opts.max_body_bytes, text, too_large)) {
      // What is left of the body is unread: this connection cannot carry
      // another request.
      res.set_header("Connection", "close");
      if (!too_large)
        send_error(res, {400, "the request body ended early", "invalid_request_error", "", ""});
      else
        send_error(res, {413,
                         "the request body is larger than " + std::to_string(opts.max_body_bytes) +
                             " bytes",
                         "invalid_request_error", "", "request_too_large"});
      return std::nullopt;
    }
    auto body = nlohmann::ordered_json::parse(text, nullptr, false);
    if (body.is_discarded()) {
      send_error(res, {400, "the request body is not JSON", "invalid_request_error", "", ""});
      return std::nullopt;
    }
    return body;
  }

  void completions(const nlohmann::ordered_json& body, httplib::Response& res, bool chat) {
    auto s = std::make_shared<call_state>();
    if (auto e = openai::parse(body, chat, opts.model, s->c)) return send_error(res, *e);
    // echo of a token-id prompt: its text (parse has no tokenizer).
    for (size_t k = 0; s->c.echo && opts.detokenize && k < s->c.echo_text.size(); ++k) {
      const auto& g = s->c.generates[k * size_t(s->c.n)];
      if (g.has_tokens())
        s->c.echo_text[k] =
            opts.detokenize(std::vector<int32_t>(g.tokens().ids().begin(), g.tokens().ids().end()));
    }
    s->choices.resize(s->c.generates.size());
    s->id = random_id(chat ? "chatcmpl-" : "cmpl-");
    s->created = static_cast<int64_t>(std::time(nullptr));
    s->conn = std::make_unique<client::connection>(opts.endpoint);
    // n samples of a prompt: the first goes alone, the others once it has
    // its first token.  By then its prompt's full KV pages are in the
    // prefix cache, so the other samples map those pages instead of
    // computing the prompt again.
    const size_t n = static_cast<size_t>(s->c.n);
    for (size_t i = 0; i < s->c.generates.size(); i += n) s->conn->generate(s->c.generates[i]);
    if (n > 1) {
      auto leaders_started = [&] {
        for (size_t i = 0; i < s->choices.size(); i += n) {
          const auto& p = s->choices[i];
          if (p.got.token_ids.empty() && !p.ended && !p.error) return false;
        }
        return true;
      };
      if (!pump(
              *s, leaders_started, [](int) { return true; }, 60s)) {
        s->cancel_open();
        return send_error(res, {504, "the server did not start the request in 60 s", "server_error",
                                "", "timeout"});
      }
      for (size_t i = 0; i < s->c.generates.size(); ++i)
        if (i % n != 0) s->conn->generate(s->c.generates[i]);
    }
    // Admission first: a refusal (overloaded, bad value, shutting down)
    // is an HTTP error status, before any event is streamed.
    if (!pump(
            *s, [&] { return s->all(&progress::accepted); }, [](int) { return true; }, 60s))
      return send_error(
          res, {504, "the server did not take the request in 60 s", "server_error", "", "timeout"});
    if (const auto* e = s->first_error()) {
      s->cancel_open();
      return send_error(res, *e);
    }
    if (s->c.stream) return stream(s, res);
    if (!pump(
            *s, [&] { return s->all(&progress::ended); }, [](int) { return true; }, 600s)) {
      s->cancel_open();
      return send_error(res, {504, "no progress in 600 s", "server_error", "", "timeout"});
    }
    if (const auto* e = s->first_error()) return send_error(res, *e);
    std::vector<openai::choice> choices;
    for (const auto& p : s->choices) choices.push_back(p.got);
    res.set_content(
        openai::response(s->c, s->id, opts.model, s->created, choices, opts.token_text).dump(),
        "application/json");
  }

  // Server-sent events: deltas as they come, each choice's end, the usage
  // when asked, then [DONE].  A client that goes away cancels the rest.
  void stream(std::shared_ptr<call_state> s, httplib::Response& res) {
    const auto token_text = opts.token_text;
    const std::string model = opts.model;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [s, token_text, model](
                                                              size_t, httplib::DataSink& sink) {
      auto& c = s->c;
      // What came before the stream began (with the acceptance).
      std::vector<size_t> shown(s->choices.size(), 0), lp_shown(s->choices.size(), 0);
      std::vector<bool> closed(s->choices.size(), false);
      bool ok = true;
      auto flush = [&](size_t i) {
        auto& p = s->choices[i];
        const std::string delta = p.got.text.substr(shown[i]);
        std::vector<wire::TokenLogprob> lps(p.got.logprobs.begin() + lp_shown[i],
                                            p.got.logprobs.end());
        if (!delta.empty() || !lps.empty())
          ok = ok && write_event(sink, openai::stream_chunk(c, s->id, model, s->created, i, delta,
                                                            lps, std::nullopt, false, token_text)
                                           .dump());
        shown[i] = p.got.text.size();
        lp_shown[i] = p.got.logprobs.size();
        if (!closed[i] && (p.ended || p.error)) {
          closed[i] = true;
          if (p.error)
            ok = ok && write_event(sink, openai::error_body(*p.error).dump());
          else
            ok = ok && write_event(sink, openai::stream_chunk(c, s->id, model, s->created, i, "",
                                                              {}, p.got.finish, false, token_text)
                                             .dump());
        }
      };
      for (size_t i = 0; i < s->choices.size(); ++i) {
        if (c.chat)
          ok = ok && write_event(sink, openai::stream_chunk(c, s->id, model, s->created, i, "", {},
                                                            std::nullopt, true, token_text)
                                           .dump());
        else if (c.echo && !c.echo_text[i / size_t(c.n)].empty())
          ok = ok && write_event(sink, openai::stream_chunk(c, s->id, model, s->created, i,
                                                            c.echo_text[i / size_t(c.n)], {},
                                                            std::nullopt, false, token_text)
                                           .dump());
        flush(i);
      }
      const bool finished = pump(
          *s, [&] { return s->all(&progress::ended); },
          [&](int i) {
            if (i >= 0) flush(size_t(i));
            return ok && sink.is_writable();
          },
          600s);
      if (!ok || !sink.is_writable() || !finished || !s->all(&progress::ended)) {
        s->cancel_open();  // the client left (or the server went quiet)
        return false;
      }
      if (c.include_usage) {
        uint64_t prompt = 0, completion = 0;
        for (size_t i = 0; i < s->choices.size(); ++i) {
          if (i % size_t(c.n) == 0) prompt += s->choices[i].got.prompt_tokens;
          completion += s->choices[i].got.completion_tokens;
        }
        write_event(sink,
                    openai::usage_chunk(c, s->id, model, s->created, prompt, completion).dump());
      }
      write_event(sink, "[DONE]");
      sink.done();
      return true;
    });
  }
};

http_front::http_front(http_front_options o) : impl_(std::make_unique<impl>()) {
  auto* p = impl_.get();
  p->opts = std::move(o);
  auto& svr = p->server;
  svr.set_payload_max_length(p->opts.max_body_bytes);
  svr.Get("/health", [p](const httplib::Request&, httplib::Response& res) {
    // 200 only while a request sent now could be served.
    const bool draining = p->opts.draining && p->opts.draining();
    const bool serving = !draining && (!p->opts.serving || p->opts.serving());
    res.status = serving ? 200 : 503;
    res.set_content(json{{"status", serving    ? "ok"
                                    : draining ? "draining"
                                               : "no_instance"}}
                        .dump(),
                    "application/json");
  });
  auto model_object = [p] {
    return json{{"id", p->opts.model},
                {"object", "model"},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"owned_by", "troupe"}};
  };
  svr.Get("/v1/models", [model_object](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"object", "list"}, {"data", json::array({model_object()})}}.dump(),
                    "application/json");
  });
  svr.Get(
      R"(/v1/models/(.+))", [p, model_object](const httplib::Request& req, httplib::Response& res) {
        if (req.matches[1] != p->opts.model)
          return send_error(res, {404, "The model '" + req.matches[1].str() + "' does not exist",
                                  "invalid_request_error", "model", "model_not_found"});
        res.set_content(model_object().dump(), "application/json");
      });
  // Every POST route reads its body through the content reader (the body
  // limit, whatever the transfer encoding).
  auto post = [p, &svr](const char* path, auto handle) {
    svr.Post(path, [p, handle](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
      if (auto body = p->json_body(req, res, reader)) handle(*body, res);
    });
  };
  post("/v1/completions", [p](const nlohmann::ordered_json& body, httplib::Response& res) {
    p->completions(body, res, false);
  });
  post("/v1/chat/completions", [p](const nlohmann::ordered_json& body, httplib::Response& res) {
    p->completions(body, res, true);
  });
  // llama-server's shapes: {"content", "add_special", "with_pieces"} ->
  // {"tokens": [ids] or [{"id", "piece"}]}; {"tokens"} -> {"content"}.
  post("/tokenize", [p](const nlohmann::ordered_json& body, httplib::Response& res) {
    openai::tokenize_request t;
    if (auto e = openai::parse_tokenize(body, t)) return send_error(res, *e);
    json tokens = json::array();
    for (int32_t id : p->opts.tokenize(t.content, t.add_special))
      tokens.push_back(t.with_pieces ? json{{"id", id}, {"piece", p->opts.token_text(id)}}
                                     : json(id));
    res.set_content(json{{"tokens", tokens}}.dump(), "application/json");
  });
  post("/detokenize", [p](const nlohmann::ordered_json& body, httplib::Response& res) {
    std::vector<int32_t> ids;
    if (auto e = openai::parse_detokenize(body, p->opts.vocab_size, ids))
      return send_error(res, *e);
    res.set_content(json{{"content", p->opts.detokenize(ids)}}.dump(), "application/json");
  });

  // API keys and CORS, ahead of every route; OpenAI's error body for any
  // error a route left without one (an unknown route: 404).
  svr.set_pre_routing_handler([p](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = req.get_header_value("Origin");
    if (!origin.empty() && openai::origin_allowed(p->opts.cors_origins, origin)) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {  // a browser's preflight: no key needed
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path == "/health" || p->opts.api_keys.empty() ||
        key_accepted(p->opts.api_keys, req.get_header_value("Authorization")))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, openai::unauthorized());
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const bool unknown = res.status == 404;
    send_error(res, {res.status,
                     unknown ? "unknown route: " + req.method + " " + req.path
                             : "the request failed (HTTP " + std::to_string(res.status) + ")",
                     "invalid_request_error", "", unknown ? "not_found" : ""});
  });
  const int bound = p->opts.port == 0
                        ? svr.bind_to_any_port(p->opts.host)
                        : (svr.bind_to_port(p->opts.host, p->opts.port) ? p->opts.port : -1);
  if (bound <= 0)
    throw std::runtime_error("service.http_port: cannot listen on " + p->opts.host + ":" +
                             std::to_string(p->opts.port) + " (in use?)");
  p->port = bound;
  p->thread = std::thread([p] { p->server.listen_after_bind(); });
}

http_front::~http_front() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int http_front::port() const {
  return impl_->port;
}

}  // namespace troupe::cli
