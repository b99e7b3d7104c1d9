#pragma once
// Where an image goes in a prompt's text: llama.cpp's default media marker.
// The OpenAI translation writes it for each image part; the server
// (actors/generate_check) puts each image's rows there.
#include <string_view>

namespace troupe {

inline constexpr std::string_view k_media_marker = "<__media__>";

}  // namespace troupe
