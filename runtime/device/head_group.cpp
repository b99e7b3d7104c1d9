#include "runtime/device/head_group.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/device/llama_forward.hpp"

namespace troupe {

namespace {

// Copies the group's K and V of each layer between a whole page (n_kv
// heads) and the group's part of it, either way.
template <class Copy>
void each_group_block(int n_layers, int n_kv, int kv_lo, int kv_hi, size_t head_bytes, Copy copy) {
  const size_t g = static_cast<size_t>(kv_hi - kv_lo) * head_bytes;
  const size_t whole = static_cast<size_t>(n_kv) * head_bytes;
  for (int l = 0; l < n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)  // K, then V
      copy((static_cast<size_t>(l) * 2 + kv) * whole + kv_lo * head_bytes,
           (static_cast<size_t>(l) * 2 + kv) * g, g);
}

// Grows `b` to hold `bytes` (doubling), keeping nothing.
void ensure(cl::context& c, cl::buffer& b, size_t& have, size_t bytes) {
  if (bytes <= have) return;
  have = std::max(bytes, 2 * have);
  b = c.alloc(have);
}

}  // namespace

std::vector<uint8_t> group_of_page(const uint8_t* page, int n_layers, int n_kv, int kv_lo,
                                   int kv_hi, size_t head_bytes) {
  std::vector<uint8_t> out(static_cast<size_t>(n_layers) * 2 * (kv_hi - kv_lo) * head_bytes);
  each_group_block(n_layers, n_kv, kv_lo, kv_hi, head_bytes,
                   [&](size_t whole_at, size_t group_at, size_t n) {
                     std::memcpy(out.data() + group_at, page + whole_at, n);
                   });
  return out;
}

std::vector<uint8_t> group_of_pages(const std::vector<uint8_t>& pages, size_t n_pages, int n_layers,
                                    int n_kv, int kv_lo, int kv_hi, size_t head_bytes) {
  std::vector<uint8_t> out;
  if (n_pages == 0) return out;
  const size_t per = pages.size() / n_pages;
  if (per * n_pages != pages.size() || per != static_cast<size_t>(n_layers) * 2 * n_kv * head_bytes)
    throw std::invalid_argument("head group pages: " + std::to_string(pages.size()) +
                                " bytes for " + std::to_string(n_pages) + " pages of " +
                                std::to_string(n_layers) + " layers");
  out.reserve(n_pages * static_cast<size_t>(n_layers) * 2 * (kv_hi - kv_lo) * head_bytes);
  for (size_t i = 0; i < n_pages; ++i) {
    const auto g = group_of_page(pages.data() + i * per, n_layers, n_kv, kv_lo, kv_hi, head_bytes);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

void group_into_page(uint8_t* page, const uint8_t* group, int n_layers, int n_kv, int kv_lo,
                     int kv_hi, size_t head_bytes) {
  each_group_block(n_layers, n_kv, kv_lo, kv_hi, head_bytes,
                   [&](size_t whole_at, size_t group_at, size_t n) {
                     std::memcpy(page + whole_at, group + group_at, n);
                   });
}

std::unique_ptr<cl::context> guest_context(const llama_forward& host) {
  auto c = std::make_unique<cl::context>(host.options().device);
  c->build(host.build_options());
  return c;
}

head_guest::head_guest(llama_forward& host, cl::context& ctx, const head_op& open)
    : host_(host),
      ctx_(ctx),
      layer_first_(open.layer_first),
      n_layers_(open.n_layers),
      kv_lo_(open.kv_lo),
      kv_hi_(open.kv_hi),
      n_pages_(host.n_pages()) {
  const auto& hp = host.hparams();
  if (n_layers_ < 1 || layer_first_ < 0 || layer_first_ + n_layers_ > hp.n_layer)
    throw std::invalid_argument("a head group of layers [" + std::to_string(layer_first_) + ", " +
                                std::to_string(layer_first_ + n_layers_) + ") in a model of " +
                                std::to_string(hp.n_layer));
  if (kv_lo_ < 0 || kv_hi_ <= kv_lo_ || kv_hi_ > hp.n_head_kv)
    throw std::invalid_argument("a head group of KV heads [" + std::to_string(kv_lo_) + ", " +
                                std::to_string(kv_hi_) + ") in a model of " +
                                std::to_string(hp.n_head_kv));
  head_bytes_ = kv_head_bytes(host.page_size(), hp.head_dim, host.options().kv_f16);
  auto& c = ctx_;
  // Every page of the donor's layers, used or not: refused here, not in a
  // later step, where the device cannot hold it beside what it has.
  if (bytes() > c.global_mem_bytes() / 2)
    throw std::invalid_argument("the head group's pages take " + std::to_string(bytes() >> 20) +
                                " MiB, more than half the helper's device memory");
  const size_t cache = bytes() / 2;
  k_cache_ = c.alloc(cache);
  v_cache_ = c.alloc(cache);
  attn_ = c.make_kernel("attention");
  kv_copy_ = c.make_kernel("kv_rows_copy");
}

size_t head_guest::block_at(int layer, int32_t page) const {
  return (static_cast<size_t>(layer) * n_pages_ + page) * (kv_hi_ - kv_lo_) * head_bytes_;
}

size_t head_guest::page_bytes() const {
  return static_cast<size_t>(n_layers_) * 2 * (kv_hi_ - kv_lo_) * head_bytes_;
}

head_answer head_guest::attend(const head_op& op) {
  const auto& hp = host_.hparams();
  const int g_n = kv_hi_ - kv_lo_, hd = hp.head_dim;
  const int per_kv = hp.n_head / hp.n_head_kv;
  const int gq = g_n * per_kv;  // the group's query heads
  const int T = op.n_rows;
  const size_t uT = static_cast<size_t>(T);
  if (op.layer < 0 || op.layer >= n_layers_ || T < 1 || op.att_rows < 1 || op.att_rows > 64 ||
      op.q.size() != uT * gq * hd ||
      op.kv.size() != uT * 2 * g_n * head_bytes_ / host_.page_size() || op.pos.size() != uT ||
      op.row_seq.size() != uT || op.pt_off.empty())
    throw std::invalid_argument("attend: a malformed head group step");
  // Every index the kernels follow stays inside its buffer.
  const auto pt_size = static_cast<int32_t>(op.pt.size());
  for (int32_t o : op.pt_off)
    if (o < 0 || o > pt_size) throw std::invalid_argument("attend: a page table outside its list");
  for (int32_t p : op.pt)
    if (p < 0 || p >= n_pages_) throw std::invalid_argument("attend: a page outside the arena");
  for (size_t t = 0; t < uT; ++t) {
    const int32_t s = op.row_seq[t];
    if (s < 0 || static_cast<size_t>(s) >= op.pt_off.size() || op.pos[t] < 0 ||
        op.pt_off[s] + op.pos[t] / host_.page_size() >= pt_size)
      throw std::invalid_argument("attend: row " + std::to_string(t) +
                                  " names no page of its sequence");
  }
  auto& c = ctx_;
  // The attention kernel reads queries as rows of a QKV projection: the
  // group's query heads, then room for its K and V (unread: they come
  // from the cache).
  const size_t stride = static_cast<size_t>(gq + 2 * g_n) * hd;
  ensure(c, qkv_, qkv_bytes_, uT * stride * sizeof(float));
  ensure(c, kv_rows_, kv_bytes_, op.kv.size());
  const size_t n_out = uT * gq * hd;
  if (n_out * sizeof(float) > out_bytes_) {
    out_bytes_ = std::max(n_out * sizeof(float), 2 * out_bytes_);
    out_ = c.alloc(out_bytes_);
    oq_ = c.alloc(out_bytes_ / 4);
    od_ = c.alloc(out_bytes_ / 32);
    os_ = c.alloc(out_bytes_ / 16);
  }
  const size_t tables = std::max({op.pos.size(), op.pt.size(), op.pt_off.size()}) * 4;
  if (tables > table_bytes_) {
    table_bytes_ = std::max(tables, 2 * table_bytes_);
    for (cl::buffer* b : {&pos_, &row_seq_, &pt_, &pt_off_}) *b = c.alloc(table_bytes_);
  }
  c.write_rows(qkv_, op.q.data(), static_cast<size_t>(gq) * hd * sizeof(float), uT, 0,
               static_cast<size_t>(gq) * hd * sizeof(float), stride * sizeof(float));
  c.write(kv_rows_, op.kv.data(), op.kv.size());
  c.write(pos_, op.pos.data(), op.pos.size() * 4);
  c.write(row_seq_, op.row_seq.data(), op.row_seq.size() * 4);
  c.write(pt_, op.pt.data(), op.pt.size() * 4);
  c.write(pt_off_, op.pt_off.data(), op.pt_off.size() * 4);
  // The rows' K and V into the group's cache, then attention over it.
  kv_copy_.args(k_cache_, v_cache_, kv_rows_, pos_, row_seq_, pt_, pt_off_, g_n, hd,
                host_.page_size(), op.layer, n_pages_, 0, g_n, 0);
  c.launch(kv_copy_, {uT, static_cast<size_t>(g_n)});
  const float scale = hp.attention_scale();
  const bool swa = hp.is_swa(layer_first_ + op.layer);
  attn_.args(qkv_, k_cache_, v_cache_, out_, pos_, row_seq_, pt_, pt_off_, gq, g_n, hd,
             host_.page_size(), op.layer, n_pages_, scale, T, op.att_rows, oq_, od_, os_,
             op.quant_out, host_.options().flash_attention ? 1 : 0, swa ? hp.sliding_window : 0, 0);
  // One work-item per work-group, as the donor launches it.
  c.launch(attn_,
           {static_cast<size_t>(gq), static_cast<size_t>((T + op.att_rows - 1) / op.att_rows)},
           {1, 1});
  head_answer a;
  a.out.resize(n_out);
  c.read(out_, a.out.data(), n_out * sizeof(float));
  if (op.quant_out) {
    a.oq.resize(n_out);
    a.od.resize(n_out / 32);
    a.os.resize(n_out / 16);
    c.read(oq_, a.oq.data(), n_out);
    c.read(od_, a.od.data(), n_out / 32 * sizeof(float));
    c.read(os_, a.os.data(), n_out / 16 * sizeof(float));
  }
  a.count = T;
  return a;
}

void head_guest::write_pages(const std::vector<int32_t>& pages, const std::vector<uint8_t>& data) {
  const size_t per = page_bytes();
  if (data.size() != pages.size() * per)
    throw std::invalid_argument("head group pages: " + std::to_string(data.size()) + " bytes for " +
                                std::to_string(pages.size()) + " pages of " + std::to_string(per));
  for (int32_t p : pages)
    if (p < 0 || p >= n_pages_)
      throw std::invalid_argument("head group pages: page " + std::to_string(p) + " of " +
                                  std::to_string(n_pages_));
  auto& c = ctx_;
  const size_t g = static_cast<size_t>(kv_hi_ - kv_lo_) * head_bytes_;
  for (size_t i = 0; i < pages.size(); ++i)
    for (int l = 0; l < n_layers_; ++l) {
      const uint8_t* src = data.data() + i * per + static_cast<size_t>(l) * 2 * g;
      c.write(k_cache_, src, g, block_at(l, pages[i]));
      c.write(v_cache_, src + g, g, block_at(l, pages[i]));
    }
  c.finish();
}

void head_guest::copy_pages(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (src.size() != dst.size())
    throw std::invalid_argument("head group copy: " + std::to_string(src.size()) + " pages to " +
                                std::to_string(dst.size()));
  for (const auto* v : {&src, &dst})
    for (int32_t p : *v)
      if (p < 0 || p >= n_pages_)
        throw std::invalid_argument("head group copy: page " + std::to_string(p) + " of " +
                                    std::to_string(n_pages_));
  std::vector<uint8_t> data(src.size() * page_bytes());
  auto& c = ctx_;
  const size_t g = static_cast<size_t>(kv_hi_ - kv_lo_) * head_bytes_;
  for (size_t i = 0; i < src.size(); ++i)
    for (int l = 0; l < n_layers_; ++l) {
      uint8_t* to = data.data() + i * page_bytes() + static_cast<size_t>(l) * 2 * g;
      c.read(k_cache_, to, g, block_at(l, src[i]));
      c.read(v_cache_, to + g, g, block_at(l, src[i]));
    }
  write_pages(dst, data);
}

}  // namespace troupe
