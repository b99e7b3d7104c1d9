#pragma once
// KV-head migration (BanaServe's attention-level migration; issue 35): a
// pipeline stage, the donor, hands the attention of a group of its KV heads
// (and of the query heads that read them) to another stage, the helper,
// which holds that group's part of every KV page of the donor's layers.  No
// weights move: the donor still projects Q, K and V, sends each layer's
// rows of the group (its queries, and the K and V its cache stored) and
// takes the group's attention output back before its Wo, so the attention
// work and the group's pages are the helper's.  Same kernels on the same
// values, so the same logits bit for bit.
//
// Here: the messages' contents and the helper's side (head_guest), plain
// data and OpenCL, no actors (actors/device.cpp carries them).
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/device/cl_runtime.hpp"

namespace troupe {

class llama_forward;

// One request of the guest protocol, donor (or pipeline) to helper.
struct head_op {
  enum kind_t : int32_t { open = 0, attend = 1, write = 2, copy = 3, close = 4 };
  int32_t kind = attend;
  // open: the donor's layers [layer_first, layer_first + n_layers) (model
  // layers) and its KV heads [kv_lo, kv_hi).
  int32_t layer_first = 0, n_layers = 0, kv_lo = 0, kv_hi = 0;
  // attend: the donor's layer (its index among the donor's layers), the
  // step's rows, attention rows per work-item, whether the output is
  // wanted quantized too (for an integer Wo), and the step's positions and
  // page tables (as the device writes them: llama_forward's flight).
  int32_t layer = 0, n_rows = 0, att_rows = 1, quant_out = 0;
  std::vector<int32_t> pos, row_seq, pt, pt_off;
  std::vector<float> q;     // rows x the group's query heads x head_dim
  std::vector<uint8_t> kv;  // rows x [K, V] x the group's KV heads x head_dim, cache values
  // write: pages and their group data (head_guest::page_bytes each);
  // copy: pages to dst.
  std::vector<int32_t> pages, dst;
  std::vector<uint8_t> data;
};

// The helper's answer: attend's output for the group's query heads (rows x
// heads x head_dim as float, and quantized as attention.cl writes it where
// asked), or the pages a write or copy covered.
struct head_answer {
  std::vector<float> out;
  std::vector<int8_t> oq;
  std::vector<float> od, os;  // os: two floats a block
  int32_t count = 0;
};

// One KV head's part of one layer's page: page_size x head_dim cache values.
inline size_t kv_head_bytes(int page_size, int head_dim, bool kv_f16) {
  return static_cast<size_t>(page_size) * head_dim * (kv_f16 ? 2 : 4);
}

// The group's part of one page as the helper holds it (and as write
// takes it): for each of the donor's layers, the K of the group's heads,
// then their V, each head page_size x head_dim cache values in the
// cache's own layout.  `page` is a whole page as llama_forward::read_pages
// gives it for the donor's n_layers layers of n_kv heads.
std::vector<uint8_t> group_of_page(const uint8_t* page, int n_layers, int n_kv, int kv_lo,
                                   int kv_hi, size_t head_bytes);
// The same for `n_pages` whole pages in a row (a page read's answer),
// the groups in a row.
std::vector<uint8_t> group_of_pages(const std::vector<uint8_t>& pages, size_t n_pages, int n_layers,
                                    int n_kv, int kv_lo, int kv_hi, size_t head_bytes);
// The reverse: the group's data written into a whole page.
void group_into_page(uint8_t* page, const uint8_t* group, int n_layers, int n_kv, int kv_lo,
                     int kv_hi, size_t head_bytes);

// The helper's side: the group's KV arena (as many pages as the host's)
// and its attention, on the host forward's device but on `ctx`, a context
// and queue of its own (guest_context): a donor's layer then waits for the
// group's attention only, not for the host's own steps queued before it
// (one in-order queue made every layer of the donor wait for a whole step
// of the helper's).
// A context on the host's device with its kernels built as the host's are
// (the same results bit for bit): made once, kept across groups (building
// it takes some 0.5 s).
std::unique_ptr<cl::context> guest_context(const llama_forward& host);

class head_guest {
 public:
  // Throws std::invalid_argument for a group the host's model lacks.
  head_guest(llama_forward& host, cl::context& ctx, const head_op& open);
  head_answer attend(const head_op& op);
  void write_pages(const std::vector<int32_t>& pages, const std::vector<uint8_t>& data);
  void copy_pages(const std::vector<int32_t>& src, const std::vector<int32_t>& dst);
  // One page's part held here (group_of_page's size).
  size_t page_bytes() const;
  size_t bytes() const { return page_bytes() * n_pages_; }

 private:
  // Where the (layer, page) block of the group's cache starts: its heads
  // in order, page_size x head_dim values each.
  size_t block_at(int layer, int32_t page) const;
  llama_forward& host_;
  cl::context& ctx_;
  int layer_first_, n_layers_, kv_lo_, kv_hi_, n_pages_;
  size_t head_bytes_;  // page_size x head_dim cache values
  cl::buffer k_cache_, v_cache_;
  cl::buffer qkv_, kv_rows_, out_, oq_, od_, os_, pos_, row_seq_, pt_, pt_off_;
  size_t qkv_bytes_ = 0, kv_bytes_ = 0, out_bytes_ = 0, table_bytes_ = 0;
  cl::kernel attn_, kv_copy_;
};

}  // namespace troupe
