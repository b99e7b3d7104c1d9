#include "runtime/model/prefill_flops.hpp"

#include "runtime/model/decode_bytes.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

// A weight matrix inside the layers: norms and biases are vectors, and the
// embedding and classifier are outside the layers.
bool layer_matrix(const std::string& name, const tensor_view& t) {
  return name.rfind("blk.", 0) == 0 && t.shape.size() >= 2;
}

}  // namespace

double prefill_flops_per_token(const model_file& m, int prompt_len) {
  if (prompt_len < 1) throw std::invalid_argument("prompt_len must be at least 1");
  const auto& h = m.hparams();
  double flops = 0;
  for (const auto& [name, t] : m.tensors())
    if (layer_matrix(name, t))
      flops += 2.0 * static_cast<double>(t.row_len()) * static_cast<double>(t.rows()) *
               token_share(h, name);
  // Token i (0-based) of the prompt sees i + 1 positions, a windowed layer
  // at most its window: the mean over the prompt, per layer kind.
  auto mean_seen = [prompt_len](int window) {
    double sum = 0;
    for (int i = 0; i < prompt_len; ++i)
      sum += window > 0 ? std::min(i + 1, window) : i + 1;
    return sum / prompt_len;
  };
  const double full = mean_seen(0), windowed = mean_seen(h.sliding_window);
  for (int l = 0; l < h.n_layer; ++l) {
    const bool swa = h.sliding_window > 0 && l < static_cast<int>(h.swa_layers.size()) &&
                     h.swa_layers[static_cast<size_t>(l)];
    // q.k and the sum of v: an FMA per head dimension per position, each.
    flops += 2.0 * 2.0 * h.n_head * h.head_dim * (swa ? windowed : full);
  }
  return flops;
}

bool float_layer_weights(const model_file& m) {
  for (const auto& [name, t] : m.tensors())
    if (layer_matrix(name, t) && t.type != tensor_type::f32 && t.type != tensor_type::f16)
      return false;
  return true;
}

}  // namespace troupe
