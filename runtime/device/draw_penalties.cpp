#include "runtime/device/draw_penalties.hpp"

#include "runtime/engine/sampler.hpp"

namespace troupe {

bool penalized_draw(const presample_row& p) {
  return sampler::needs_history(p.sampling) && (p.count_input || !p.counts.empty());
}

void add_penalized_draw(penalty_inputs& in, const presample_row& p, int32_t src, int32_t dst,
                        int32_t input) {
  const auto& s = p.sampling;
  in.src.push_back(src);
  in.dst.push_back(dst);
  in.input.push_back(p.count_input ? input : k_no_input);
  in.par.insert(in.par.end(), {s.repetition_penalty, 1.0f / s.repetition_penalty,
                               s.frequency_penalty, s.presence_penalty});
  // The bias list and the counts, merged by token.
  const auto& lb = s.logit_bias;
  const auto& tc = p.counts;
  size_t i = 0, j = 0;
  while (i < lb.size() || j < tc.size()) {
    const bool take_bias = i < lb.size() && (j == tc.size() || lb[i].token <= tc[j].token);
    const bool take_count = j < tc.size() && (i == lb.size() || tc[j].token <= lb[i].token);
    in.tok.push_back(take_bias ? lb[i].token : tc[j].token);
    in.cnt.push_back(take_count ? tc[j].count : 0);
    in.has_bias.push_back(take_bias ? 1 : 0);
    in.bias.push_back(take_bias ? lb[i].bias : 0.0f);
    i += take_bias;
    j += take_count;
  }
  in.off.push_back(static_cast<int32_t>(in.tok.size()));
}

}  // namespace troupe
