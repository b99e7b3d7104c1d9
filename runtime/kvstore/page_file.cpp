#include "runtime/kvstore/page_file.hpp"

#include <msgpack.hpp>

#include <string>

namespace troupe {

namespace {

constexpr const char* kMagic = "troupe.kvpage";
constexpr int kVersion = 1;
// A page is page_size tokens of every layer's K and V: bounded well above
// any geometry troupe runs, so a damaged count cannot ask for the moon.
constexpr size_t kMaxTokens = 1 << 16;

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t checksum(const kv_page& p) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : {p.space, p.hash, p.parent, uint64_t(uint32_t(p.depth))})
    h = fnv(h, &v, sizeof v);
  h = fnv(h, p.tokens.data(), p.tokens.size() * sizeof(int32_t));
  return fnv(h, p.bytes.data(), p.bytes.size());
}

}  // namespace

std::vector<uint8_t> encode_page_file(const kv_page& p) {
  msgpack::sbuffer buf(p.bytes.size() + p.tokens.size() * 5 + 128);
  msgpack::packer<msgpack::sbuffer> pk(buf);
  // [magic, version, space, hash, parent, depth, tokens, bytes, checksum]
  pk.pack_array(9);
  pk.pack(std::string(kMagic));
  pk.pack(kVersion);
  pk.pack(p.space);
  pk.pack(p.hash);
  pk.pack(p.parent);
  pk.pack(p.depth);
  pk.pack(p.tokens);
  pk.pack_bin(static_cast<uint32_t>(p.bytes.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(p.bytes.data()),
                   static_cast<uint32_t>(p.bytes.size()));
  pk.pack(checksum(p));
  return {reinterpret_cast<const uint8_t*>(buf.data()),
          reinterpret_cast<const uint8_t*>(buf.data()) + buf.size()};
}

kv_page decode_page_file(std::span<const uint8_t> bytes) {
  // Every count bounded by what the bytes can hold (as decode_kv_blob).
  const size_t n = bytes.size();
  const msgpack::unpack_limit limit(/*array=*/std::min(n, kMaxTokens), /*map=*/0, /*str=*/64,
                                    /*bin=*/n, /*ext=*/0, /*depth=*/2);
  msgpack::object_handle oh;
  try {
    oh = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), n, nullptr, nullptr, limit);
  } catch (const std::exception& e) {
    throw kv_blob_error(std::string("KV page file: not msgpack (") + e.what() + ")");
  }
  const msgpack::object& o = oh.get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 9)
    throw kv_blob_error("KV page file: not a troupe page file (expected an array of 9)");
  const msgpack::object* f = o.via.array.ptr;
  kv_page p;
  uint64_t sum = 0;
  const char* at = "magic";
  try {
    if (f[0].as<std::string>() != kMagic) throw kv_blob_error("KV page file: wrong magic");
    at = "version";
    if (const int v = f[1].as<int>(); v != kVersion)
      throw kv_blob_error("KV page file: format version " + std::to_string(v) +
                          ", this build reads " + std::to_string(kVersion));
    at = "space";
    p.space = f[2].as<uint64_t>();
    at = "hash";
    p.hash = f[3].as<uint64_t>();
    at = "parent";
    p.parent = f[4].as<uint64_t>();
    at = "depth";
    p.depth = f[5].as<int32_t>();
    at = "tokens";
    p.tokens = f[6].as<std::vector<int32_t>>();
    at = "bytes";
    if (f[7].type != msgpack::type::BIN) throw kv_blob_error("KV page file: bytes not binary");
    p.bytes.assign(f[7].via.bin.ptr, f[7].via.bin.ptr + f[7].via.bin.size);
    at = "checksum";
    sum = f[8].as<uint64_t>();
  } catch (const kv_blob_error&) {
    throw;
  } catch (const std::exception& e) {
    throw kv_blob_error(std::string("KV page file: bad ") + at + " (" + e.what() + ")");
  }
  if (p.depth < 0 || p.tokens.empty() || p.tokens.size() > kMaxTokens || p.bytes.empty())
    throw kv_blob_error("KV page file: impossible depth, token count or size");
  if (sum != checksum(p)) throw kv_blob_error("KV page file: checksum mismatch");
  return p;
}

}  // namespace troupe
