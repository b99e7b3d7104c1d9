#pragma once
// An image brought to the encoder's input as llama.cpp's fixed-size
// preprocessing (LLaVA-1.5's) brings it: scaled to fit the square side
// keeping its aspect (Pillow's bicubic resampling in 8-bit fixed point),
// centred on a grey pad, scaled to [0, 1] and normalised by the encoder's
// mean and std.  The same pixels give the same floats as there.
#include <vector>

#include "runtime/vision/clip_model.hpp"
#include "runtime/vision/image_decode.hpp"

namespace troupe {

// Pillow's separable resampling (bicubic, a = -0.5) of an RGB image to
// width x height: the horizontal pass, then the vertical, each in 22-bit
// fixed point with Pillow's rounding.
rgb_image resize_bicubic(const rgb_image& src, int width, int height);

// `img` scaled to fit side x side (the longer side fills it, the other
// rounded up), centred on `pad` (LLaVA's {122, 116, 104}); an image of
// that size already is kept as it is.
rgb_image fit_square(const rgb_image& img, int side, const uint8_t pad[3]);

// The encoder's input: 3 planes (R, G, B) of side x side floats.
std::vector<float> encoder_input(const rgb_image& img, const clip_hparams& hp);

}  // namespace troupe
