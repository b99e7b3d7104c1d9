#include "tools/troupe/http_front.hpp"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>

#include "net/secret.hpp"
#include "runtime/common/json_depth.hpp"
#include "runtime/common/user_text.hpp"
#include "runtime/service/metrics.hpp"
#include "tools/client/openai_embeddings.hpp"
#include "tools/client/openai_responses.hpp"
#include "tools/troupe/http_connection_guard.hpp"

namespace troupe::cli {

namespace {

using json = nlohmann::json;
using in_json = nlohmann::ordered_json;

// JSON text with invalid UTF-8 replaced (U+FFFD): a token's text, a
// logprob's token or a detokenized id can end inside a character, and
// dump() would throw on it (a crash once, from the event loop).
std::string text_of(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Limits of the front itself (the engine's admission control comes after).
constexpr size_t k_max_calls = 4096;                // HTTP calls in progress at once; more get 429
constexpr size_t k_max_stream_backlog = 16u << 20;  // bytes a stream's client may leave unread
constexpr int k_io_timeout_s = 30;                  // a connection silent this long is closed
constexpr int k_admission_timeout_s = 60;           // until every choice is accepted
constexpr int k_quiet_timeout_s = 600;              // no message for a call this long: it ends
// Inputs of one /v1/embeddings call in the server at once: a call of 2048
// would otherwise fill the gateway's queue alone (and be refused).
constexpr size_t k_embedding_window = 8;

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(prefix) + buf;
}

// Whether the header carries one of the keys; every key is compared, each
// in constant time.
bool key_accepted(const std::vector<std::string>& keys, const std::string& authorization) {
  const auto given = openai::bearer_key(authorization);
  bool ok = false;
  for (const auto& k : keys) ok = (given && secrets_equal(*given, k)) || ok;
  return ok;
}

size_t header_count(evhttp_request* req, const char* name) {
  size_t n = 0;
  const evkeyvalq* all = evhttp_request_get_input_headers(req);
  for (const evkeyval* kv = all->tqh_first; kv; kv = kv->next.tqe_next)
    n += evutil_ascii_strcasecmp(kv->key, name) == 0 ? 1 : 0;
  return n;
}

std::string header(evhttp_request* req, const char* name) {
  const char* v = evhttp_find_header(evhttp_request_get_input_headers(req), name);
  return v ? v : "";
}

const char* reason_of(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "";
  }
}

void reply(evhttp_request* req, int status, const std::string& body,
           const char* type = "application/json") {
  auto* out = evhttp_request_get_output_headers(req);
  evhttp_add_header(out, "Content-Type", type);
  if (status == 429 || status == 503) evhttp_add_header(out, "Retry-After", "1");
  // HEAD: the head a GET would get, Content-Length included, and no body
  // (libevent would send one, which a keep-alive client reads as the start
  // of the next response).
  if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
    evhttp_add_header(out, "Content-Length", std::to_string(body.size()).c_str());
    return evhttp_send_reply(req, status, reason_of(status), nullptr);
  }
  evbuffer* buf = evbuffer_new();
  evbuffer_add(buf, body.data(), body.size());
  evhttp_send_reply(req, status, reason_of(status), buf);
  evbuffer_free(buf);
}

void reply_error(evhttp_request* req, const openai::api_error& e) {
  reply(req, e.status, text_of(openai::error_body(e)));
}

// One choice as its messages arrive, and how much of it a stream has shown.
struct progress {
  openai::choice got;
  bool accepted = false, ended = false, closed = false;
  std::optional<openai::api_error> error;
  size_t shown = 0, lp_shown = 0;
};

}  // namespace

// The front: a libevent loop on one thread of its own.  Every HTTP
// connection and every stream is an event on it, never a thread, so slow
// or idle clients cost a socket and a buffer, not a worker.  All calls
// share one ZeroMQ DEALER socket to the server's own endpoint; each choice
// has a request id of its own on it.
struct http_front::impl {
  struct call;

  http_front_options opts;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  event* zmq_event = nullptr;
  event* tick_event = nullptr;
  event* probe_event = nullptr;
  std::unique_ptr<http_connection_guard> guard;  // connections and unfinished requests bounded
  std::thread loop, health_poll, metrics_poll;
  std::atomic<bool> stopping{false};
  std::atomic<bool> serving{true};
  std::mutex metrics_mutex;
  std::string metrics_text;  // the last render (GET /metrics), by the poll thread
  int port = 0;
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, std::pair<call*, size_t>> by_id;  // wire id -> call, choice
  std::unordered_map<call*, std::unique_ptr<call>> calls;

  struct call {
    impl* front = nullptr;
    evhttp_request* req = nullptr;  // null once the client left
    evhttp_connection* conn = nullptr;
    openai::call c;
    std::vector<progress> choices;
    std::vector<uint64_t> ids;  // wire request id of each choice
    std::string id;
    int64_t created = 0;
    bool followers_sent = false;  // n > 1: the samples after each prompt's first
    bool streaming = false;       // the event stream has begun
    // POST /v1/responses: a chat call answered as a Response
    // (tools/client/openai_responses.hpp); its stream's event count.
    bool responses = false;
    openai::response_state resp;
    // POST /v1/embeddings: its inputs (one choice each) and their encoding.
    bool embeddings = false;
    openai::embeddings_call emb;
    size_t sent = 0;  // its inputs sent so far (k_embedding_window at a time)
    uint64_t sequence = 0;
    event* timer = nullptr;
    ~call() {
      if (timer) event_free(timer);
    }
  };

