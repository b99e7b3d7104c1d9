#include "runtime/model/decode_bytes.hpp"

#include <string>

namespace troupe {

double token_share(const model_hparams& h, const std::string& name) {
  if (h.n_expert <= 0 || name.find("_exps.") == std::string::npos) return 1.0;
  return static_cast<double>(h.n_expert_used) / static_cast<double>(h.n_expert);
}

double decode_weight_bytes(const model_file& m) {
  const auto& h = m.hparams();
  double bytes = 0;
  for (const auto& [name, t] : m.tensors()) {
    if (name == "token_embd.weight" && !h.tied_embeddings) continue;
    bytes += static_cast<double>(t.bytes) * token_share(h, name);
  }
  return bytes;
}

}  // namespace troupe
