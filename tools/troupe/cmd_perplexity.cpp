// troupe perplexity: llama.cpp's perplexity method over a text file.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actors/device.hpp"
#include "runtime/engine/perplexity.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct perplexity_flags {
  engine_settings engine;
  std::string file;
  int ctx = 512;
  bool json = false;
};

int run_perplexity(const perplexity_flags& f) {
  // A device (/dev/zero) would be read without end, a folder as nothing;
  // a pipe (-f <(zcat t.gz), /dev/stdin) ends.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(f.file, ec) && !std::filesystem::is_fifo(f.file, ec))
    throw std::invalid_argument(
        "--file '" + f.file +
        "': " + (std::filesystem::exists(f.file, ec) ? "not a regular file" : "no such file"));
  std::ifstream in(f.file, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read text file '" + f.file + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto model = open_model(f.engine);
  // As llama-perplexity: allowed, said.
  if (const int n_ctx = model->hparams().n_ctx_train; n_ctx > 0 && f.ctx > n_ctx)
    std::fprintf(stderr,
                 "troupe perplexity: warning: --ctx %d is past the model's training context of "
                 "%d tokens; positions past it were never trained\n",
                 f.ctx, n_ctx);
  auto tok = tokenizer::create(model->vocab());
  const bool add_bos = model->vocab().add_bos;
  auto tokens = tok->encode(ss.str(), add_bos, false);

  actor_env env;
  auto opts = device_options(f.engine);
  opts.max_batch_tokens = std::max(opts.max_batch_tokens, f.ctx);
  auto dev = spawn_device(*env.sys, model, opts);
  const auto info = query_info(*env.sys, dev);
  auto res = perplexity(blocking_forward(*env.sys, dev), info.n_pages, info.page_size, tokens,
                        f.ctx, add_bos ? tok->bos() : -1, std::max(f.engine.batch, f.ctx),
                        [&](int done, int total, double ppl) {
                          if (!f.json)
                            std::fprintf(stderr, "[%d/%d] ppl so far %.4f\n", done, total, ppl);
                        });
  if (f.json) {
    nlohmann::json j{{"ppl", res.ppl},
                     {"tokens_scored", res.scored},
                     {"chunks", res.chunks},
                     {"ctx", f.ctx},
                     {"text_tokens", tokens.size()}};
    std::cout << j.dump() << std::endl;
  } else {
    std::printf("PPL = %.4f  (%d chunks of %d, %lld tokens scored)\n", res.ppl, res.chunks, f.ctx,
                static_cast<long long>(res.scored));
  }
  anon_send_exit(dev, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto f = std::make_shared<perplexity_flags>();
  auto* cmd =
      app.add_subcommand("perplexity", "perplexity of a model on a text file (llama.cpp method)");
  add_engine_flags(*cmd, f->engine);
  cmd->add_option("-f,--file", f->file, "text file")->required();
  cmd->add_option("-c,--ctx", f->ctx, "chunk length in tokens")
      ->default_val(512)
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_flag("--json", f->json, "print one JSON object with ppl and the token count scored");
  cmd->callback([f] { run_perplexity(*f); });
}

}  // namespace troupe::cli
