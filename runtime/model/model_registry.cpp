#include "runtime/model/model_registry.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "runtime/model/model_file.hpp"

namespace troupe {

namespace {

namespace fs = std::filesystem;

struct known_model {
  const char* name;
  const char* file;
  const char* tokenizer;  // nullptr: the model file carries its tokenizer
};

constexpr known_model k_models[] = {
    {"smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", nullptr},
    {"stories15m", "stories15M.bin", "tokenizer.bin"},
    // Gemma 3 270M Q4_K_M (`bash tools/setup.sh gemma3`; `test` fetches it).
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf", nullptr},
    // Mixture-of-experts fixtures with seeded random weights, written by
    // tools/make_moe_fixtures.py (`bash tools/setup.sh fixtures`).
    {"moe-4x2-f32", "moe/moe-4x2-f32.gguf", nullptr},
    {"moe-8x2-q", "moe/moe-8x2-q.gguf", nullptr},
    {"moe-8x2-skew", "moe/moe-8x2-skew.gguf", nullptr},
    {"qwen2moe-4x2-shared", "moe/qwen2moe-4x2-shared.gguf", nullptr},
    {"qwen3-dense", "moe/qwen3-dense.gguf", nullptr},    // Qwen 3's layout, same script
    {"qwen3moe-4x2", "moe/qwen3moe-4x2.gguf", nullptr},  // Qwen 3 MoE, SmolLM2's vocabulary
    {"llama3-rope", "moe/llama3-rope.gguf", nullptr},    // Llama 3's RoPE scaling and BPE
    // K-quants, Q5_1 and BF16 in every role (random super-blocks, same script).
    {"kq-dense", "moe/kq-dense.gguf", nullptr},
    {"kq-dense2", "moe/kq-dense2.gguf", nullptr},
    {"kq-moe", "moe/kq-moe.gguf", nullptr},
    // Gemma 3 270M asking for a final logit cap of 30 (Gemma 2's), a copy
    // by tools/make_softcap_fixture.py (`fixtures`, once gemma3 is fetched).
    {"gemma3-softcap30", "fixtures/gemma3-softcap30.gguf", nullptr},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string names_list() {
  std::string s;
  for (const auto& m : k_models) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

std::string fetch_hint() {
  return "`bash tools/setup.sh models` fetches them (`bash tools/setup.sh gemma3` fetches "
         "gemma3-270m, and `bash tools/setup.sh fixtures` writes the moe-* fixtures) into " +
         model_dir();
}

}  // namespace

std::string model_dir() {
  if (const char* d = std::getenv("TROUPE_MODEL_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / ".cache" / "troupe" / "models").string();
}

std::vector<std::string> known_model_names() {
  std::vector<std::string> names;
  for (const auto& m : k_models) names.emplace_back(m.name);
  return names;
}

resolved_model resolve_model(const std::string& name_or_path) {
  const std::string key = lower(name_or_path);
  for (const auto& m : k_models) {
    if (key != m.name) continue;
    resolved_model r;
    r.name = m.name;
    r.model_path = (fs::path(model_dir()) / m.file).string();
    if (m.tokenizer) r.tokenizer_path = (fs::path(model_dir()) / m.tokenizer).string();
    for (const auto* p : {&r.model_path, &r.tokenizer_path}) {
      if (!p->empty() && !fs::is_regular_file(*p))
        throw_model_error(name_or_path, "model '" + r.name + "' needs " + *p +
                                            ", which does not exist; " + fetch_hint());
    }
    return r;
  }

  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) {
    const fs::path p(name_or_path);
    resolved_model r;
    r.model_path = name_or_path;
    r.name = p.stem().string();
    for (const auto& m : k_models)
      if (p.filename() == fs::path(m.file).filename()) r.name = m.name;
    if (lower(p.extension().string()) != ".gguf")
      r.tokenizer_path = (p.parent_path() / "tokenizer.bin").string();
    return r;
  }
  throw_model_error(name_or_path, "no such model file and not a known model name (known: " +
                                      names_list() + "; " + fetch_hint() + ")");
}

}  // namespace troupe
