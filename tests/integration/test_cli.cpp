// The troupe command as users run it: JSON contracts, a chat answer from
// SmolLM2, every supported weight type end to end, and bad model files
// refused with one line naming the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "../unit/gguf_fixture.hpp"
#include "net.hpp"
#include "process.hpp"

namespace troupe::testing {
namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/troupe_cli_" + std::to_string(::getpid()) + "_" + name;
}

process_result generate(const std::string& model, const std::string& extra = "") {
  return run_process(troupe_bin() + " generate -m " + shell_quote(model) + " -p 't5 t7' -n 4 " +
                     extra);
}

// One line on stderr that starts with "error:" and contains `what`.
void expect_one_line_error(const process_result& r, const std::string& what) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "crashed: " << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "expected '" << what << "' in: " << r.err;
}

TEST(Cli, GenerateJsonOnStories) {
  auto r = run_process(troupe_bin() + " generate -m stories15m -p 'Once upon a time' -n 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_token_ids"].size(), 5u);
  EXPECT_EQ(j["token_ids"].size(), 8u);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  EXPECT_EQ(j["finish_reason"], "length");
}

// (With the default integer dot products, as with llama.cpp's own q8_1
// activations, this small model answers the bare "What is the capital of
// France?" with "L'Etoile, la ..."; asked for one sentence it says Paris
// either way.)
TEST(Cli, SmolLM2AnswersAChatQuestion) {
  auto r = run_process(troupe_bin() +
                       " generate -m smollm2-135m-instruct --chat 'What is the capital of France? "
                       "Answer in one sentence.' -n 32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["text"].get<std::string>().find("Paris"), std::string::npos) << j["text"];
  EXPECT_EQ(j["finish_reason"], "eos");
}

// --pipeline was renamed --queue-steps (issue 32: the old name would
// collide with pipeline parallelism).  The old name still works, says so on
// stderr (stdout stays pure JSON) and is left out of --help.
TEST(Cli, TheOldNameOfQueueStepsStillWorksAndSaysSo) {
  const std::string run =
      troupe_bin() + " generate -m stories15m -p 'Once upon a time' -n 8 --json";
  auto renamed = run_process(run + " --queue-steps false");
  ASSERT_EQ(renamed.exit_code, 0) << renamed.err;
  EXPECT_EQ(renamed.err.find("deprecated"), std::string::npos) << renamed.err;
  auto old = run_process(run + " --pipeline false");
  ASSERT_EQ(old.exit_code, 0) << old.err;
  EXPECT_NE(old.err.find("--pipeline is deprecated; use --queue-steps"), std::string::npos)
      << old.err;
  EXPECT_EQ(nlohmann::json::parse(old.out)["token_ids"],
            nlohmann::json::parse(renamed.out)["token_ids"]);
  auto help = run_process(troupe_bin() + " generate --help");
  EXPECT_NE(help.out.find("--queue-steps"), std::string::npos);
  // The old flag is hidden (--pipeline-parallel and --pipeline-rebalance
  // are other settings).
  for (size_t at = help.out.find("--pipeline"); at != std::string::npos;
       at = help.out.find("--pipeline", at + 1))
    EXPECT_EQ(help.out.compare(at, 11, "--pipeline-"), 0) << help.out.substr(at, 40);
}

// docs/settings.md holds `troupe settings --markdown`: adding a key to the
// schema without regenerating the document fails here.
TEST(Cli, TheSettingsDocumentIsCurrent) {
  auto r = run_process(troupe_bin() + " settings --markdown");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| `engine.max_seqs` | `--max-seqs` | integer [1, 65536] | 64 | engine | "
                       "live, per-node |"),
            std::string::npos)
      << r.out;
  const std::string doc = slurp(std::string(TROUPE_SOURCE_DIR) + "/docs/settings.md");
  EXPECT_NE(doc.find(r.out), std::string::npos)
      << "docs/settings.md is out of date: regenerate its table with troupe settings --markdown";
  // A bad value in a one-process command names its key and its source.
  auto bad = run_process(troupe_bin() + " generate -m stories15m -p x -n 1 --token-tile 17");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--token-tile (engine.token_tile): must be an integer in [0, 16]"),
            std::string::npos)
      << bad.err;
}

TEST(Cli, PerplexityJson) {
  auto r = run_process(
      troupe_bin() + " perplexity -m stories15m -c 128 --json -f " +
      shell_quote(std::string(TROUPE_SOURCE_DIR) + "/../shared/golden/ppl_stories.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["ppl"].get<double>(), 3.9768, 0.02);
  EXPECT_EQ(j["tokens_scored"], 189);
}

// Every weight type the kernels support runs end to end through the CLI.
TEST(Cli, EveryWeightTypeGenerates) {
  for (auto t : {tensor_type::f32, tensor_type::f16, tensor_type::q4_0, tensor_type::q4_1,
                 tensor_type::q8_0, tensor_type::q5_0, tensor_type::iq4_nl}) {
    tiny_llama_options o;
    o.matrix_type = t;
    o.embd_type = t;
    o.tied = t != tensor_type::q4_1;  // also cover a separate output matrix
    const auto path = temp_path("type.gguf");
    write_file(path, make_tiny_llama(o).bytes());
    auto r = generate(path, "--json");
    EXPECT_EQ(r.exit_code, 0) << traits_of(t).name << ": " << r.err;
    if (r.exit_code == 0) {
      EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].size(), 4u);
    }
    std::remove(path.c_str());
  }
}

