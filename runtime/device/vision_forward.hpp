#pragma once
// The vision encoder (runtime/vision/clip_model) as OpenCL launches
// (kernels/vision.cl) on its own context: one image in, its rows of the
// language model's input out.  No actors here: actors/encoder owns one.
#include <memory>
#include <vector>

#include "runtime/device/cl_runtime.hpp"
#include "runtime/vision/clip_model.hpp"

namespace troupe {

class vision_forward {
 public:
  // Uploads the encoder's weights to the device `where`.  Throws cl_error.
  vision_forward(std::shared_ptr<const clip_model> model, cl::device_choice where);

  // The projected rows of one image given as encoder_input (3 planes of
  // image_size x image_size floats): rows() x width() values.  Throws
  // std::invalid_argument for input of another size.
  std::vector<float> encode(const std::vector<float>& input);

  int rows() const { return model_->hp.n_patches(); }
  int width() const { return model_->hp.n_out; }
  const clip_model& model() const { return *model_; }
  const std::string& device_name() const { return ctx_.device_name(); }

 private:
  struct matrix {
    cl::buffer w, b;
    int rows = 0, cols = 0;
  };
  matrix upload(const clip_tensor& w, const clip_tensor& b);
  cl::buffer upload(const clip_tensor& v);
  void linear(const matrix& m, const cl::buffer& x, const cl::buffer& y, int rows);
  void layer_norm(const cl::buffer& w, const cl::buffer& b, const cl::buffer& x,
                  const cl::buffer& y, int rows);
  void activate(const cl::buffer& x, size_t n, vision_activation act);

  std::shared_ptr<const clip_model> model_;
  cl::context ctx_;
  cl::kernel k_linear_, k_norm_, k_act_, k_add_, k_attn_;
  cl::buffer gelu_tab_, quick_tab_, dummy_;
  matrix patch_, mm0_, mm2_;
  cl::buffer class_, pos_, pre_w_, pre_b_, post_w_, post_b_;
  struct layer {
    cl::buffer ln1_w, ln1_b, ln2_w, ln2_b;
    matrix q, k, v, o, up, down;
  };
  std::vector<layer> layers_;
};

}  // namespace troupe
