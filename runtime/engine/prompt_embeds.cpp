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

}  // namespace troupe
