// Image decoding (runtime/vision/image_decode) and LLaVA's fit to a square
// (runtime/vision/image_preprocess): the input is an image as a client
// sends it in a data URL or Generate.images.  image_error is the
// documented error channel; a decoded image must hold width x height x 3
// bytes, and its fit to a square side x side x 3.  stb_image is compiled
// into this target (stb_image_impl.cpp), instrumented like the rest.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runtime/vision/image_decode.hpp"
#include "runtime/vision/image_preprocess.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto img =
        troupe::decode_image(std::string_view(reinterpret_cast<const char*>(data), size));
    if (img.width <= 0 || img.height <= 0 ||
        img.pixels.size() != static_cast<size_t>(img.width) * img.height * 3)
      std::abort();
    // The resampling on small images only: a fuzz run's time goes to the decoder.
    if (static_cast<size_t>(img.width) * img.height <= (1u << 16)) {
      const uint8_t pad[3] = {122, 116, 104};
      const auto sq = troupe::fit_square(img, 37, pad);
      if (sq.width != 37 || sq.height != 37 || sq.pixels.size() != 37u * 37 * 3) std::abort();
    }
  } catch (const troupe::image_error&) {
  }
  return 0;
}
