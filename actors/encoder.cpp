#include "actors/encoder.hpp"

#include <spdlog/spdlog.h>

#include "runtime/device/vision_forward.hpp"
#include "runtime/vision/image_decode.hpp"
#include "runtime/vision/image_preprocess.hpp"

namespace troupe {

encoder_actor spawn_encoder(caf::actor_system& sys, std::shared_ptr<const clip_model> model,
                            cl::device_choice where, std::shared_ptr<encode_ledger> ledger,
                            std::shared_ptr<metrics_registry> metrics) {
  // Without books of its own: no bound, no cache.
  if (!ledger) ledger = std::make_shared<encode_ledger>(1 << 30, 0);
  // Built here, so a device that cannot take it fails the start, not a request.
  auto enc = std::make_shared<vision_forward>(std::move(model), where);
  return sys.spawn<caf::detached>(
      [enc, ledger, metrics](encoder_actor::pointer) -> encoder_actor::behavior_type {
        auto encode = [enc, ledger](uint64_t owner,
                                    const std::string& bytes) -> caf::result<prompt_embeds> {
          if (!ledger->take(owner))
            return caf::make_error(caf::sec::request_timeout, "the request ended before its image");
          prompt_embeds out;
          out.rows = enc->rows();
          if (auto rows = ledger->cached(bytes)) {
            out.data = std::move(*rows);
            return out;
          }
          rgb_image img;
          try {
            img = decode_image(bytes);
          } catch (const image_error& e) {
            return caf::make_error(caf::sec::invalid_argument, e.what());
          }
          try {
            out.data = enc->encode(encoder_input(img, enc->model().hp));
          } catch (const std::exception& e) {
            spdlog::error("encoder: {}", e.what());
            return caf::make_error(caf::sec::runtime_error,
                                   std::string("the vision encoder failed: ") + e.what());
          }
          ledger->remember(bytes, out.data);
          return out;
        };
        return {
            [encode, ledger, metrics](encode_atom, uint64_t owner,
                                      const std::string& bytes) -> caf::result<prompt_embeds> {
              auto r = encode(owner, bytes);
              if (metrics) record_encoder(*metrics, ledger->snapshot());
              return r;
            },
        };
      });
}

void record_encoder(metrics_registry& m, const encode_ledger::stats& s) {
  m.gauge_set("troupe_encoder_waiting", "vision encoder: images admitted and not yet taken", {},
              s.waiting);
  m.gauge_set("troupe_encoder_distinct_waiting",
              "vision encoder: different images among those waiting (engine.encoder_queue bounds "
              "it)",
              {}, s.distinct);
  m.counter_set("troupe_encoder_images_total", "vision encoder: images encoded", {},
                static_cast<double>(s.encoded));
  m.counter_set("troupe_encoder_cache_hits_total",
                "vision encoder: images answered from its cache of recent encodes", {},
                static_cast<double>(s.cache_hits));
  m.counter_set("troupe_encoder_skipped_total",
                "vision encoder: images skipped because their request had ended", {},
                static_cast<double>(s.skipped));
  m.counter_set("troupe_encoder_refused_total",
                "vision encoder: requests refused because its queue was full", {},
                static_cast<double>(s.refused));
  m.gauge_set("troupe_encoder_cache_bytes", "vision encoder: bytes its cache holds", {},
              static_cast<double>(s.cache_bytes));
}

}  // namespace troupe
