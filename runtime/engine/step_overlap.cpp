#include "runtime/engine/step_overlap.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

namespace troupe {

presample_row make_presample_row(int32_t logit_index, const sampling_params& p, int64_t position,
                                 std::span<const int32_t> history) {
  presample_row row{logit_index, p, position};
  if (!sampler::needs_history(p) || position <= 0) return row;
  const int64_t window =
      p.penalty_last_n < 0 ? position : std::min<int64_t>(position, p.penalty_last_n);
  if (window <= 0) return row;
  // The window is [position - window, position); its last token the draw
  // counts itself.
  const int64_t known_end = position - 1;
  if (known_end > static_cast<int64_t>(history.size()))
    throw std::invalid_argument("presample: " + std::to_string(history.size()) +
                                " tokens known for a draw at " + std::to_string(position));
  // window - 1 <= penalty_last_n tokens: penalty_counts takes them all.
  row.counts = sampler::penalty_counts(
      p, history.subspan(static_cast<size_t>(position - window), static_cast<size_t>(window - 1)));
  row.count_input = true;
  return row;
}

std::vector<token_count> count_one_more(std::vector<token_count> counts, int32_t token) {
  auto it = std::lower_bound(counts.begin(), counts.end(), token,
                             [](const token_count& c, int32_t t) { return c.token < t; });
  if (it != counts.end() && it->token == token)
    ++it->count;
  else
    counts.insert(it, {token, 1});
  return counts;
}

std::vector<token_count> draw_counts(const forward_batch& b, const presample_row& p) {
  if (!p.count_input) return p.counts;
  if (p.logit_index < 0 || static_cast<size_t>(p.logit_index) >= b.logit_rows.size())
    throw std::invalid_argument("presample: logit row " + std::to_string(p.logit_index) + " of " +
                                std::to_string(b.logit_rows.size()));
  const int32_t row = b.logit_rows[static_cast<size_t>(p.logit_index)];
  if (row < 0 || static_cast<size_t>(row) >= b.tokens.size() || b.tokens[row] < 0)
    throw std::invalid_argument("presample: the input token of row " + std::to_string(row) +
                                " is not known");
  return count_one_more(p.counts, b.tokens[row]);
}

std::vector<int32_t> presample(const forward_batch& b, const forward_result& r) {
  std::vector<int32_t> drawn;
  drawn.reserve(b.presample.size());
  const size_t n_vocab = static_cast<size_t>(r.n_vocab);
  for (const auto& p : b.presample) {
    if (p.logit_index < 0 || size_t(p.logit_index + 1) * n_vocab > r.logits.size())
      throw std::invalid_argument("presample: logit row " + std::to_string(p.logit_index) + " of " +
                                  std::to_string(r.logits.size() / std::max<size_t>(1, n_vocab)));
    const auto counts = draw_counts(b, p);
    sampling_params quiet = p.sampling;  // the token only: logprobs are the instance's
    quiet.logprobs = false;
    quiet.n_logprobs = 0;
    sampler s(quiet);
    std::span<const float> logits(r.logits.data() + size_t(p.logit_index) * n_vocab, n_vocab);
    try {
      drawn.push_back(s.sample_at(logits, static_cast<size_t>(p.position), counts));
    } catch (const std::invalid_argument&) {
      drawn.push_back(-1);
    }
  }
  return drawn;
}

namespace {

// Checks b's placeholders against the draws (n_drawn) of step last_step.
void check_placeholders(const forward_batch& b, uint64_t last_step, size_t n_drawn) {
  if (b.after == 0 || b.after != last_step)
    throw std::invalid_argument("placeholders: step " + std::to_string(b.step) +
                                " takes the draws of step " + std::to_string(b.after) +
                                ", but the last step run was " +
                                (last_step ? std::to_string(last_step) : "none or failed"));
  for (const auto& p : b.placeholders) {
    if (p.row < 0 || size_t(p.row) >= b.tokens.size())
      throw std::invalid_argument("placeholders: row " + std::to_string(p.row) + " of " +
                                  std::to_string(b.tokens.size()));
    if (p.drawn_index < 0 || size_t(p.drawn_index) >= n_drawn)
      throw std::invalid_argument("placeholders: draw " + std::to_string(p.drawn_index) +
                                  " of step " + std::to_string(last_step) + " does not exist");
  }
}

}  // namespace

void fill_placeholders(forward_batch& b, uint64_t last_step, const std::vector<int32_t>& drawn) {
  if (b.placeholders.empty()) return;
  check_placeholders(b, last_step, drawn.size());
  // A refused draw (NaN logits): the instance fails that sequence on the
  // same logits and drops this row's result; token 0 keeps the row
  // harmless, and the step's other sequences go on.
  for (const auto& p : b.placeholders) b.tokens[p.row] = std::max(drawn[p.drawn_index], 0);
}

void name_device_draws(forward_batch& b, uint64_t last_step, size_t n_drawn) {
  if (b.placeholders.empty()) return;
  check_placeholders(b, last_step, n_drawn);
  // The device takes token 0 for a refused draw, as above.
  for (const auto& p : b.placeholders) b.tokens[p.row] = device_draw_token(p.drawn_index);
}

}  // namespace troupe