  // --- the ZeroMQ side -------------------------------------------------

  // False when the message could not be queued (the socket has no limit
  // on queued messages, so only a closed endpoint refuses).
  bool send(wire::ClientMessage m) {
    m.set_protocol_version(wire::PROTOCOL_VERSION_CURRENT);
    const std::string bytes = m.SerializeAsString();
    try {
      return sock.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;
    }
  }
  void send_generate(call& k, size_t i) {
    wire::ClientMessage m;
    *m.mutable_generate() = k.c.generates[i];
    m.mutable_generate()->set_request_id(k.ids[i]);
    // A frame over the gateway's limit is refused here: far over it,
    // ZeroMQ would drop this front's one connection, and every call's
    // stream with it.
    if (opts.max_frame_bytes > 0 && m.ByteSizeLong() > opts.max_frame_bytes) {
      // 400, as the gateway's FRAME_TOO_LARGE would have come back.
      k.choices[i].error = openai::api_error{400,
                                             "the request is " + std::to_string(m.ByteSizeLong()) +
                                                 " bytes as a frame and the server takes " +
                                                 std::to_string(opts.max_frame_bytes) +
                                                 " (--max-frame-bytes; images count toward it)",
                                             "invalid_request_error", "", ""};
      by_id.erase(k.ids[i]);
      return;
    }
    if (!send(std::move(m))) {
      k.choices[i].error =
          openai::api_error{503, "the server's endpoint took no request", "server_error", "", ""};
      by_id.erase(k.ids[i]);
    }
  }
  void send_cancel(uint64_t id) {
    wire::ClientMessage m;
    m.mutable_cancel()->set_request_id(id);
    send(std::move(m));
  }

  // Takes every message that has come (ZeroMQ's fd signals edges only, so
  // it drains until none is left).
  void drain_zmq() {
    for (;;) {
      zmq::message_t frame;
      try {
        if (!sock.recv(frame, zmq::recv_flags::dontwait)) return;
      } catch (const zmq::error_t&) {
        return;
      }
      wire::ServerMessage m;
      if (!m.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) continue;
      uint64_t id = 0;
      if (m.has_accepted())
        id = m.accepted().request_id();
      else if (m.has_chunk())
        id = m.chunk().request_id();
      else if (m.has_finished())
        id = m.finished().request_id();
      else if (m.has_error() && m.error().has_request_id())
        id = m.error().request_id();
      auto it = by_id.find(id);
      if (it == by_id.end()) continue;  // a cancelled call's late news
      auto [k, i] = it->second;
      fold(k->choices[i], m);
      if (k->choices[i].ended || k->choices[i].error) by_id.erase(it);
      // The admission deadline stands until every choice is taken; then
      // each message restarts the quiet one (an embeddings call's inputs
      // go a window at a time: every message restarts it).
      if (k->embeddings || all(*k, &progress::accepted)) arm(*k, k_quiet_timeout_s);
      try {
        advance(*k, static_cast<int>(i));
      } catch (const std::exception& e) {
        // Nothing a reply holds may end the loop (every client's stream).
        fail(*k, {500, std::string("internal error: ") + e.what(), "server_error", "", ""});
      }
    }
  }

  static void fold(progress& p, const wire::ServerMessage& m) {
    if (m.has_accepted()) {
      p.accepted = true;
      p.got.prompt_tokens = m.accepted().prompt_tokens();
    } else if (m.has_chunk()) {
      const auto& ch = m.chunk();
      p.got.text += ch.text();
      p.got.token_ids.insert(p.got.token_ids.end(), ch.token_ids().begin(), ch.token_ids().end());
      p.got.logprobs.insert(p.got.logprobs.end(), ch.logprobs().begin(), ch.logprobs().end());
    } else if (m.has_finished()) {
      const auto& f = m.finished();
      p.accepted = p.ended = true;
      p.got.prompt_tokens = f.prompt_tokens();
      p.got.completion_tokens = f.completion_tokens();
      p.got.embedding.assign(f.embedding().begin(), f.embedding().end());
      if (auto r = openai::finish_reason(f.reason())) {
        p.got.finish = *r;
      } else {
        openai::api_error e;
        e.status = f.reason() == wire::CANCELLED ? 503 : 500;
        e.type = "server_error";
        e.message = "the request ended: " + wire::FinishReason_Name(f.reason()) +
                    (f.error().empty() ? "" : ": " + f.error());
        p.error = e;
      }
    } else if (m.has_error()) {
      p.error = openai::from_wire(m.error());
    }
  }

  // --- a call's course -------------------------------------------------

  void arm(call& k, int seconds) {
    timeval tv{seconds, 0};
    evtimer_add(k.timer, &tv);
  }

