// The donor's side of KV-head migration (runtime/device/head_group.hpp):
// a layer's attention with a group of its KV heads on another stage.
#include <stdexcept>
#include <string>

#include "runtime/device/llama_forward.hpp"

namespace troupe {

void llama_forward::attend_heads_elsewhere(int kv_lo, int kv_hi, head_call call) {
  const int n_kv = hparams().n_head_kv;
  if (kv_hi == kv_lo) {
    away_lo_ = away_hi_ = 0;
    away_call_ = nullptr;
    return;
  }
  if (kv_lo < 0 || kv_hi < kv_lo || kv_hi > n_kv || kv_hi - kv_lo == n_kv || !call)
    throw std::invalid_argument("KV heads [" + std::to_string(kv_lo) + ", " +
                                std::to_string(kv_hi) + ") of " + std::to_string(n_kv) +
                                " cannot attend elsewhere (a stage keeps one at least)");
  if (hparams().n_expert > 0)
    throw std::invalid_argument("a mixture-of-experts model's heads stay home");
  away_lo_ = kv_lo;
  away_hi_ = kv_hi;
  away_call_ = std::move(call);
  graphs_.clear();
}

void llama_forward::attend_split(int l, int T, int att_rows, bool att_q8, bool swa, float scale) {
  const auto& hp = hparams();
  const int hd = hp.head_dim, per_kv = hp.n_head / hp.n_head_kv;
  const int qlo = away_lo_ * per_kv, qhi = away_hi_ * per_kv, gq = qhi - qlo;
  const int g_n = away_hi_ - away_lo_;
  const size_t uT = static_cast<size_t>(T);
  const size_t groups = static_cast<size_t>((T + att_rows - 1) / att_rows);
  // The group's rows: its queries as projected, its K and V as the cache
  // stored them (so the helper's cache holds the same values).
  head_op op;
  op.kind = head_op::attend;
  op.layer = l;
  op.n_rows = T;
  op.att_rows = att_rows;
  op.quant_out = att_q8 ? 1 : 0;
  op.pos = building_->positions;
  op.row_seq = building_->row_seq;
  op.pt = building_->pt;
  op.pt_off = building_->pt_off;
  const size_t qkv_w = static_cast<size_t>(hp.n_head + 2 * hp.n_head_kv) * hd;
  const size_t q_bytes = static_cast<size_t>(gq) * hd * sizeof(float);
  op.q.resize(uT * gq * hd);
  ctx_.read_rows(qkv_, op.q.data(), q_bytes, uT, static_cast<size_t>(qlo) * hd * sizeof(float),
                 q_bytes, qkv_w * sizeof(float));
  const size_t elem = opts_.kv_f16 ? 2 : 4;
  op.kv.resize(uT * 2 * g_n * hd * elem);
  if (op.kv.size() > kv_rows_bytes_) {
    kv_rows_bytes_ = std::max(op.kv.size(), 2 * kv_rows_bytes_);
    kv_rows_ = ctx_.alloc(kv_rows_bytes_);
  }
  if (!k_kv_copy_.get()) k_kv_copy_ = ctx_.make_kernel("kv_rows_copy");
  k_kv_copy_.args(k_cache_, v_cache_, kv_rows_, pos_, row_seq_, pt_, pt_off_, hp.n_head_kv, hd,
                  opts_.page_size, l, n_pages_, away_lo_, g_n, 1);
  ctx_.launch(k_kv_copy_, {uT, static_cast<size_t>(g_n)});
  ctx_.read(kv_rows_, op.kv.data(), op.kv.size());  // waits for the queue

  // This stage's query heads, before and after the group's, run while
  // the helper runs the group's (flushed: the device starts on them now).
  for (const auto& [h0, h1] : {std::pair{0, qlo}, std::pair{qhi, hp.n_head}}) {
    if (h1 <= h0) continue;
    k_attn_.args(qkv_, k_cache_, v_cache_, att_, pos_, row_seq_, pt_, pt_off_, hp.n_head,
                 hp.n_head_kv, hd, opts_.page_size, l, n_pages_, scale, T, att_rows, qb_.q, qb_.d,
                 qb_.s, att_q8 ? 1 : 0, opts_.flash_attention ? 1 : 0, swa ? hp.sliding_window : 0,
                 h0);
    ctx_.launch(k_attn_, {static_cast<size_t>(h1 - h0), groups}, {1, 1});
  }
  ctx_.marker();  // flushes the queue

  const head_answer a = away_call_(std::move(op));
  const size_t n_out = uT * gq * hd;
  if (a.out.size() != n_out ||
      (att_q8 && (a.oq.size() != n_out || a.od.size() != n_out / 32 || a.os.size() != n_out / 16)))
    throw std::runtime_error("the head group's helper answered " + std::to_string(a.out.size()) +
                             " outputs for " + std::to_string(n_out));
  // Its output into the group's columns of att_ (and of qb_: Wo's
  // quantized input), as the launch of every head would have left them.
  const size_t row = static_cast<size_t>(hp.n_head) * hd;
  const size_t at = static_cast<size_t>(qlo) * hd;
  const size_t n = static_cast<size_t>(gq) * hd;
  ctx_.write_rows(att_, a.out.data(), n * sizeof(float), uT, at * sizeof(float), n * sizeof(float),
                  row * sizeof(float));
  if (att_q8) {
    ctx_.write_rows(qb_.q, a.oq.data(), n, uT, at, n, row);
    ctx_.write_rows(qb_.d, a.od.data(), n / 32 * 4, uT, at / 32 * 4, n / 32 * 4, row / 32 * 4);
    ctx_.write_rows(qb_.s, a.os.data(), n / 32 * 8, uT, at / 32 * 8, n / 32 * 8, row / 32 * 8);
  }
  ctx_.finish();  // the answer is ours only until we return
}

}  // namespace troupe
