#pragma once
// The request actor: one per client Generate (docs/architecture.md
// §3.1 "Generate").  It turns the client's prompt into tokens (raw text,
// token ids, or chat messages through the model's template), checks that the
// request fits, enqueues the sequence on the instance with itself as the
// token sink, detokenizes incrementally, applies stop strings, and hands the
// gateway wire frames: Accepted, TokenChunks, then Finished (or one Error).
// Cancel and the deadline end it the way a normal finish does: the sequence
// leaves the instance first, then the stream closes.
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "messages/client.pb.h"
#include "messages/encoder.hpp"
#include "messages/gateway.hpp"
#include "messages/monitor.hpp"
#include "messages/router.hpp"
#include "runtime/service/epd_policy.hpp"
#include "runtime/service/metrics.hpp"
#include "runtime/text/tokenizer.hpp"
#include "runtime/vision/encode_ledger.hpp"

namespace troupe {

// What every request of one service shares (read-only).
struct serve_context {
  router_actor router;  // places each request on an instance
  std::shared_ptr<const tokenizer> tok;
  std::string model_name;
  std::string chat_template;  // Jinja source from the model; empty: no chat
  bool add_bos = false;
  // Prefill/decode disaggregation: a decoding sequence asked to move goes
  // where the router places decode work, not prefill work.
  bool pd = false;
  int32_t max_len = 0;               // prompt + generated tokens per sequence
  int32_t page_size = 16;            // the instances' KV page size
  uint64_t prefix_salt = 0;          // fingerprint_salt of the model (page hashes)
  int32_t default_max_tokens = 256;  // when the client gives none (cut to the context)
  int32_t max_queue = 256;           // waiting sequences at most; beyond: "overloaded"
  // Sequence ids are unique across the cluster (several services may share
  // instances): this service's random tag in the top 24 bits, the request
  // actor's id below.  An instance refuses a duplicate id, so even a tag
  // collision yields an error, never two requests mixed.
  uint64_t seq_id_tag = 0;
  std::shared_ptr<metrics_registry> metrics;  // finished requests are counted here (may be null)
  monitor_actor monitor;                      // first tokens and TPOT go here (may be null)
  // Latency targets by class, in ms (0: none); a request may give its own.
  double online_ttft_ms = 0, online_tpot_ms = 0;
  double offline_ttft_ms = 0, offline_tpot_ms = 0;
  // Recovery from KV copies: off, online or always; every this many pages.
  std::string kv_copy = "off";
  int32_t kv_copy_pages = 4;
  // Images: the vision encoder (EPD's E stage; null: images are refused)
  // and the prompt rows each image stands for.
  encoder_actor encoder;
  int32_t image_rows = 0;
  // Hybrid EPD (--epd): an encoder per local instance, by instance id; the
  // router says whose takes a request's images.  Empty: `encoder` serves.
  std::optional<epd_strategy> epd;
  std::map<uint64_t, encoder_actor> encoders;
  // The encoder's books: its queue bound, withdrawals, cache.
  std::shared_ptr<encode_ledger> encode_books;
};

// A ServerMessage as one wire frame (protocol_version set).
std::string encode_frame(wire::ServerMessage& msg);
std::string error_frame(wire::ErrorCode code, const std::string& message, uint64_t request_id,
                        bool has_request_id);

request_actor spawn_request(caf::actor_system& sys, std::shared_ptr<const serve_context> ctx,
                            gateway_actor gateway, std::string client, wire::Generate gen);

}  // namespace troupe