  bool all(const call& k, bool progress::*flag) const {
    for (const auto& p : k.choices)
      if (!(p.*flag) && !p.error) return false;
    return true;
  }
  const openai::api_error* first_error(const call& k) const {
    for (const auto& p : k.choices)
      if (p.error) return &*p.error;
    return nullptr;
  }

  // Cancels what is still open and forgets the call.
  void finish(call& k) {
    for (size_t i = 0; i < k.ids.size(); ++i) {
      const bool sent = k.embeddings ? i < k.sent : k.followers_sent || i % size_t(k.c.n) == 0;
      if (by_id.erase(k.ids[i]) && sent) send_cancel(k.ids[i]);
    }
    if (k.conn) {
      evhttp_connection_set_closecb(k.conn, nullptr, nullptr);
      evhttp_connection_set_timeout(k.conn, k_io_timeout_s);  // idle again
    }
    calls.erase(&k);
  }

  void fail(call& k, const openai::api_error& e) {
    if (k.req) {
      if (k.streaming && k.responses) {  // a typed event, as the Responses stream's others
        write_response_event(k, "error",
                             {{"code", e.code.empty() ? e.type : e.code},
                              {"message", e.message},
                              {"param", e.param.empty() ? json() : json(e.param)}});
        evhttp_send_reply_end(k.req);
      } else if (k.streaming) {
        write_event(k, text_of(openai::error_body(e)));
        evhttp_send_reply_end(k.req);
      } else {
        reply_error(k.req, e);
      }
    }
    finish(k);
  }

  void write_raw(call& k, const std::string& ev) {
    evbuffer* buf = evbuffer_new();
    evbuffer_add(buf, ev.data(), ev.size());
    evhttp_send_reply_chunk(k.req, buf);
    evbuffer_free(buf);
  }
  void write_event(call& k, const std::string& data) { write_raw(k, "data: " + data + "\n\n"); }
  void write_response_event(call& k, const std::string& type, json fields) {
    write_raw(k, openai::response_event(type, std::move(fields), k.sequence++));
  }

  // The Response a finished choice makes.
  void settle_response(call& k, const openai::choice& got) {
    k.resp.text = got.text;
    k.resp.input_tokens = got.prompt_tokens;
    k.resp.output_tokens = got.completion_tokens;
    k.resp.status = got.finish == "length" ? "incomplete" : "completed";
  }

  // A Responses stream: each delta as response.output_text.delta, then the
  // text, part, item and response done (completed or incomplete), or an
  // error event.
  void flush_response(call& k) {
    auto& p = k.choices[0];
    const json where = {{"item_id", k.resp.item_id}, {"output_index", 0}, {"content_index", 0}};
    const std::string delta = p.got.text.substr(p.shown);
    if (!delta.empty()) {
      json ev = where;
      ev["delta"] = delta;
      ev["logprobs"] = json::array();
      write_response_event(k, "response.output_text.delta", std::move(ev));
    }
    p.shown = p.got.text.size();
    if (p.closed || !(p.ended || p.error)) return;
    p.closed = true;
    if (p.error) {
      return write_response_event(
          k, "error",
          {{"code", p.error->code.empty() ? p.error->type : p.error->code},
           {"message", p.error->message},
           {"param", p.error->param.empty() ? json() : json(p.error->param)}});
    }
    settle_response(k, p.got);
    json text_done = where;
    text_done["text"] = k.resp.text;
    text_done["logprobs"] = json::array();
    write_response_event(k, "response.output_text.done", std::move(text_done));
    json part_done = where;
    part_done["part"] = openai::output_message(k.resp, "completed")["content"][0];
    write_response_event(k, "response.content_part.done", std::move(part_done));
    write_response_event(
        k, "response.output_item.done",
        {{"output_index", 0},
         {"item", openai::output_message(
                      k.resp, k.resp.status == "completed" ? "completed" : "incomplete")}});
    write_response_event(
        k, k.resp.status == "completed" ? "response.completed" : "response.incomplete",
        {{"response", openai::response_object(k.resp)}});
  }

  // What choice `i` has that the stream has not shown yet.  A chat with
  // tools shows a choice whole when it ends (its text is read for calls).
  void flush(call& k, size_t i) {
    if (k.responses) return flush_response(k);
    auto& p = k.choices[i];
    if (k.c.chat && k.c.tools.active()) {
      if (p.closed || !(p.ended || p.error)) return;
      p.closed = true;
      if (p.error) return write_event(k, text_of(openai::error_body(*p.error)));
      write_event(
          k, text_of(openai::tool_reply_chunk(k.c, k.id, opts.model, k.created, i, p.got.text)));
      write_event(k, text_of(openai::stream_chunk(k.c, k.id, opts.model, k.created, i, "", {},
                                                  openai::chat_finish(k.c, p.got), false,
                                                  opts.token_text)));
      return;
    }
    const std::string delta = p.got.text.substr(p.shown);
    std::vector<wire::TokenLogprob> lps(p.got.logprobs.begin() + long(p.lp_shown),
                                        p.got.logprobs.end());
    if (!delta.empty() || !lps.empty())
      write_event(k, text_of(openai::stream_chunk(k.c, k.id, opts.model, k.created, i, delta, lps,
                                                  std::nullopt, false, opts.token_text)));
    p.shown = p.got.text.size();
    p.lp_shown = p.got.logprobs.size();
    if (!p.closed && (p.ended || p.error)) {
      p.closed = true;
      if (p.error)
        write_event(k, text_of(openai::error_body(*p.error)));
      else
        write_event(k, text_of(openai::stream_chunk(k.c, k.id, opts.model, k.created, i, "", {},
                                                    p.got.finish, false, opts.token_text)));
    }
  }

