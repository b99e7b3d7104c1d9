#pragma once
// A vision encoder as llama.cpp's multimodal projector files ("mmproj"
// GGUF, general.architecture "clip") hold it: a ViT over an image's
// patches and a projector to the language model's input width.  Read
// here, with no device: runtime/device/vision_forward runs it, and
// tests/unit/vision_reference.hpp is its plain C++ reference.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/model/gguf_reader.hpp"

namespace troupe {

// A projector file troupe cannot use, and why.
struct vision_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The MLP activation (clip.use_gelu / clip.use_silu): ggml's tabulated
// GELU, the "quick" GELU x sigmoid(1.702 x), or SiLU.
enum class vision_activation : int { gelu = 0, gelu_quick = 1, silu = 2 };

struct clip_hparams {
  std::string projector;  // clip.projector_type: "mlp" (LLaVA-1.5) is what runs
  int image_size = 0;     // the square side the image is brought to
  int patch_size = 0;
  int n_embd = 0;  // the ViT's width
  int n_ff = 0;
  int n_head = 0;
  int n_layer = 0;  // layers run: up to and including the feature layer
  float eps = 1e-6f;
  float mean[3] = {0, 0, 0}, std[3] = {1, 1, 1};
  vision_activation act = vision_activation::gelu_quick;
  int n_out = 0;  // the projector's output width: the language model's n_embd
  bool class_token = false;

  int patches_per_side() const { return image_size / patch_size; }
  int n_patches() const { return patches_per_side() * patches_per_side(); }
  // Rows of the ViT: the patches, and the class token first where there is one.
  int n_positions() const { return n_patches() + (class_token ? 1 : 0); }
  int head_dim() const { return n_embd / n_head; }
};

// A weight as float, [rows][cols] row-major (GGUF's order: cols contiguous).
struct clip_tensor {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
  bool empty() const { return data.empty(); }
};

struct clip_layer {
  clip_tensor ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
  clip_tensor ln2_w, ln2_b, up_w, up_b, down_w, down_b;
};

// The whole encoder, every weight widened to float at load.
struct clip_model {
  clip_hparams hp;
  std::string path;
  // Patch embedding as a matrix: [n_embd][3 * patch * patch], each row's
  // columns in (channel, y, x) order (the conv kernel's own layout).
  clip_tensor patch_w, patch_b;
  clip_tensor class_embd;                                // [1][n_embd], empty without a class token
  clip_tensor pos_embd;                                  // [n_positions][n_embd]
  clip_tensor pre_ln_w, pre_ln_b, post_ln_w, post_ln_b;  // empty where absent
  std::vector<clip_layer> layers;
  clip_tensor mm0_w, mm0_b, mm2_w, mm2_b;  // the projector (mlp)
};

// Reads an mmproj GGUF.  Throws vision_error (or model_error for a
// damaged file) naming what is missing or unsupported.
std::shared_ptr<const clip_model> load_clip_model(const std::string& path);

}  // namespace troupe
