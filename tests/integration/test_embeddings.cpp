// POST /v1/embeddings against llama.cpp (issue 34): troupe's vectors (the
// prompt's final normed hidden states, mean-pooled, L2-normalised) beside
// llama-server's with --embeddings --pooling mean, recorded by
// tools/record_embedding_golden.py in tests/data/embedding_golden.json, on
// a real `troupe serve`.  A prompt over 600 tokens takes several prefill
// chunks; the same prompt again (its pages now in the prefix cache) must
// give the same vector, since an embedding pools every row.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/net.hpp"
#include "tests/integration/server_process.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;
using testing::free_port;
using testing::http_body;
using testing::http_post;
using testing::http_status;
using testing::server_process;

json embedding_golden(const std::string& name) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/tests/data/embedding_golden.json");
  EXPECT_TRUE(in.good()) << "missing tests/data/embedding_golden.json";
  return json::parse(in)["models"][name];
}

struct closeness {
  double cosine = 0, max_diff = 0;
};
closeness compare(const std::vector<float>& a, const std::vector<float>& b) {
  closeness c;
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
    c.max_diff = std::max(c.max_diff, std::fabs(double(a[i]) - b[i]));
  }
  c.cosine = dot / std::sqrt(na * nb);
  return c;
}

std::vector<std::vector<float>> embed(int port, const json& inputs, uint64_t* prompt_tokens) {
  const auto raw = http_post(port, "/v1/embeddings", json{{"input", inputs}}.dump());
  EXPECT_EQ(http_status(raw), 200) << raw.substr(0, 400);
  const auto body = json::parse(http_body(raw));
  std::vector<std::vector<float>> out;
  for (const auto& d : body["data"]) {
    EXPECT_EQ(d["index"].get<size_t>(), out.size());
    out.push_back(d["embedding"].get<std::vector<float>>());
  }
  if (prompt_tokens) *prompt_tokens = body["usage"]["prompt_tokens"].get<uint64_t>();
  return out;
}

// `bound`: the cosine distance allowed from llama.cpp's vector.  troupe is
// not bit-identical to the October 2026 llama.cpp (docs/correctness.md:
// perplexities 0.3-0.5% apart, the same order of float sums summed
// otherwise); measured here: SmolLM2 5.6e-4 on the 10-token prompt (the
// shortest, where one row weighs most), 0.5e-4 to 0.8e-4 on the others;
// Gemma 3 3.1e-3 and below.
void matches_llama_cpp(const std::string& model, double bound) {
  const auto g = embedding_golden(model);
  ASSERT_FALSE(g.is_null()) << model << " is not in tests/data/embedding_golden.json";
  const int http = free_port();
  // Chunks of 128 rows: the long prompt takes six.
  server_process server("--http-port " + std::to_string(http) + " --max-batch-tokens 128",
                        "troupe serve: listening on ", model);
  json inputs = json::array();
  uint64_t want_tokens = 0;
  for (const auto& e : g["embeddings"]) {
    inputs.push_back(e["prompt"]);
    want_tokens += e["prompt_tokens"].get<uint64_t>();
  }
  uint64_t tokens = 0;
  const auto got = embed(http, inputs, &tokens);
  ASSERT_EQ(got.size(), g["embeddings"].size());
  EXPECT_EQ(tokens, want_tokens) << "the prompts' token counts differ from llama.cpp's";
  for (size_t i = 0; i < got.size(); ++i) {
    const auto want = g["embeddings"][i]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(got[i].size(), want.size());
    const auto c = compare(got[i], want);
    std::printf("[embeddings] %s prompt %zu: cosine distance to llama.cpp %.2e, max |diff| %.4f\n",
                model.c_str(), i, 1.0 - c.cosine, c.max_diff);
    EXPECT_GT(c.cosine, 1.0 - bound) << model << " prompt " << i << ": max |diff| " << c.max_diff;
    double norm = 0;
    for (float v : got[i]) norm += double(v) * v;
    EXPECT_NEAR(norm, 1.0, 1e-4);
    // Every other prompt's vector is much further away than llama.cpp's
    // for this one.
    for (size_t j = 0; j < got.size(); ++j) {
      if (j == i) continue;
      const auto other = g["embeddings"][j]["embedding"].get<std::vector<float>>();
      EXPECT_GT(1.0 - compare(got[i], other).cosine, 10 * (1.0 - c.cosine)) << i << " vs " << j;
    }
  }
  // Again, one at a time, with the prompts' pages in the prefix cache now:
  // the same vectors (every row is computed and pooled again).
  for (size_t i = 0; i < got.size(); ++i) {
    const auto again = embed(http, g["embeddings"][i]["prompt"], nullptr);
    ASSERT_EQ(again.size(), 1u);
    EXPECT_GT(compare(again[0], got[i]).cosine, 1.0 - 1e-6) << "prompt " << i;
  }
  // Nothing is left behind: no sequence, no page in use.
  for (const auto& i : server.wait_engine_idle(std::chrono::seconds(10))) {
    EXPECT_EQ(i["running"], 0);
    EXPECT_EQ(i["kv"]["used_pages"], 0);
  }
}

