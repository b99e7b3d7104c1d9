#include "runtime/engine/prompt_embeds.hpp"

#include <cmath>

namespace troupe {

std::string check_embeds(const std::vector<prompt_embeds>& spans, int32_t n_prompt,
                         int32_t n_embd) {
  if (spans.empty()) return {};
  if (n_embd <= 0) return "this instance takes no embedding rows (images)";
  int32_t end = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto& e = spans[i];
    const std::string which = "image rows " + std::to_string(i);
    if (e.rows <= 0 || e.first < end || e.first > n_prompt - e.rows)
      return which + " (positions " + std::to_string(e.first) + " + " + std::to_string(e.rows) +
             ") are not inside the prompt of " + std::to_string(n_prompt) +
             " tokens after the span before";
    if (e.data.size() != static_cast<size_t>(e.rows) * static_cast<size_t>(n_embd))
      return which + " hold " + std::to_string(e.data.size()) + " values where " +
             std::to_string(e.rows) + " rows of " + std::to_string(n_embd) + " take " +
             std::to_string(static_cast<size_t>(e.rows) * n_embd);
    for (float v : e.data)
      if (!std::isfinite(v)) return which + " hold a value that is not finite";
    end = e.first + e.rows;
  }
  return {};
}

const float* embedding_at(const std::vector<prompt_embeds>& spans, int32_t pos, int32_t n_embd) {
  for (const auto& e : spans)
    if (pos >= e.first && pos < e.first + e.rows)
      return e.data.data() + static_cast<size_t>(pos - e.first) * static_cast<size_t>(n_embd);
  return nullptr;
}

std::vector<int32_t> keyed_tokens(std::vector<int32_t> tokens,
                                  const std::vector<prompt_embeds>& spans) {
  for (const auto& e : spans) {
    // FNV-1a over the rows' bytes: the image as the model sees it.
    uint64_t h = 0xcbf29ce484222325ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(e.data.data());
    for (size_t i = 0; i < e.data.size() * sizeof(float); ++i)
      h = (h ^ bytes[i]) * 0x100000001b3ull;
    for (int32_t j = 0; j < e.rows; ++j) {
      const size_t at = static_cast<size_t>(e.first + j);
      if (at >= tokens.size()) break;
      // splitmix64 of (hash, row): 31 bits, as an id below zero.
      uint64_t z = h + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(j + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      tokens[at] = -1 - static_cast<int32_t>(z >> 33);
    }
  }
  return tokens;
}

}  // namespace troupe