  // An embeddings call's next inputs, up to k_embedding_window in the
  // server at once.
  void send_more(call& k) {
    size_t open = 0;
    for (size_t i = 0; i < k.sent; ++i) open += k.choices[i].ended || k.choices[i].error ? 0 : 1;
    for (; k.sent < k.choices.size() && open < k_embedding_window; ++k.sent, ++open)
      send_generate(k, k.sent);
  }

  // Moves the call on after news of choice `changed` (-1: none).
  void advance(call& k, int changed) {
    const size_t n = static_cast<size_t>(k.c.n);
    if (k.embeddings) {
      if (const auto* e = first_error(k)) return fail(k, *e);  // one input refused fails the call
      send_more(k);
    }
    // n samples of a prompt: the first goes alone, the others once it has
    // its first token.  By then its prompt's full KV pages are in the
    // prefix cache, so the other samples map those pages instead of
    // computing the prompt again.
    if (!k.followers_sent) {
      for (size_t i = 0; i < k.choices.size(); i += n) {
        const auto& p = k.choices[i];
        if (p.got.token_ids.empty() && !p.ended && !p.error) return;
      }
      k.followers_sent = true;
      for (size_t i = 0; i < k.choices.size(); ++i)
        if (i % n != 0) send_generate(k, i);
    }
    if (!k.streaming) {
      // Admission first: a refusal (overloaded, bad value, shutting down)
      // is an HTTP error status, before any event is streamed.
      if (!all(k, &progress::accepted)) return;
      if (const auto* e = first_error(k)) return fail(k, *e);
      if (k.c.stream) return start_stream(k);
      if (!all(k, &progress::ended)) return;
      std::vector<openai::choice> done;
      for (const auto& p : k.choices) done.push_back(p.got);
      if (k.responses) {
        settle_response(k, done.at(0));
        reply(k.req, 200, text_of(openai::response_object(k.resp)));
      } else if (k.embeddings) {
        std::vector<std::vector<float>> vectors;
        uint64_t prompt_tokens = 0;
        for (auto& d : done) {
          prompt_tokens += d.prompt_tokens;
          vectors.push_back(std::move(d.embedding));
        }
        reply(k.req, 200,
              text_of(openai::embeddings_response(k.emb, opts.model, vectors, prompt_tokens)));
      } else {
        reply(k.req, 200,
              text_of(openai::response(k.c, k.id, opts.model, k.created, done, opts.token_text)));
      }
      return finish(k);
    }
    if (changed >= 0) flush(k, size_t(changed));
    if (!all(k, &progress::ended)) {
      // A client that does not read: its stream ends before its buffer
      // holds the whole generation.
      auto* out = bufferevent_get_output(evhttp_connection_get_bufferevent(k.conn));
      if (evbuffer_get_length(out) > k_max_stream_backlog) {
        evhttp_connection_free(k.conn);  // runs on_close, which cancels
      }
      return;
    }
    if (k.responses) {  // its last event was response.completed (or an error)
      evhttp_send_reply_end(k.req);
      return finish(k);
    }
    if (k.c.include_usage) {
      uint64_t prompt = 0, completion = 0;
      for (size_t i = 0; i < k.choices.size(); ++i) {
        if (i % n == 0) prompt += k.choices[i].got.prompt_tokens;
        completion += k.choices[i].got.completion_tokens;
      }
      write_event(
          k, text_of(openai::usage_chunk(k.c, k.id, opts.model, k.created, prompt, completion)));
    }
    write_event(k, "[DONE]");
    evhttp_send_reply_end(k.req);
    finish(k);
  }

