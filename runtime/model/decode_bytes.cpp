#include "runtime/model/decode_bytes.hpp"

#include <string>

namespace troupe {

double decode_weight_bytes(const model_file& m) {
  const auto& h = m.hparams();
  const double routed =
      h.n_expert > 0 ? static_cast<double>(h.n_expert_used) / static_cast<double>(h.n_expert) : 1.0;
  double bytes = 0;
  for (const auto& [name, t] : m.tensors()) {
    if (name == "token_embd.weight" && !h.tied_embeddings) continue;
    const bool expert = name.find("_exps.") != std::string::npos;
    bytes += static_cast<double>(t.bytes) * (expert ? routed : 1.0);
  }
  return bytes;
}

}  // namespace troupe
