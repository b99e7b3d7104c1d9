#pragma once
// A KV page as the disk tier stores it: msgpack, with a header that names
// its space, hash, parent and depth, and a checksum over all of it, so a
// file that was cut short, changed on disk or renamed is found out and
// dropped instead of being served.
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/kvstore/kv_page.hpp"

namespace troupe {

std::vector<uint8_t> encode_page_file(const kv_page& p);

// Throws kv_blob_error naming what is wrong: not a page file, another
// format version, a field out of bounds, a checksum that does not match.
kv_page decode_page_file(std::span<const uint8_t> bytes);

}  // namespace troupe