TEST(Cli, BadModelFilesGiveOneLineErrors) {
  const auto good = make_tiny_llama().bytes();
  const auto path = temp_path("bad.gguf");
  auto with = [&](std::vector<uint8_t> bytes) {
    write_file(path, bytes);
    return generate(path);
  };
  {
    auto b = good;
    b.resize(b.size() / 2);
    expect_one_line_error(with(b), path);
  }
  {
    auto b = good;
    b.resize(40);
    expect_one_line_error(with(b), path);
  }
  {
    auto b = good;
    b[0] = 'X';
    expect_one_line_error(with(b), "magic");
  }
  {
    auto b = good;
    patch<uint32_t>(b, k_gguf_version_at, 99);
    expect_one_line_error(with(b), "version");
  }
  {
    auto w = make_tiny_llama();
    w.tensors[3].type = 12;  // Q4_K
    expect_one_line_error(with(w.bytes()), "Q4_K");
  }
  {
    auto w = make_tiny_llama();
    w.tensors.back().offset = 1ull << 40;
    expect_one_line_error(with(w.bytes()), w.tensors.back().name);
  }
  {
    auto w = make_tiny_llama();
    std::erase_if(w.kvs, [](const auto& kv) { return kv.key == "llama.embedding_length"; });
    expect_one_line_error(with(w.bytes()), "llama.embedding_length");
  }
  {
    auto w = make_tiny_llama();
    std::erase_if(w.tensors, [](const auto& t) { return t.name == "blk.1.ffn_up.weight"; });
    expect_one_line_error(with(w.bytes()), "blk.1.ffn_up.weight");
  }
  expect_one_line_error(generate("/nonexistent/model.gguf"), "/nonexistent/model.gguf");
  expect_one_line_error(generate("no-such-model-name"), "smollm2-135m-instruct");
  std::remove(path.c_str());
}

TEST(Cli, BadArgumentsAreRefused) {
  auto r = run_process(troupe_bin() + " generate -m stories15m -p hi --temperature -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;
  r = run_process(troupe_bin() + " generate -m stories15m");
  EXPECT_NE(r.exit_code, 0);
  // A budget for requests being read that no largest body fits in.
  r = run_process(troupe_bin() +
                  " serve -m stories15m --listen 'tcp://127.0.0.1:*' --http-port 1 "
                  "--http-max-body-bytes 4096 --http-max-unfinished-bytes 2048");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("service.http_max_unfinished_bytes (2048) is below"), std::string::npos)
      << r.err;
  r = run_process(troupe_bin() + " --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("generate"), std::string::npos);
}

// What a careless-user probe found (forty-third session): a serve that
// could not bind its --listen endpoint hung for good (SIGTERM ignored), a
// port past 65535 bound a random one, stray words after -p became
// prompts, -1 wrapped to an id or seed, /dev/zero was read as a text
// without end, an unknown command was "a subcommand is required".  Each
// now ends at once with one message naming the problem.
TEST(Cli, CarelessArgumentsEndAtOnceWithTheirReason) {
  const std::string t = "timeout 60 " + troupe_bin();
  auto expect = [](const process_result& r, const std::string& what) {
    EXPECT_NE(r.exit_code, 0) << what;
    EXPECT_NE(r.exit_code, 124) << "hung: " << what;
    EXPECT_LT(r.exit_code, 124) << "crashed: " << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << "expected '" << what << "' in: " << r.err;
  };
  // A port another socket holds.
  const held_port held = listen_local();
  ASSERT_GE(held.fd, 0);
  const std::string busy = "tcp://127.0.0.1:" + std::to_string(held.port);
  expect(run_process(t + " serve -m stories15m --local-instances 2 --listen " + busy),
         "Address already in use");
  ::close(held.fd);
  expect(run_process(t + " serve -m stories15m --listen tcp://localhost:5999"),
         "give an IP address");
  expect(run_process(t + " serve -m stories15m --listen tcp://127.0.0.1:99999"),
         "no port in [0, 65535]");
  expect(run_process(t + " generate -m stories15m -p hello world -n 2"), "not expected: world");
  expect(run_process(t + " generate -m stories15m -p hi --seed -1"), "whole number >= 0");
  expect(run_process(t + " client admin cancel -1"), "whole number >= 0");
  expect(run_process(t + " node --grace-s nan"), "finite number");
  expect(run_process(t + " bench engine -m stories15m -p -1"), "--n-prompt");
  expect(run_process(t + " perplexity -m stories15m -f /dev/zero"), "not a regular file");
  expect(run_process(t + " perplexity -m stories15m -f /tmp"), "not a regular file");
  expect(run_process(t + " models list"), "unknown command 'models'");
  const std::string config = temp_path("engine_value.toml");
  {
    std::ofstream out(config);
    out << "engine = 5\n";
  }
  expect(run_process(t + " serve -m stories15m --listen tcp://127.0.0.1:0 --config " + config),
         "'engine' must be a section");
  std::remove(config.c_str());
}

}  // namespace
}  // namespace troupe::testing
