#pragma once
// Short model names ("smollm2-135m-instruct", "stories15m") mapped to files in
// the model cache that `bash tools/setup.sh models` fills.
#include <string>
#include <vector>

namespace troupe {

struct resolved_model {
  std::string model_path, tokenizer_path;  // tokenizer_path empty for GGUF
  std::string name;                        // the known name, or the file's stem
};

// A known name (case-insensitive) or a path to an existing model file.
// Throws model_error saying which names exist and how to fetch them.
resolved_model resolve_model(const std::string& name_or_path);

std::vector<std::string> known_model_names();

// $TROUPE_MODEL_DIR, or $HOME/.cache/troupe/models.
std::string model_dir();

}  // namespace troupe
