#pragma once
// An error's own words when it carries them (make_error(code, "why")),
// else CAF's rendering: what a client or an operator is told.
#include <caf/all.hpp>
#include <string>

namespace troupe {

inline std::string error_text(caf::actor_system& sys, const caf::error& e) {
  const auto& ctx = e.context();
  if (ctx.size() == 1 && ctx.match_element<std::string>(0)) return ctx.get_as<std::string>(0);
  return sys.render(e);
}

}  // namespace troupe
