#include "runtime/model/llama2c_reader.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

namespace troupe {

namespace {

constexpr const char* k_sp_space = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string byte_piece(int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

// The forms an export may have given byte b: the raw byte, the byte read as
// Latin-1 and written as UTF-8 (the early llama2.c export), or "<0xNN>".
bool is_byte_piece(const std::string& piece, int b) {
  if (piece.size() == 1 && static_cast<uint8_t>(piece[0]) == b) return true;
  if (b >= 0x80 && piece.size() == 2 && static_cast<uint8_t>(piece[0]) == (0xC0 | (b >> 6)) &&
      static_cast<uint8_t>(piece[1]) == (0x80 | (b & 0x3F)))
    return true;
  return piece == byte_piece(b);
}

std::string spaces_to_sp(const std::string& piece) {
  std::string out;
  out.reserve(piece.size());
  for (char ch : piece) {
    if (ch == ' ')
      out += k_sp_space;
    else
      out += ch;
  }
  return out;
}

}  // namespace

llama2c_header llama2c_header::from_bytes(const uint8_t* p) {
  int32_t v[7];
  std::memcpy(v, p, sizeof v);
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
}

std::optional<uint64_t> llama2c_header::expected_file_size() const {
  const bool plausible = dim > 0 && dim <= (1 << 16) && hidden_dim > 0 && hidden_dim <= (1 << 18) &&
                         n_layers > 0 && n_layers <= 1024 && n_heads > 0 && n_heads <= 1024 &&
                         n_kv_heads > 0 && n_kv_heads <= n_heads && n_heads % n_kv_heads == 0 &&
                         dim % n_heads == 0 && (dim / n_heads) % 2 == 0 && vocab_size != 0 &&
                         vocab_size >= -(1 << 22) && vocab_size <= (1 << 22) && seq_len > 0 &&
                         seq_len <= (1 << 20);
  if (!plausible) return std::nullopt;
  const uint64_t d = static_cast<uint64_t>(dim);
  const uint64_t h = static_cast<uint64_t>(hidden_dim);
  const uint64_t l = static_cast<uint64_t>(n_layers);
  const uint64_t v = static_cast<uint64_t>(vocab_size < 0 ? -int64_t{vocab_size} : vocab_size);
  const uint64_t head = d / static_cast<uint64_t>(n_heads);
  const uint64_t kv = head * static_cast<uint64_t>(n_kv_heads);
  uint64_t floats = v * d;                          // token embedding
  floats += l * (d + d * d + 2 * d * kv);           // rms_att, wq, wk, wv
  floats += l * (d * d + d + 3 * d * h);            // wo, rms_ffn, w1, w2, w3
  floats += d;                                      // rms_final
  floats += static_cast<uint64_t>(seq_len) * head;  // freq_cis_real + imag
  if (vocab_size < 0) floats += v * d;              // unshared classifier
  return bytes + 4 * floats;
}

std::string llama2c_header::describe() const {
  return "dim " + std::to_string(dim) + ", hidden " + std::to_string(hidden_dim) + ", " +
         std::to_string(n_layers) + " layers, " + std::to_string(n_heads) + " heads, " +
         std::to_string(n_kv_heads) + " KV heads, vocab " + std::to_string(vocab_size) +
         ", seq_len " + std::to_string(seq_len);
}

std::shared_ptr<llama2c_file> llama2c_file::open(const std::string& path,
                                                 const std::string& tokenizer_path) {
  std::shared_ptr<llama2c_file> f(new llama2c_file());
  f->path_ = path;
  f->format_ = "llama2c";
  f->tokenizer_path_ = tokenizer_path.empty()
                           ? (std::filesystem::path(path).parent_path() / "tokenizer.bin").string()
                           : tokenizer_path;
  f->map_ = std::make_shared<const mapped_file>(path);
  const size_t size = f->map_->size();
  if (size < llama2c_header::bytes)
    throw_model_error(path, "file is truncated: " + std::to_string(size) +
                                " bytes, shorter than a llama2.c header");
  f->header_ = llama2c_header::from_bytes(f->map_->data());
  const auto expected = f->header_.expected_file_size();
  if (!expected)
    throw_model_error(path, "implausible llama2.c header (" + f->header_.describe() + ")");
  if (*expected != size)
    throw_model_error(path, "llama2.c header (" + f->header_.describe() + ") implies " +
                                std::to_string(*expected) + " bytes but the file has " +
                                std::to_string(size));

  const auto& hd = f->header_;
  auto& h = f->hparams_;
  h.arch = "llama";
  h.n_vocab = hd.vocab_size < 0 ? -hd.vocab_size : hd.vocab_size;
  h.n_embd = hd.dim;
  h.n_ff = hd.hidden_dim;
  h.n_layer = hd.n_layers;
  h.n_head = hd.n_heads;
  h.n_head_kv = hd.n_kv_heads;
  h.head_dim = hd.dim / hd.n_heads;
  h.rope_dims = h.head_dim;
  h.n_ctx_train = hd.seq_len;
  h.rope_theta = 10000.0f;
  h.rms_eps = 1e-5f;
  h.rope = rope_layout::normal;
  h.tied_embeddings = hd.vocab_size > 0;

  f->map_tensors();
  f->load_tokenizer();
  f->fingerprint_ = sample_fingerprint(f->map_->data(), size, llama2c_header::bytes);
  return f;
}

void llama2c_file::map_tensors() {
  const auto& h = hparams_;
  const int64_t dim = h.n_embd, hidden = h.n_ff, vocab = h.n_vocab;
  const int64_t kv_dim = int64_t{h.head_dim} * h.n_head_kv;
  const uint8_t* p = map_->data() + llama2c_header::bytes;
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    tensor_view v;
    v.name = name;
    v.type = tensor_type::f32;
    v.shape = std::move(shape);
    v.data = p;
    v.bytes = 4 * static_cast<size_t>(v.row_len() * v.rows());
    p += v.bytes;
    tensors_.emplace(name, std::move(v));
  };
  // Each llama2.c array holds all layers back to back: [L, ...].
  auto per_layer = [&](const char* suffix, std::vector<int64_t> shape) {
    for (int l = 0; l < h.n_layer; ++l) take("blk." + std::to_string(l) + "." + suffix, shape);
  };
  take("token_embd.weight", {dim, vocab});
  per_layer("attn_norm.weight", {dim});
  per_layer("attn_q.weight", {dim, dim});
  per_layer("attn_k.weight", {dim, kv_dim});
  per_layer("attn_v.weight", {dim, kv_dim});
  per_layer("attn_output.weight", {dim, dim});
  per_layer("ffn_norm.weight", {dim});
  per_layer("ffn_gate.weight", {dim, hidden});  // w1
  per_layer("ffn_down.weight", {hidden, dim});  // w2
  per_layer("ffn_up.weight", {dim, hidden});    // w3
  take("output_norm.weight", {dim});
  p += 4 * static_cast<size_t>(header_.seq_len) * static_cast<size_t>(h.head_dim);  // freq_cis
  if (!h.tied_embeddings) take("output.weight", {dim, vocab});
}

void llama2c_file::load_tokenizer() {
  const std::string& tp = tokenizer_path_;
  if (!std::filesystem::exists(tp))
    throw_model_error(path_, "no tokenizer: " + tp +
                                 " does not exist (a llama2.c model needs its tokenizer.bin)");
  const mapped_file tok(tp);
  const uint8_t* data = tok.data();
  const size_t size = tok.size();
  size_t pos = 0;
  auto read_i32 = [&](const std::string& what) {
    if (size - pos < 4) throw_model_error(tp, "tokenizer is truncated: it ends inside " + what);
    int32_t v;
    std::memcpy(&v, data + pos, 4);
    pos += 4;
    return v;
  };
  const int32_t max_len = read_i32("the header");
  if (max_len <= 0 || max_len > (1 << 16))
    throw_model_error(tp, "implausible max token length " + std::to_string(max_len));

  const size_t n = static_cast<size_t>(hparams_.n_vocab);
  auto& v = vocab_;
  v.tokens.resize(n);
  v.scores.resize(n);
  v.kinds.assign(n, token_kind::normal);
  for (size_t i = 0; i < n; ++i) {
    const std::string what = "token " + std::to_string(i);
    const int32_t bits = read_i32("the score of " + what);
    std::memcpy(&v.scores[i], &bits, 4);
    const int32_t len = read_i32("the length of " + what);
    if (len < 0 || static_cast<size_t>(len) > size - pos)
      throw_model_error(tp, what + " has length " + std::to_string(len) +
                                ", which runs past the end of the file");
    v.tokens[i].assign(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
  }
  if (pos != size)
    throw_model_error(tp, "tokenizer has " + std::to_string(size - pos) + " bytes after its " +
                              std::to_string(n) + " tokens (wrong tokenizer for this model?)");

  // Standard SentencePiece form: ids 0/1/2 are <unk>/<s>/</s>, ids 3..258
  // the byte-fallback pieces, and U+2581 stands for a space.
  bool has_bytes = n >= 259;
  for (int b = 0; has_bytes && b < 256; ++b) has_bytes = is_byte_piece(v.tokens[3 + b], b);
  for (size_t i = 0; i < n; ++i) {
    if (i < 3) continue;
    if (has_bytes && i < 259) {
      v.tokens[i] = byte_piece(static_cast<int>(i - 3));
      v.kinds[i] = token_kind::byte;
    } else {
      v.tokens[i] = spaces_to_sp(v.tokens[i]);
    }
  }
  const char* specials[] = {"<unk>", "<s>", "</s>"};
  const token_kind special_kinds[] = {token_kind::unknown, token_kind::control,
                                      token_kind::control};
  for (size_t i = 0; i < 3 && i < n; ++i) {
    v.tokens[i] = specials[i];
    v.kinds[i] = special_kinds[i];
  }
  v.model = "llama";
  v.pre = "default";
  v.unk = 0;
  v.bos = n > 1 ? 1 : -1;
  v.eos = n > 2 ? 2 : -1;
  v.pad = -1;
  v.add_bos = true;
  v.add_space_prefix = true;
}

}  // namespace troupe
