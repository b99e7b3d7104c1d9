// The vision encoder: the mmproj loader, image decoding and preprocessing,
// kernels/vision.cl against the plain C++ reference
// (tests/unit/vision_reference.hpp), and both against the embeddings
// llama.cpp computed for the same fixture and images
// (tests/data/vision_golden.json, tools/record_vision_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/common/base64.hpp"
#include "runtime/device/vision_forward.hpp"
#include "runtime/engine/prompt_embeds.hpp"
#include "runtime/model/model_file.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/vision/clip_model.hpp"
#include "runtime/vision/image_decode.hpp"
#include "runtime/vision/image_preprocess.hpp"
#include "tests/unit/vision_reference.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

std::string data_path(const std::string& name) {
  return std::string(TROUPE_SOURCE_DIR) + "/tests/data/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string fixture_path() {
  return model_dir() + "/vision/llava-fixture-mmproj.gguf";
}

#define NEED_FIXTURE()             \
  if (!fs::exists(fixture_path())) \
  GTEST_SKIP() << fixture_path() << " missing; run `bash tools/setup.sh fixtures`"

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// llama.cpp's embeddings of `image` (its MTMD_DEBUG_EMBEDDINGS dump).
std::vector<float> golden_embeddings(const std::string& image) {
  const auto g = nlohmann::json::parse(read_file(data_path("vision_golden.json")));
  const auto bytes = from_base64(g["images"][image]["embd_f32le_b64"].get<std::string>());
  EXPECT_TRUE(bytes.has_value());
  std::vector<float> out(bytes->size() / sizeof(float));
  std::memcpy(out.data(), bytes->data(), out.size() * sizeof(float));
  return out;
}

TEST(ImageDecode, ReadsThePngFixture) {
  const auto img = decode_image(read_file(data_path("vision_pattern.png")));
  EXPECT_EQ(img.width, 56);
  EXPECT_EQ(img.height, 56);
  ASSERT_EQ(img.pixels.size(), 56u * 56 * 3);
  // tools/make_vision_fixture.py's pattern: a red ramp left to right, a
  // green one top to bottom.
  EXPECT_EQ(img.pixels[0], 0);
  EXPECT_EQ(img.pixels[(55) * 3], 255);
  EXPECT_EQ(img.pixels[(55 * 56) * 3 + 1], 255);
}

TEST(ImageDecode, RefusesWhatIsNotAnImageWithAReason) {
  EXPECT_THROW(decode_image(""), image_error);
  EXPECT_THROW(decode_image("GIF89a......"), image_error);
  EXPECT_THROW(decode_image(std::string("\x89PNG\r\n\x1a\n", 8) + "garbage"), image_error);
  EXPECT_THROW(decode_image(std::string("\xff\xd8\xff\xe0", 4) + std::string(64, '\0')),
               image_error);
  // The fixture's PNG with its header's width and height set: a few KB
  // claiming more pixels than the cap, refused by size before any
  // allocation; the reason is returned.
  auto refusal_of_size = [](uint32_t w, uint32_t h) {
    auto png = read_file(data_path("vision_pattern.png"));
    for (int i = 0; i < 4; ++i) {
      png[16 + i] = static_cast<char>(w >> (24 - 8 * i));
      png[20 + i] = static_cast<char>(h >> (24 - 8 * i));
    }
    try {
      decode_image(png);
    } catch (const image_error& e) {
      return std::string(e.what());
    }
    return std::string("decoded");
  };
  // 100000 wide.
  EXPECT_NE(refusal_of_size(100000, 56).find("100000x56 pixels"), std::string::npos);
  // 20000 x 20000, over stb's own arithmetic: refused by its size too (a
  // hostile probe got "damaged or truncated" here).
  EXPECT_NE(refusal_of_size(20000, 20000).find("20000x20000 pixels"), std::string::npos);
  // A bomb: 8192 x 8192, each side allowed, the whole too many.
  EXPECT_NE(refusal_of_size(8192, 8192).find("at most"), std::string::npos);
  EXPECT_THROW(decode_image(std::string(k_max_image_bytes + 1, 'x')), image_error);
  // The image fuzz target's first finding: a JPEG Huffman table of more
  // than 256 symbols, which Debian's stb_image 2.27 writes past its arrays.
  const auto huffman = from_base64(
      "/9j/////////////////////////////////////////////////////////////////////////xPQQAHBgAAD//"
      "6g=");
  ASSERT_TRUE(huffman.has_value());
  EXPECT_THROW(decode_image(*huffman), image_error);
}

