// llama_forward's device draws (kernels/draw.cl; step overlap,
// runtime/engine/step_overlap.hpp): the token of each presample row drawn
// on the device right after the step's logits, so the next step can be
// enqueued before they reach the host.  Greedy and sampled draws both
// equal the host sampler's, bit for bit (runtime/engine/draw_arith.hpp).
#include <algorithm>
#include <cmath>

#include "runtime/device/llama_forward.hpp"
#include "runtime/engine/draw_arith.hpp"

namespace troupe {

namespace {

// sample_rows' work-group (DRAW_G in draw.cl).
constexpr size_t k_draw_group = 8;
// Logits one penalize_rows item copies (PEN_CHUNK in penalty.cl).
constexpr size_t k_penalty_chunk = 64;
// The most sampled draws one sample_rows launch makes.
constexpr size_t k_sample_groups = 32;

// Whether v (token_bias or token_count) is sorted by token without repeats.
template <class V>
bool sorted_by_token(const V& v) {
  return std::adjacent_find(v.begin(), v.end(), [](const auto& a, const auto& b) {
           return a.token >= b.token;
         }) == v.end();
}

// Grows b to hold `bytes`, doubling.
void fit(cl::context& ctx, cl::buffer& b, size_t bytes) {
  if (b.bytes() < bytes) b = ctx.alloc(std::max<size_t>(bytes, 8) * 2);
}

}  // namespace

bool llama_forward::draws_on_device(const std::vector<presample_row>& rows) {
  return std::all_of(rows.begin(), rows.end(), [](const presample_row& p) {
    // logit_bias included: draw.cl adds it as the sampler does, for a
    // list sorted by token without repeats (check_generate sorts it; the
    // wire's map has no repeats); another list is drawn on the host.
    // Penalty counts too (make_presample_row sorts them).
    return sorted_by_token(p.sampling.logit_bias) && sorted_by_token(p.counts);
  });
}

bool llama_forward::ensure_draws(int n) {
  if (n <= draw_capacity_) return false;
  const int cap = std::max(n, 2 * draw_capacity_);
  auto rows = ctx_.alloc(static_cast<size_t>(cap) * 4);
  auto drawn = ctx_.alloc(static_cast<size_t>(cap) * 4);
  // The next step may read the last step's draws: they move along (in
  // queue order, after that step has written them).
  if (device_draws_ > 0) ctx_.copy(drawn_, drawn, static_cast<size_t>(device_draws_) * 4, 0);
  draw_rows_ = std::move(rows);
  drawn_ = std::move(drawn);
  draw_capacity_ = cap;
  return true;
}

// Whether the device draws row p by sample_rows (argmax_rows makes the
// others: greedy rows, and temperatures too small for their inverse,
// greedy on the host too).
bool sampled_on_device(const presample_row& p) {
  return p.sampling.temperature != 0.0f && std::isfinite(1.0f / p.sampling.temperature);
}

void llama_forward::ensure_draw_inputs(const forward_batch& b) {
  size_t n_bias = 0, n_sampled = 0, n_penalized = 0, n_entries = 0;
  for (const auto& p : b.presample) {
    n_bias += p.sampling.logit_bias.size();
    n_sampled += sampled_on_device(p) ? 1 : 0;
    if (penalized_draw(p)) {
      ++n_penalized;
      n_entries += p.sampling.logit_bias.size() + p.counts.size();
    }
  }
  fit(ctx_, bias_off_, (b.presample.size() + 1) * 4);
  fit(ctx_, greedy_which_, std::max<size_t>(b.presample.size() - n_sampled, 1) * 4);
  fit(ctx_, bias_tok_, std::max<size_t>(n_bias, 1) * 4);
  fit(ctx_, bias_val_, std::max<size_t>(n_bias, 1) * 4);
  if (n_penalized > 0) {
    for (auto* buf : {&pen_src_, &pen_dst_, &pen_input_}) fit(ctx_, *buf, n_penalized * 4);
    fit(ctx_, pen_par_, n_penalized * 16);
    fit(ctx_, pen_off_, (n_penalized + 1) * 4);
    for (auto* buf : {&pen_tok_, &pen_cnt_, &pen_has_, &pen_bias_})
      fit(ctx_, *buf, std::max<size_t>(n_entries, 1) * 4);
  }
  if (n_sampled == 0) return;
  fit(ctx_, sample_which_, n_sampled * 4);
  fit(ctx_, sample_fpar_, n_sampled * 8);
  fit(ctx_, sample_ipar_, n_sampled * 8);
  fit(ctx_, sample_bits_, n_sampled * 8);
  // Scratch for one launch's draws, at most k_sample_groups of them:
  // three vocabulary rows each (Gemma's 3 MiB).
  const size_t groups = std::min(n_sampled, k_sample_groups);
  const size_t row_bytes = 3 * static_cast<size_t>(hparams().n_vocab) * sizeof(float);
  if (sample_scratch_.bytes() < groups * row_bytes) {
    const size_t had = sample_scratch_.bytes() / row_bytes;
    sample_scratch_ = ctx_.alloc(std::min(k_sample_groups, std::max(groups, 2 * had)) * row_bytes);
  }
}

// The penalized draws' rows (kernels/penalty.cl): each a copy of its
// logit row with its logit_bias and penalties applied, written where
// f.draw_rows points it.
void llama_forward::enqueue_penalties(const forward_batch& b, flight& f) {
  auto& in = f.penalties;
  for (size_t k = 0; k < b.presample.size(); ++k) {
    const auto& p = b.presample[k];
    if (!penalized_draw(p)) continue;
    // From its logit row into its own; its input token is its row's.
    const int32_t row = b.logit_rows[static_cast<size_t>(p.logit_index)];
    add_penalized_draw(in, p, p.logit_index, f.draw_rows[k], b.tokens[static_cast<size_t>(row)]);
  }
  const size_t n = in.draws();
  if (n == 0) return;
  const auto& hp = hparams();
  ctx_.write(pen_src_, in.src.data(), n * 4);
  ctx_.write(pen_dst_, in.dst.data(), n * 4);
  ctx_.write(pen_input_, in.input.data(), n * 4);
  ctx_.write(pen_par_, in.par.data(), n * 16);
  ctx_.write(pen_off_, in.off.data(), (n + 1) * 4);
  if (!in.tok.empty()) {
    const size_t e = in.tok.size() * 4;
    ctx_.write(pen_tok_, in.tok.data(), e);
    ctx_.write(pen_cnt_, in.cnt.data(), e);
    ctx_.write(pen_has_, in.has_bias.data(), e);
    ctx_.write(pen_bias_, in.bias.data(), e);
  }
  // drawn_ still holds the step before's draws: this step's are made after.
  k_penalize_.args(logits_, hp.n_vocab, pen_src_, pen_dst_, pen_input_, pen_par_, pen_off_,
                   pen_tok_, pen_cnt_, pen_has_, pen_bias_, drawn_);
  // Work-groups of 64 items (left to the driver, they may be of one item:
  // a launch of hundreds of groups).
  const size_t items = (static_cast<size_t>(hp.n_vocab) + k_penalty_chunk - 1) / k_penalty_chunk;
  ctx_.launch(k_penalize_, {(items + 63) / 64 * 64, n}, {64, 1});
}

void llama_forward::enqueue_draws(const forward_batch& b, flight& f) {
  const auto& hp = hparams();
  const int n_draws = static_cast<int>(b.presample.size());
  ctx_.write(draw_rows_, f.draw_rows.data(), static_cast<size_t>(n_draws) * 4);
  enqueue_penalties(b, f);
  // Each draw's logit_bias (draw.cl): offsets, then (token, bias) pairs;
  // none for a penalized draw (its row has them already).  The buffers
  // were sized by ensure_draw_inputs, before any write.
  f.bias_off.assign(1, 0);
  for (int k = 0; k < n_draws; ++k) {
    if (penalized_draw(b.presample[k])) {
      f.bias_off.push_back(static_cast<int32_t>(f.bias_tok.size()));
      continue;
    }
    for (const auto& tb : b.presample[k].sampling.logit_bias) {
      f.bias_tok.push_back(tb.token);
      f.bias_val.push_back(tb.bias);
    }
    f.bias_off.push_back(static_cast<int32_t>(f.bias_tok.size()));
  }
  ctx_.write(bias_off_, f.bias_off.data(), f.bias_off.size() * 4);
  if (!f.bias_tok.empty()) {
    ctx_.write(bias_tok_, f.bias_tok.data(), f.bias_tok.size() * 4);
    ctx_.write(bias_val_, f.bias_val.data(), f.bias_val.size() * 4);
  }
  // Each draw made by one kernel: argmax_rows the greedy ones, sample_rows
  // the sampled ones (an argmax of a sampled draw would only be
  // overwritten: for Gemma's vocabulary a fifth of a millisecond each).
  for (int k = 0; k < n_draws; ++k) {
    const auto& p = b.presample[k];
    if (!sampled_on_device(p)) {
      f.greedy_which.push_back(k);
      continue;
    }
    f.sample_which.push_back(k);
    f.sample_fpar.push_back(1.0f / p.sampling.temperature);
    f.sample_fpar.push_back(p.sampling.min_p);
    f.sample_ipar.push_back(static_cast<uint32_t>(p.sampling.top_k));
    f.sample_ipar.push_back(draw::top_p_fixed(p.sampling.top_p));
    f.sample_bits.push_back(draw::seeded_bits(p.sampling.seed, static_cast<uint64_t>(p.position)));
  }
  if (!f.greedy_which.empty()) {
    ctx_.write(greedy_which_, f.greedy_which.data(), f.greedy_which.size() * 4);
    k_argmax_.args(logits_, hp.n_vocab, draw_rows_, drawn_, bias_off_, bias_tok_, bias_val_,
                   greedy_which_);
    ctx_.launch(k_argmax_, {f.greedy_which.size()}, {1});
  }
  const size_t n_sampled = f.sample_which.size();
  if (n_sampled == 0) return;
  ctx_.write(sample_which_, f.sample_which.data(), n_sampled * 4);
  ctx_.write(sample_fpar_, f.sample_fpar.data(), n_sampled * 8);
  ctx_.write(sample_ipar_, f.sample_ipar.data(), n_sampled * 8);
  ctx_.write(sample_bits_, f.sample_bits.data(), n_sampled * 8);
  // Launches of as many draws as the scratch holds (the queue runs them in
  // order, so each reuses it).
  const size_t per_launch = std::min(k_sample_groups, n_sampled);
  for (size_t first = 0; first < n_sampled; first += per_launch) {
    const size_t groups = std::min(per_launch, n_sampled - first);
    k_sample_.args(logits_, hp.n_vocab, draw_rows_, drawn_, bias_off_, bias_tok_, bias_val_,
                   sample_which_, sample_fpar_, sample_ipar_, sample_bits_, sample_scratch_,
                   static_cast<int32_t>(first));
    ctx_.launch(k_sample_, {groups * k_draw_group}, {k_draw_group});
  }
}

}  // namespace troupe