TEST(Embeddings, SmolLM2MatchesLlamaCpp) {
  matches_llama_cpp("smollm2-135m-instruct", 2e-3);
}

TEST(Embeddings, Gemma3MatchesLlamaCpp) {
  matches_llama_cpp("gemma3-270m", 1e-2);
}

TEST(Embeddings, BadInputsAreRefusedByNameAndLargeCallsAnswered) {
  const int http = free_port();
  server_process server("--http-port " + std::to_string(http));
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"input": ""})", "input"},
           {R"({"input": []})", "input"},
           {R"({"input": [[]]})", "input"},
           {R"({"input": [1, "a"]})", "input"},
           {R"({"input": {"a": 1}})", "input"},
           {R"({"input": "x", "encoding_format": "int8"})", "encoding_format"},
           {R"({"input": "x", "dimensions": 64})", "dimensions"},
           {R"({"input": "x", "model": "gpt-4"})", "model"}}) {
    const auto raw = http_post(http, "/v1/embeddings", body);
    const int status = http_status(raw);
    EXPECT_TRUE(status == 400 || status == 404) << body << " -> " << raw.substr(0, 300);
    EXPECT_EQ(json::parse(http_body(raw))["error"]["param"], param) << body;
  }
  // A token id outside the vocabulary is the server's 400, not a crash.
  const auto raw = http_post(http, "/v1/embeddings", R"({"input": [[1, 2, 99999999]]})");
  EXPECT_EQ(http_status(raw), 400) << raw.substr(0, 300);
  // And the server still answers.
  const auto ok = http_post(http, "/v1/embeddings", R"({"input": "Once upon a time"})");
  EXPECT_EQ(http_status(ok), 200) << ok.substr(0, 300);
  // A call of 300 inputs (more than the gateway queues for everyone at
  // once) goes a window at a time and is answered whole, in order.
  json many = json::array();
  for (int i = 0; i < 300; ++i) many.push_back("Story number " + std::to_string(i));
  const auto vectors = embed(http, many, nullptr);
  ASSERT_EQ(vectors.size(), 300u);
  // (Alone its batch differs: the same vector up to the sums' order.)
  EXPECT_GT(compare(vectors[7], embed(http, many[7], nullptr).at(0)).cosine, 1.0 - 1e-6);
  EXPECT_LT(compare(vectors[7], vectors[8]).cosine, 1.0 - 1e-4);
}

// A client that closes its connection while its (non-streamed) embeddings
// call is computed: the front notices within a second and cancels the
// call's requests, those not sent yet included (they once ran on for
// minutes, the window feeding a dead call).
TEST(Embeddings, AClientThatLeavesCancelsItsCall) {
  const int http = free_port();
  server_process server("--http-port " + std::to_string(http));
  json many = json::array();
  std::string words;
  for (int i = 0; i < 20; ++i)
    words += "the little dog ran to the park and ";  // (under 256 tokens)
  for (int i = 0; i < 2048; ++i) many.push_back(words + std::to_string(i));
  const std::string body = json{{"input", many}}.dump();
  const int fd = testing::connect_local(http);
  testing::send_all(fd,
                    "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  // It is being served (not refused up front).
  const auto busy = server.admin("instances");
  int64_t active = 0;
  for (const auto& i : busy) active += i["running"].get<int64_t>() + i["waiting"].get<int64_t>();
  EXPECT_GT(active, 0) << busy.dump();
  ::close(fd);
  // Within a few seconds nothing runs or waits any more.
  const auto idle = server.wait_engine_idle(std::chrono::seconds(8));
  for (const auto& i : idle) {
    EXPECT_EQ(i["running"], 0) << idle.dump();
    EXPECT_EQ(i["waiting"], 0) << idle.dump();
  }
  // And the server serves the next client.
  const auto ok = http_post(http, "/v1/embeddings", R"({"input": "Once upon a time"})");
  EXPECT_EQ(http_status(ok), 200) << ok.substr(0, 300);
}

}  // namespace
}  // namespace troupe