  // Server-sent events: deltas as they come, each choice's end, the usage
  // when asked, then [DONE].  A client that goes away cancels the rest.
  void start_stream(call& k) {
    k.streaming = true;
    auto* out = evhttp_request_get_output_headers(k.req);
    evhttp_add_header(out, "Content-Type", "text/event-stream");
    evhttp_add_header(out, "Cache-Control", "no-cache");
    evhttp_send_reply_start(k.req, 200, "OK");
    if (k.responses) {
      write_response_event(k, "response.created", {{"response", openai::response_object(k.resp)}});
      write_response_event(k, "response.in_progress",
                           {{"response", openai::response_object(k.resp)}});
      json item = openai::output_message(k.resp, "in_progress");
      item["content"] = json::array();
      write_response_event(k, "response.output_item.added",
                           {{"output_index", 0}, {"item", std::move(item)}});
      write_response_event(
          k, "response.content_part.added",
          {{"item_id", k.resp.item_id},
           {"output_index", 0},
           {"content_index", 0},
           {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    }
    for (size_t i = 0; i < k.choices.size(); ++i) {
      if (k.c.chat && !k.responses)
        write_event(k, text_of(openai::stream_chunk(k.c, k.id, opts.model, k.created, i, "", {},
                                                    std::nullopt, true, opts.token_text)));
      else if (k.c.echo && !k.c.echo_text[i / size_t(k.c.n)].empty())
        write_event(k, text_of(openai::stream_chunk(k.c, k.id, opts.model, k.created, i,
                                                    k.c.echo_text[i / size_t(k.c.n)], {},
                                                    std::nullopt, false, opts.token_text)));
      flush(k, i);
    }
    advance(k, -1);
  }

  // Whether the peer of `conn` has closed it (end of stream or an error
  // on a peek; bytes of a next pipelined request are not a close).
  static bool peer_closed(evhttp_connection* conn) {
    bufferevent* bev = evhttp_connection_get_bufferevent(conn);
    const evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd < 0) return false;
    char byte;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  void drop_abandoned() {
    std::vector<evhttp_connection*> gone;
    for (auto& [k, owned] : calls)
      if (!k->streaming && k->conn && peer_closed(k->conn) &&
          std::find(gone.begin(), gone.end(), k->conn) == gone.end())
        gone.push_back(k->conn);
    for (auto* conn : gone) evhttp_connection_free(conn);  // runs on_close, which cancels
  }

  static void on_close(evhttp_connection*, void* arg) {
    auto* k = static_cast<call*>(arg);
    // libevent 2.1 frees a request still on its connection after this; one
    // it took off (the connection failed, by the client's close or reset
    // or a timeout, while the answer was unfinished) is left to us, and
    // was leaked (about 1 MB a stream a client left).
    if (k->req && !evhttp_request_get_connection(k->req)) evhttp_request_free(k->req);
    k->req = nullptr;
    k->conn = nullptr;
    k->front->finish(*k);
  }

  static void on_timer(evutil_socket_t, short, void* arg) {
    auto* k = static_cast<call*>(arg);
    auto* self = k->front;
    if (!self->all(*k, &progress::accepted))
      return self->fail(*k, {504,
                             "the server did not take the request in " +
                                 std::to_string(k_admission_timeout_s) + " s",
                             "server_error", "", "timeout"});
    self->fail(*k, {504, "no progress in " + std::to_string(k_quiet_timeout_s) + " s",
                    "server_error", "", "timeout"});
  }

  // POST /v1/responses: the same call as a chat completion, answered as a
  // Response (tools/client/openai_responses.hpp).
  void responses(evhttp_request* req, const in_json& body) {
    in_json chat;
    if (auto e = openai::responses_as_chat(body, chat)) return reply_error(req, *e);
    completions(req, chat, true, &body);
  }

  // A new call for `req`, or null when the front takes no more (answered).
  std::unique_ptr<call> new_call(evhttp_request* req) {
    if (opts.draining && opts.draining()) {
      reply_error(req, {503, "the server is shutting down", "server_error", "", "shutting_down"});
      return nullptr;
    }
    if (calls.size() >= k_max_calls) {
      reply_error(req, {429,
                        "too many HTTP requests in progress (" + std::to_string(k_max_calls) +
                            "); retry shortly",
                        "rate_limit_error", "", "overloaded"});
      return nullptr;
    }
    auto owned = std::make_unique<call>();
    owned->front = this;
    owned->req = req;
    owned->conn = evhttp_request_get_connection(req);
    owned->created = static_cast<int64_t>(std::time(nullptr));
    return owned;
  }

  // POST /v1/embeddings: one Generate (embedding) per input, answered
  // together (tools/client/openai_embeddings.hpp).
  void embeddings(evhttp_request* req, const in_json& body) {
    auto owned = new_call(req);
    if (!owned) return;
    call& k = *owned;
    if (auto e = openai::parse_embeddings(body, opts.model, k.emb)) return reply_error(req, *e);
    k.embeddings = true;
    k.c.generates = k.emb.generates;
    k.choices.resize(k.c.generates.size());
    launch(std::move(owned));
  }

  // `responses_body`: the Responses request this chat call stands for.
  void completions(evhttp_request* req, const in_json& body, bool chat,
                   const in_json* responses_body = nullptr) {
    auto owned = new_call(req);
    if (!owned) return;
    call& k = *owned;
    if (auto e = openai::parse(body, chat, opts.model, k.c, opts.tools))
      return reply_error(req, *e);
    // echo of a token-id prompt: its text (parse has no tokenizer).
    for (size_t p = 0; k.c.echo && opts.detokenize && p < k.c.echo_text.size(); ++p) {
      const auto& g = k.c.generates[p * size_t(k.c.n)];
      if (g.has_tokens())
        k.c.echo_text[p] =
            opts.detokenize(std::vector<int32_t>(g.tokens().ids().begin(), g.tokens().ids().end()));
    }
    k.choices.resize(k.c.generates.size());
    k.id = random_id(chat ? "chatcmpl-" : "cmpl-");
    if (responses_body) {
      k.responses = true;
      k.resp.id = random_id("resp_");
      k.resp.item_id = random_id("msg_");
      k.resp.model = opts.model;
      k.resp.created = k.created;
      if (auto it = responses_body->find("max_output_tokens");
          it != responses_body->end() && it->is_number_integer())
        k.resp.max_output_tokens = it->get<int64_t>();
    }
    launch(std::move(owned));
  }

  // Sends a parsed call's first Generates (n > 1: each prompt's first
  // sample; advance() sends the rest) and waits for the server.
  void launch(std::unique_ptr<call> owned) {
    call& k = *owned;
    k.timer = evtimer_new(base, on_timer, &k);
    calls.emplace(&k, std::move(owned));
    evhttp_connection_set_closecb(k.conn, on_close, &k);
    // While the call waits for the engine (a long queue: tens of seconds)
    // its connection carries nothing: the call's own timer governs then.
    evhttp_connection_set_timeout(k.conn, k_quiet_timeout_s);
    const size_t n = static_cast<size_t>(k.c.n);
    for (size_t i = 0; i < k.choices.size(); ++i) {
      k.ids.push_back(next_id++);
      by_id[k.ids.back()] = {&k, i};
    }
    k.followers_sent = n == 1;
    if (k.embeddings)
      send_more(k);
    else
      for (size_t i = 0; i < k.choices.size(); i += n) send_generate(k, i);
    arm(k, k_admission_timeout_s);
    if (first_error(k)) advance(k, -1);  // a send refused: answer now
  }

  // --- routes ----------------------------------------------------------

  json model_object() const {
    return {{"id", opts.model},
            {"object", "model"},
            {"created", static_cast<int64_t>(std::time(nullptr))},
            {"owned_by", "troupe"}};
  }

  void route(evhttp_request* req) {
    const auto method = evhttp_request_get_command(req);
    const char* uri = evhttp_request_get_uri(req);
    evhttp_uri* parsed = evhttp_uri_parse(uri);
    const std::string path =
        parsed && evhttp_uri_get_path(parsed) ? evhttp_uri_get_path(parsed) : "";
    if (parsed) evhttp_uri_free(parsed);
    if (path.empty())
      return reply_error(
          req, {400, "the request's URI does not parse", "invalid_request_error", "", ""});
    auto* out = evhttp_request_get_output_headers(req);
    // Two Content-Lengths (libevent reads the first): what follows the body
    // it read could be a request smuggled past a proxy that read the other
    // one (RFC 9112 6.3).  Refused, and the connection closed with it.
    if (header_count(req, "Content-Length") > 1) {
      evhttp_add_header(out, "Connection", "close");
      return reply_error(req, {400, "the request has more than one Content-Length",
                               "invalid_request_error", "", ""});
    }

    // CORS for listed origins, on every answer.
    const std::string origin = header(req, "Origin");
    if (!origin.empty() && openai::origin_allowed(opts.cors_origins, origin)) {
      evhttp_add_header(out, "Access-Control-Allow-Origin", origin.c_str());
      evhttp_add_header(out, "Vary", "Origin");
    }
    if (method == EVHTTP_REQ_OPTIONS) {  // a browser's preflight: no key needed
      evhttp_add_header(out, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
      evhttp_add_header(out, "Access-Control-Allow-Headers", "Authorization, Content-Type");
      evhttp_add_header(out, "Access-Control-Max-Age", "600");
      return evhttp_send_reply(req, 204, "No Content", nullptr);
    }
    // Ahead of everything, without waiting on anyone: 200 only while a
    // request sent now could be served.
    if (path == "/health") {
      const bool draining = opts.draining && opts.draining();
      const bool ok = !draining && serving.load();
      return reply(req, ok ? 200 : 503,
                   text_of(json{{"status", ok         ? "ok"
                                           : draining ? "draining"
                                                      : "no_instance"}}));
    }
    if (!opts.api_keys.empty() && !key_accepted(opts.api_keys, header(req, "Authorization")))
      return reply_error(req, openai::unauthorized());
    if (path == "/metrics" && opts.metrics) {
      std::lock_guard<std::mutex> lock(metrics_mutex);
      if (metrics_text.empty())
        return reply_error(
            req, {503, "the metrics are being gathered; retry shortly", "server_error", "", ""});
      std::string text;
      if (opts.registry) {
        record_front(*opts.registry);
        text = opts.registry->render();
      } else {
        metrics_registry own;
        record_front(own);
        text = metrics_text + own.render();
      }
      return reply(req, 200, text, "text/plain; version=0.0.4; charset=utf-8");
    }

    // HEAD is GET without the body (reply() leaves it out): `curl -I` and
    // load balancers' checks.
    const bool get = method == EVHTTP_REQ_GET || method == EVHTTP_REQ_HEAD;
    const bool post = method == EVHTTP_REQ_POST;
    if (get && path == "/v1/models")
      return reply(req, 200,
                   text_of(json{{"object", "list"}, {"data", json::array({model_object()})}}));
    if (get && path.rfind("/v1/models/", 0) == 0) {
      const std::string id = path.substr(11);
      if (id != opts.model)
        return reply_error(req, {404, "The model " + quoted_value(id) + " does not exist",
                                 "invalid_request_error", "model", "model_not_found"});
      return reply(req, 200, text_of(model_object()));
    }
    const bool known_post = path == "/v1/completions" || path == "/v1/chat/completions" ||
                            path == "/v1/responses" || path == "/v1/embeddings" ||
                            path == "/tokenize" || path == "/detokenize";
    if (known_post && !post)
      return reply_error(req, {405, "use POST for " + path, "invalid_request_error", "", ""});
    if (!known_post)
      return reply_error(req, {404,
                               "unknown route: " +
                                   std::string(method == EVHTTP_REQ_HEAD ? "HEAD "
                                               : get                     ? "GET "
                                                                         : "POST ") +
                                   path,
                               "invalid_request_error", "", "not_found"});

    // A POST without Content-Length or chunked encoding has no body by
    // HTTP's rules (RFC 9112 6.3), whatever its sender meant: say what is
    // missing rather than "not JSON".
    if (header_count(req, "Content-Length") == 0 && header(req, "Transfer-Encoding").empty())
      return reply_error(
          req, {411, "a POST to " + path + " needs a Content-Length (or chunked encoding)",
                "invalid_request_error", "", ""});
    // A POST body: libevent has read it whole, within the body limit
    // (evhttp_set_max_body_size holds for chunked bodies too: 413).
    evbuffer* in = evhttp_request_get_input_buffer(req);
    const size_t len = evbuffer_get_length(in);
    std::string text(len, '\0');
    evbuffer_copyout(in, text.data(), len);
    // Not kept twice for the whole call (its buffer lives with the request).
    evbuffer_drain(in, len);
    // Bounded before parsing: see json_text_nests_deeper.
    if (json_text_nests_deeper(text, openai::k_max_body_depth))
      return reply_error(req, openai::body_too_deep());
    auto body = in_json::parse(text, nullptr, false);
    if (body.is_discarded())
      return reply_error(req,
                         {400, "the request body is not JSON", "invalid_request_error", "", ""});
    if (path == "/v1/completions") return completions(req, body, false);
    if (path == "/v1/chat/completions") return completions(req, body, true);
    if (path == "/v1/responses") return responses(req, body);
    if (path == "/v1/embeddings") return embeddings(req, body);
    if (!body.is_object())
      return reply_error(
          req, {400, "the request body must be a JSON object", "invalid_request_error", "", ""});
    if (path == "/tokenize") {
      // llama-server's shapes: {"content", "add_special", "with_pieces"}
      // -> {"tokens": [ids] or [{"id", "piece"}]}.
      openai::tokenize_request t;
      if (auto e = openai::parse_tokenize(body, t)) return reply_error(req, *e);
      json tokens = json::array();
      for (int32_t id : opts.tokenize(t.content, t.add_special))
        tokens.push_back(t.with_pieces ? json{{"id", id}, {"piece", opts.token_text(id)}}
                                       : json(id));
      return reply(req, 200, text_of(json{{"tokens", tokens}}));
    }
    std::vector<int32_t> ids;  // /detokenize: {"tokens"} -> {"content"}
    if (auto e = openai::parse_detokenize(body, opts.vocab_size, ids)) return reply_error(req, *e);
    reply(req, 200, text_of(json{{"content", opts.detokenize(ids)}}));
  }

  // The front's own gauges (on the loop's thread: the guard is the loop's).
  void record_front(metrics_registry& m) const {
    m.gauge_set("troupe_http_connections", "HTTP connections open", {},
                double(guard->connections()));
    m.gauge_set("troupe_http_unfinished_bytes", "bytes of HTTP requests still being read", {},
                double(guard->unfinished_bytes()));
    m.counter_set("troupe_http_refused_total",
                  "HTTP connections the front ended: past service.http_max_unfinished_bytes "
                  "(503) or service.http_read_timeout_s (408)",
                  {}, double(guard->refused()));
    m.counter_set("troupe_http_idle_closed_total",
                  "idle HTTP connections closed to make room at service.http_max_connections", {},
                  double(guard->idle_closed()));
  }

  static void on_request(evhttp_request* req, void* arg) {
    auto* self = static_cast<impl*>(arg);
    self->guard->request_read(req);
    try {
      self->route(req);
    } catch (const std::exception& e) {
      // A route that throws still answers (and the loop goes on).
      reply_error(req, {500, std::string("internal error: ") + e.what(), "server_error", "", ""});
    }
  }
};

http_front::http_front(http_front_options o) : impl_(std::make_unique<impl>()) {
  auto* p = impl_.get();
  p->opts = std::move(o);
  static const int threads_ready = evthread_use_pthreads();  // for the stop from another thread
  (void)threads_ready;
  p->base = event_base_new();
  p->http = evhttp_new(p->base);
  if (!p->base || !p->http) throw std::runtime_error("service.http_port: libevent did not start");
  evhttp_set_max_body_size(p->http, static_cast<ev_ssize_t>(p->opts.max_body_bytes));
  // 32 KiB: libevent keeps each header line in allocations of its own,
  // about 17 times the line's bytes for short lines, outside the budget of
  // unfinished requests.
  evhttp_set_max_headers_size(p->http, 32 << 10);
  evhttp_set_timeout(p->http, k_io_timeout_s);
  evhttp_set_allowed_methods(
      p->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_OPTIONS);
  evhttp_set_gencb(p->http, impl::on_request, p);
  p->guard = std::make_unique<http_connection_guard>(p->base, p->http, p->opts.limits);
  evhttp_bound_socket* bound = evhttp_bind_socket_with_handle(
      p->http, p->opts.host.c_str(), static_cast<ev_uint16_t>(p->opts.port));
  if (!bound) {
    p->guard.reset();
    evhttp_free(p->http);
    event_base_free(p->base);
    throw std::runtime_error("service.http_port: cannot listen on " + p->opts.host + ":" +
                             std::to_string(p->opts.port) + " (in use?)");
  }
  p->guard->watch(evhttp_bound_socket_get_listener(bound));
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(evhttp_bound_socket_get_fd(bound), reinterpret_cast<sockaddr*>(&ss), &len);
  p->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);

  p->sock.set(zmq::sockopt::linger, 0);
  // No limit on queued messages: a call of 64 prompts x 16 samples sends
  // 1024 Generates at once, and ZeroMQ's default (1000) dropped the rest
  // (dontwait), leaving the call waiting.  The calls in progress bound it.
  p->sock.set(zmq::sockopt::sndhwm, 0);
  p->sock.set(zmq::sockopt::rcvhwm, 0);
  p->sock.connect(p->opts.endpoint);
  p->zmq_event = event_new(
      p->base, p->sock.get(zmq::sockopt::fd), EV_READ | EV_PERSIST,
      [](evutil_socket_t, short, void* arg) { static_cast<impl*>(arg)->drain_zmq(); }, p);
  event_add(p->zmq_event, nullptr);
  // A client that closed its connection while its whole (non-streamed)
  // answer was still being computed: libevent notices a close only when
  // it reads or writes, and nothing is written until the answer, so every
  // second the waiting calls' sockets are peeked.  A closed one is freed,
  // which runs on_close: the call's requests are cancelled.
  static const timeval probe_period{1, 0};
  p->probe_event = event_new(
      p->base, -1, EV_PERSIST,
      [](evutil_socket_t, short, void* arg) {
        auto* self = static_cast<impl*>(arg);
        self->drop_abandoned();
        if (self->opts.registry) self->record_front(*self->opts.registry);
      },
      p);
  event_add(p->probe_event, &probe_period);
  // ZeroMQ's fd signals edges: a periodic drain catches a message that
  // came between a drain and the next edge.
  static const timeval tick{0, 50000};
  event* tick_event = event_new(
      p->base, -1, EV_PERSIST,
      [](evutil_socket_t, short, void* arg) { static_cast<impl*>(arg)->drain_zmq(); }, p);
  event_add(tick_event, &tick);
  p->tick_event = tick_event;

  p->loop = std::thread([p] { event_base_dispatch(p->base); });
  // /health reads a flag and /metrics a text: asking the service's actors
  // takes round trips, which the loop never waits for.  Each has a thread
  // (a slow metrics poll must not hold the health flag back).
  auto every = [p](std::chrono::milliseconds period, auto work) {
    return std::thread([p, period, work] {
      while (!p->stopping.load()) {
        work();
        const auto until = std::chrono::steady_clock::now() + period;
        while (!p->stopping.load() && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  };
  if (p->opts.serving)
    p->health_poll =
        every(std::chrono::milliseconds(250), [p] { p->serving.store(p->opts.serving()); });
  if (p->opts.metrics)
    p->metrics_poll = every(std::chrono::seconds(1), [p] {
      std::string text = p->opts.metrics();
      std::lock_guard<std::mutex> lock(p->metrics_mutex);
      p->metrics_text = std::move(text);
    });
}

http_front::~http_front() {
  auto* p = impl_.get();
  p->stopping.store(true);
  event_base_loopbreak(p->base);
  if (p->loop.joinable()) p->loop.join();
  if (p->health_poll.joinable()) p->health_poll.join();
  if (p->metrics_poll.joinable()) p->metrics_poll.join();
  for (auto& [k, owned] : p->calls)
    if (owned->conn) evhttp_connection_set_closecb(owned->conn, nullptr, nullptr);
  p->calls.clear();
  if (p->zmq_event) event_free(p->zmq_event);
  if (p->tick_event) event_free(p->tick_event);
  if (p->probe_event) event_free(p->probe_event);
  evhttp_free(p->http);
  p->guard.reset();  // after evhttp's frees: it holds the last reference to each buffer
  event_base_free(p->base);
}

int http_front::port() const {
  return impl_->port;
}

}  // namespace troupe::cli
