#pragma once
// Tensor element types, numbered as GGUF numbers them, with their block
// geometry.  Quantized types store rows as blocks of `block_elems` values.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe {

enum class tensor_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 8,
};

struct type_traits {
  std::string_view name;
  size_t block_elems;  // values per block
  size_t block_bytes;  // bytes per block
};

// Traits of a supported type; nullopt for a GGUF type number troupe cannot run.
std::optional<type_traits> traits_of(uint32_t gguf_type);
const type_traits& traits_of(tensor_type t);

// Bytes of a row of n values (n must be a multiple of the block size).
size_t row_bytes(tensor_type t, int64_t n);

// Name of any GGUF type number, including ones troupe does not run ("Q4_K").
std::string_view gguf_type_name(uint32_t gguf_type);

// IEEE half <-> float, bit-exact with ggml's conversions.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// Dequantize one row of n values (reference path, used by tests and loaders).
void dequantize_row(tensor_type t, const void* src, float* dst, int64_t n);

}  // namespace troupe
