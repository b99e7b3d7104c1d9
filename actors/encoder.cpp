#include "actors/encoder.hpp"

#include <spdlog/spdlog.h>

#include "runtime/device/vision_forward.hpp"
#include "runtime/vision/image_decode.hpp"
#include "runtime/vision/image_preprocess.hpp"

namespace troupe {

encoder_actor spawn_encoder(caf::actor_system& sys, std::shared_ptr<const clip_model> model,
                            cl::device_choice where) {
  // Built here, so a device that cannot take it fails the start, not a request.
  auto enc = std::make_shared<vision_forward>(std::move(model), where);
  return sys.spawn<caf::detached>([enc](encoder_actor::pointer) -> encoder_actor::behavior_type {
    return {
        [enc](encode_atom, const std::string& bytes) -> caf::result<prompt_embeds> {
          rgb_image img;
          try {
            img = decode_image(bytes);
          } catch (const image_error& e) {
            return caf::make_error(caf::sec::invalid_argument, e.what());
          }
          try {
            prompt_embeds out;
            out.rows = enc->rows();
            out.data = enc->encode(encoder_input(img, enc->model().hp));
            return out;
          } catch (const std::exception& e) {
            spdlog::error("encoder: {}", e.what());
            return caf::make_error(caf::sec::runtime_error,
                                   std::string("the vision encoder failed: ") + e.what());
          }
        },
    };
  });
}

}  // namespace troupe
