#include "runtime/engine/kv_blob.hpp"

#include <msgpack.hpp>

#include "runtime/engine/page_pool.hpp"

namespace troupe {

namespace {

constexpr const char* kMagic = "troupe.kv";
// 2: no sampler state (draws derive from seed and position); 3: K
// transposed within a page (kernels/attention.cl).
constexpr int kVersion = 3;

template <class T>
std::string mismatch(const char* field, const T& blob, const T& here) {
  if (blob == here) return {};
  auto text = [](const T& v) {
    if constexpr (std::is_same_v<T, std::string>)
      return "'" + v + "'";
    else
      return std::to_string(v);
  };
  return std::string(field) + ": the blob has " + text(blob) + ", this instance " + text(here);
}

// The header map (throws what msgpack throws for a field of another type).
kv_geometry read_geometry(const msgpack::object& m) {
  if (m.type != msgpack::type::MAP) throw kv_blob_error("KV blob: header is not a map");
  kv_geometry g;
  int seen = 0;
  for (uint32_t i = 0; i < m.via.map.size; ++i) {
    const auto& kv = m.via.map.ptr[i];
    const std::string key = kv.key.as<std::string>();
    if (key == "model_fingerprint")
      g.model_fingerprint = kv.val.as<std::string>(), seen |= 1;
    else if (key == "n_layers")
      g.n_layers = kv.val.as<int32_t>(), seen |= 2;
    else if (key == "n_kv_heads")
      g.n_kv_heads = kv.val.as<int32_t>(), seen |= 4;
    else if (key == "head_dim")
      g.head_dim = kv.val.as<int32_t>(), seen |= 8;
    else if (key == "page_size")
      g.page_size = kv.val.as<int32_t>(), seen |= 16;
    else if (key == "dtype")
      g.dtype = kv.val.as<std::string>(), seen |= 32;
  }
  if (seen != 63) throw kv_blob_error("KV blob: the header lacks a field");
  return g;
}

void check_geometry(const kv_geometry& g) {
  if (g.n_layers <= 0 || g.n_kv_heads <= 0 || g.head_dim <= 0 || g.page_size <= 0 ||
      g.page_bytes() == 0)
    throw kv_blob_error("KV blob: impossible geometry (layers, heads, head_dim, page_size, dtype)");
}

void check_magic_version(const msgpack::object& magic, const msgpack::object& version) {
  if (magic.as<std::string>() != kMagic) throw kv_blob_error("KV blob: not a troupe KV blob");
  if (const int v = version.as<int>(); v != kVersion)
    throw kv_blob_error("KV blob: format version " + std::to_string(v) + ", this build reads " +
                        std::to_string(kVersion));
}

}  // namespace

kv_geometry peek_kv_blob_geometry(std::span<const uint8_t> head) {
  // [magic, version, {header}, ...]: an array of 6 (one byte, fixarray),
  // then three whole objects, read one at a time from the start.
  const size_t n = head.size();
  if (n < 1 || head[0] != 0x96)
    throw kv_blob_error("KV blob: not a troupe KV blob (expected an array of 6)");
  const msgpack::unpack_limit limit(n, n / 2, n, n, n, /*depth=*/2);
  const char* p = reinterpret_cast<const char*>(head.data());
  size_t off = 1;
  try {
    auto magic = msgpack::unpack(p, n, off, nullptr, nullptr, limit);
    auto version = msgpack::unpack(p, n, off, nullptr, nullptr, limit);
    check_magic_version(magic.get(), version.get());
    auto header = msgpack::unpack(p, n, off, nullptr, nullptr, limit);
    auto g = read_geometry(header.get());
    check_geometry(g);
    return g;
  } catch (const kv_blob_error&) {
    throw;
  } catch (const std::exception& e) {
    throw kv_blob_error(std::string("KV blob: its first bytes hold no header (") + e.what() + ")");
  }
}

uint64_t kv_geometry::page_bytes() const {
  const uint64_t elem = dtype == "f32" ? 4 : dtype == "f16" ? 2 : 0;
  return 2 * uint64_t(n_layers) * uint64_t(n_kv_heads) * uint64_t(head_dim) * uint64_t(page_size) *
         elem;
}

uint64_t kv_space_of(const kv_geometry& g) {
  // fingerprint_salt hashes text: the geometry, written out in full.
  return fingerprint_salt(g.model_fingerprint + "|" + std::to_string(g.n_layers) + "|" +
                          std::to_string(g.n_kv_heads) + "|" + std::to_string(g.head_dim) + "|" +
                          std::to_string(g.page_size) + "|" + g.dtype);
}

std::vector<uint8_t> encode_kv_blob(const kv_blob& b) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  // [magic, version, {header}, tokens, n_prompt, pages]
  pk.pack_array(6);
  pk.pack(std::string(kMagic));
  pk.pack(kVersion);
  const auto& g = b.geometry;
  pk.pack_map(6);
  pk.pack(std::string("model_fingerprint")), pk.pack(g.model_fingerprint);
  pk.pack(std::string("n_layers")), pk.pack(g.n_layers);
  pk.pack(std::string("n_kv_heads")), pk.pack(g.n_kv_heads);
  pk.pack(std::string("head_dim")), pk.pack(g.head_dim);
  pk.pack(std::string("page_size")), pk.pack(g.page_size);
  pk.pack(std::string("dtype")), pk.pack(g.dtype);
  pk.pack(b.tokens);
  pk.pack(b.n_prompt);
  pk.pack_bin(static_cast<uint32_t>(b.pages.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(b.pages.data()),
                   static_cast<uint32_t>(b.pages.size()));
  return {reinterpret_cast<const uint8_t*>(buf.data()),
          reinterpret_cast<const uint8_t*>(buf.data()) + buf.size()};
}

kv_blob decode_kv_blob(std::span<const uint8_t> bytes) {
  msgpack::object_handle oh;
  // msgpack allocates an array's or map's objects when it reads the count,
  // before their bytes: bound every count by what the bytes can hold (an
  // element takes at least one byte, a map entry two), or a 6-byte blob
  // claiming 2^32 elements asks for 96 GiB.  A blob nests two levels deep.
  const size_t n = bytes.size();
  const msgpack::unpack_limit limit(/*array=*/n, /*map=*/n / 2, /*str=*/n, /*bin=*/n,
                                    /*ext=*/n, /*depth=*/4);
  try {
    oh = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), nullptr,
                         nullptr, limit);
  } catch (const std::exception& e) {
    throw kv_blob_error(std::string("KV blob: not msgpack (") + e.what() + ")");
  }
  const msgpack::object& o = oh.get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 6)
    throw kv_blob_error("KV blob: not a troupe KV blob (expected an array of 6)");
  const msgpack::object* f = o.via.array.ptr;
  kv_blob b;
  const char* at = "magic";
  try {
    check_magic_version(f[0], f[1]);
    at = "header";
    b.geometry = read_geometry(f[2]);
    at = "tokens";
    b.tokens = f[3].as<std::vector<int32_t>>();
    at = "n_prompt";
    b.n_prompt = f[4].as<int32_t>();
    at = "pages";
    if (f[5].type != msgpack::type::BIN) throw kv_blob_error("KV blob: pages are not binary");
    b.pages.assign(f[5].via.bin.ptr, f[5].via.bin.ptr + f[5].via.bin.size);
  } catch (const kv_blob_error&) {
    throw;
  } catch (const std::exception& e) {
    throw kv_blob_error(std::string("KV blob: bad ") + at + " (" + e.what() + ")");
  }
  const auto& g = b.geometry;
  check_geometry(g);
  if (b.n_prompt < 0 || b.n_prompt > static_cast<int32_t>(b.tokens.size()))
    throw kv_blob_error("KV blob: n_prompt " + std::to_string(b.n_prompt) + " outside the " +
                        std::to_string(b.tokens.size()) + " tokens");
  const uint64_t n_pages = (b.tokens.size() + g.page_size - 1) / g.page_size;
  if (b.pages.size() != n_pages * g.page_bytes())
    throw kv_blob_error("KV blob: " + std::to_string(b.pages.size()) + " bytes of pages for " +
                        std::to_string(b.tokens.size()) + " tokens; the header says " +
                        std::to_string(n_pages) + " pages of " + std::to_string(g.page_bytes()) +
                        " bytes");
  return b;
}

std::string geometry_mismatch(const kv_geometry& blob, const kv_geometry& here) {
  for (auto m : {mismatch("model fingerprint", blob.model_fingerprint, here.model_fingerprint),
                 mismatch("n_layers", blob.n_layers, here.n_layers),
                 mismatch("n_kv_heads", blob.n_kv_heads, here.n_kv_heads),
                 mismatch("head_dim", blob.head_dim, here.head_dim),
                 mismatch("page_size", blob.page_size, here.page_size),
                 mismatch("dtype", blob.dtype, here.dtype)})
    if (!m.empty()) return m;
  return {};
}

}  // namespace troupe
