#include "runtime/text/stop_matcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace troupe {

stop_matcher::stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_)
    if (s.empty()) throw std::invalid_argument("stop strings must not be empty");
}

stop_matcher::result stop_matcher::push(std::string_view delta) {
  result res;
  if (stopped_) {
    res.stopped = true;
    res.matched = matched_;
    return res;
  }
  if (stops_.empty()) {
    res.emit.assign(delta);
    return res;
  }
  std::string text = std::move(held_);
  held_.clear();
  text.append(delta);

  // The earliest-ending match, the longest of those ending at the same place.
  // The held-back prefix contains no stop, so any match is a new one.
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const auto& s : stops_) {
    const size_t pos = text.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (best == nullptr || end < best_end || (end == best_end && s.size() > best->size())) {
      best_end = end;
      best = &s;
    }
  }
  if (best != nullptr) {
    stopped_ = true;
    matched_ = *best;
    text.resize(best_end - best->size());
    res.emit = std::move(text);
    res.stopped = true;
    res.matched = matched_;
    return res;
  }

  // Hold back the longest tail that is a proper prefix of some stop string:
  // every later match must start inside it.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (std::string_view(text).substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  held_.assign(text, text.size() - hold, hold);
  text.resize(text.size() - hold);
  res.emit = std::move(text);
  return res;
}

std::string stop_matcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace troupe
