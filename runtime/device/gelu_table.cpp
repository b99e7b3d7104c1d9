#include "runtime/device/gelu_table.hpp"

#include <cmath>

#include "runtime/model/tensor_type.hpp"

namespace troupe {

std::vector<uint16_t> gelu_half_table() {
  // ggml's GELU_COEF_A and SQRT_2_OVER_PI, in ggml_gelu_f32's order.
  constexpr float coef_a = 0.044715f;
  constexpr float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  std::vector<uint16_t> table(1u << 16);
  for (uint32_t i = 0; i < table.size(); ++i) {
    const float x = half_to_float(static_cast<uint16_t>(i));
    const float y = 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
    table[i] = float_to_half(y);
  }
  return table;
}

std::vector<uint16_t> gelu_quick_half_table() {
  constexpr float coef = -1.702f;  // ggml's GELU_QUICK_COEF
  std::vector<uint16_t> table(1u << 16);
  for (uint32_t i = 0; i < table.size(); ++i) {
    const float x = half_to_float(static_cast<uint16_t>(i));
    table[i] = float_to_half(x * (1.0f / (1.0f + std::exp(coef * x))));
  }
  return table;
}

}  // namespace troupe