TEST(ImagePreprocess, BicubicResizeKeepsAFlatImageFlatAndFitsTheSquare) {
  rgb_image flat;
  flat.width = 30, flat.height = 10;
  flat.pixels.assign(30 * 10 * 3, 0);
  for (size_t i = 0; i < flat.pixels.size(); ++i) flat.pixels[i] = i % 3 == 0 ? 200 : 17;
  const auto r = resize_bicubic(flat, 7, 13);
  ASSERT_EQ(r.pixels.size(), 7u * 13 * 3);
  for (size_t i = 0; i < r.pixels.size(); ++i)
    EXPECT_NEAR(r.pixels[i], i % 3 == 0 ? 200 : 17, 1) << i;
  // Fitting 30x10 into 12x12: 12x4 centred (rows 4..7), the rest padded.
  const uint8_t pad[3] = {122, 116, 104};
  const auto sq = fit_square(flat, 12, pad);
  ASSERT_EQ(sq.width, 12);
  EXPECT_EQ(sq.pixels[0], 122);
  EXPECT_EQ(sq.pixels[(3 * 12) * 3 + 1], 116);
  EXPECT_NEAR(sq.pixels[(4 * 12) * 3], 200, 1);
  EXPECT_NEAR(sq.pixels[(7 * 12 + 11) * 3 + 2], 17, 1);
  EXPECT_EQ(sq.pixels[(8 * 12) * 3 + 2], 104);
  // Already the size: the very pixels.
  EXPECT_EQ(fit_square(sq, 12, pad).pixels, sq.pixels);
}

TEST(ClipModel, LoadsTheFixtureAsLlamaCppReadsIt) {
  NEED_FIXTURE();
  const auto m = load_clip_model(fixture_path());
  EXPECT_EQ(m->hp.projector, "mlp");
  EXPECT_EQ(m->hp.image_size, 56);
  EXPECT_EQ(m->hp.n_patches(), 16);
  EXPECT_TRUE(m->hp.class_token);
  EXPECT_EQ(m->hp.n_layer, 2);  // of 3 in the file: the last is not run
  EXPECT_EQ(m->hp.act, vision_activation::gelu_quick);
  EXPECT_EQ(m->hp.n_out, 576);
}

TEST(ClipModel, RefusesALanguageModelWithAReason) {
  const auto path = model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing";
  try {
    load_clip_model(path);
    FAIL() << "a language model loaded as a vision encoder";
  } catch (const vision_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multimodal projector"), std::string::npos)
        << e.what();
  }
}

TEST(VisionEncoder, KernelsMatchTheReferenceAndLlamaCpp) {
  NEED_FIXTURE();
  const auto m = load_clip_model(fixture_path());
  vision_forward enc(m, {});
  for (const char* image : {"vision_pattern.png", "vision_pattern_t.png"}) {
    SCOPED_TRACE(image);
    const auto input = encoder_input(decode_image(read_file(data_path(image))), m->hp);
    const auto got = enc.encode(input);
    ASSERT_EQ(got.size(), 16u * 576);
    // Half-table activations move a value by a half's step (about 2.4e-4
    // near 0.5) where float sums in another order round it the other way.
    const auto want = vision_reference::encode(*m, input);
    EXPECT_LT(max_abs_diff(got, want), 5e-4);
    // llama.cpp's own (values up to about 0.6; its float sums differ in order).
    const double llama = max_abs_diff(got, golden_embeddings(image));
    EXPECT_LT(llama, 1e-3);
    RecordProperty(std::string("llama_cpp_max_abs_diff_") + image, std::to_string(llama));
  }
  EXPECT_THROW(enc.encode(std::vector<float>(10)), std::invalid_argument);
}

// Image placeholders keyed by their image (prefix caching of image
// prompts): the same rows give the same ids (wherever they are: the page
// hashes chain the text before them), other rows other ones; the text
// around keeps its tokens.
TEST(PromptEmbeds, ImagePlaceholdersAreKeyedByTheirImage) {
  const std::vector<int32_t> prompt{1, 5, 0, 0, 0, 0, 7, 8};
  auto span = [](int32_t first, float v) {
    return prompt_embeds{first, 4, std::vector<float>(4 * 3, v)};
  };
  const auto a = keyed_tokens(prompt, {span(2, 0.5f)});
  EXPECT_EQ(a, keyed_tokens(prompt, {span(2, 0.5f)}));
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 2), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(std::vector<int32_t>(a.begin() + 6, a.end()), (std::vector<int32_t>{7, 8}));
  for (size_t i = 2; i < 6; ++i) EXPECT_LT(a[i], 0) << i;
  EXPECT_NE(a[2], a[3]) << "each row of an image has an id of its own";
  const auto b = keyed_tokens(prompt, {span(2, 0.25f)});
  for (size_t i = 2; i < 6; ++i) EXPECT_NE(a[i], b[i]) << "another image, position " << i;
  // The same image one position later: its rows keep their ids.
  const auto c = keyed_tokens({1, 5, 9, 0, 0, 0, 0, 8}, {span(3, 0.5f)});
  EXPECT_EQ(std::vector<int32_t>(c.begin() + 3, c.begin() + 7),
            std::vector<int32_t>(a.begin() + 2, a.begin() + 6));
  EXPECT_EQ(keyed_tokens(prompt, {}), prompt);
}

}  // namespace
}  // namespace troupe
