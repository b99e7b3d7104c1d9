#include "runtime/text/token_constraint.hpp"

#include <algorithm>

namespace troupe {

token_constraint::token_constraint(const std::string& regex,
                                   std::shared_ptr<const std::vector<std::string>> token_bytes,
                                   std::vector<int32_t> eog_tokens, size_t mask_budget)
    : dfa_(regex),
      bytes_(std::move(token_bytes)),
      eog_(std::move(eog_tokens)),
      mask_budget_(mask_budget) {}

bool token_constraint::is_end(int32_t token) const {
  return std::find(eog_.begin(), eog_.end(), token) != eog_.end();
}

const std::vector<uint8_t>& token_constraint::allowed(int state) {
  auto it = masks_.find(state);
  if (it != masks_.end()) return it->second;
  // A mask is a byte a token (256 KiB each on a 262k vocabulary) for every
  // state a generation visits: past the budget the cached ones go and are
  // made again as states come back (a few ms each).  No caller holds one
  // across calls.
  if (mask_bytes() + bytes_->size() > mask_budget_) {
    masks_.clear();
    closing_.clear();
  }
  const auto& bytes = *bytes_;
  std::vector<uint8_t> mask(bytes.size(), 0);
  for (size_t t = 0; t < bytes.size(); ++t) {
    if (is_end(int32_t(t))) {
      mask[t] = dfa_.accepting(state) ? 1 : 0;
      continue;
    }
    // A token with no bytes (control tokens) never moves a match on.
    if (bytes[t].empty()) continue;
    mask[t] = dfa_.step(state, bytes[t]) >= 0 ? 1 : 0;
  }
  return masks_.emplace(state, std::move(mask)).first->second;
}

const std::vector<uint8_t>& token_constraint::allowed(int state, int32_t tokens_left) {
  const auto& base = allowed(state);
  // After this token: room for the bytes to the end and the end token.
  const int32_t room = tokens_left - 2;
  if (room >= dfa_.longest_completion()) return base;  // far from the end: nothing to close
  auto [it, made] = closing_.try_emplace(state);
  closing& c = it->second;
  if (made) {
    c.after.assign(base.size(), k_far);
    for (size_t t = 0; t < base.size(); ++t) {
      if (!base[t] || is_end(int32_t(t))) continue;
      const int32_t d = dfa_.bytes_to_end(dfa_.step(state, (*bytes_)[t]));
      c.after[t] = static_cast<uint16_t>(std::min<int32_t>(d, k_far));
      c.most = std::max<int32_t>(c.most, c.after[t]);
    }
  }
  if (room >= c.most) return base;
  if (c.budget == room) return c.mask;
  c.budget = room;
  c.mask.assign(base.size(), 0);
  int32_t nearest = k_far;
  for (size_t t = 0; t < base.size(); ++t)
    if (base[t] && !is_end(int32_t(t))) nearest = std::min<int32_t>(nearest, c.after[t]);
  // Where the output may end now, only what still fits (the end token
  // always does); else, where nothing fits, the tokens nearest the end.
  const int32_t bound = dfa_.accepting(state) ? room : std::max(room, nearest);
  for (size_t t = 0; t < base.size(); ++t)
    c.mask[t] = base[t] && (is_end(int32_t(t)) || c.after[t] <= bound) ? 1 : 0;
  return c.mask;
}

int token_constraint::advance(int state, int32_t token) {
  if (state < 0 || token < 0 || size_t(token) >= bytes_->size()) return -1;
  if (is_end(token)) return dfa_.accepting(state) ? state : -1;
  if ((*bytes_)[size_t(token)].empty()) return -1;
  return dfa_.step(state, (*bytes_)[size_t(token)]);
}

int token_constraint::replay(const std::vector<int32_t>& tokens) {
  int state = start();
  for (int32_t t : tokens) {
    state = advance(state, t);
    if (state < 0) return -1;
  }
  return state;
}

}  // namespace troupe
