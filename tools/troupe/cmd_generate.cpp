// troupe generate: a prompt (raw or chat) through the device actor,
// streamed to stdout or printed as one JSON object.  Several --prompt run
// one after another on one loaded model (a JSON line, or an answer line,
// each): the offline reference for many requests at the price of one load.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "actors/device.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/incremental_decoder.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tools/troupe/common.hpp"

namespace troupe::cli {

namespace {

struct generate_flags {
  engine_settings engine;
  std::vector<std::string> prompts;
  std::string chat;
  std::string system;
  int max_tokens = 128;
  sampling_params sampling;
  bool ignore_eos = false;
  bool json = false;
  bool no_bos = false;
};

// One prompt to the end, from an empty KV arena.
void generate_one(const generate_flags& f, const forward_fn& fwd, const device_info& info,
                  const tokenizer& tok, int n_ctx, const std::vector<int32_t>& prompt) {
  linear_pages pages(info.n_pages, info.page_size);
  sequence_slot seq;
  sampler smp(f.sampling);
  incremental_decoder detok(tok);

  const auto t0 = std::chrono::steady_clock::now();
  auto logits = feed_tokens(fwd, pages, seq, prompt, f.engine.batch, false);
  const auto t1 = std::chrono::steady_clock::now();

  std::vector<int32_t> history = prompt, out;
  nlohmann::json logprobs = nlohmann::json::array();
  std::string text, finish = "length";
  while (static_cast<int>(out.size()) < f.max_tokens) {
    auto s = smp.sample(logits, history);
    if (!f.ignore_eos && tok.is_end_of_generation(s.token)) {
      finish = "eos";
      break;
    }
    out.push_back(s.token);
    if (f.sampling.n_logprobs > 0) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& t : s.top) top.push_back({{"token", t.token}, {"logprob", t.logprob}});
      logprobs.push_back({{"token", s.token}, {"logprob", s.logprob}, {"top", top}});
    }
    history.push_back(s.token);
    auto delta = detok.push(s.token);
    text += delta;
    if (!f.json) {
      std::fwrite(delta.data(), 1, delta.size(), stdout);
      std::fflush(stdout);
    }
    if (static_cast<int>(out.size()) >= f.max_tokens) break;
    if (seq.length + 1 >= n_ctx) {
      finish = "context";
      break;
    }
    logits = feed_tokens(fwd, pages, seq, {s.token}, 1, false);
  }
  auto rest = detok.flush();
  text += rest;
  const auto t2 = std::chrono::steady_clock::now();
  const double pre_s = std::chrono::duration<double>(t1 - t0).count();
  const double dec_s = std::chrono::duration<double>(t2 - t1).count();

  if (f.json) {
    nlohmann::json j;
    j["prompt_token_ids"] = prompt;
    j["token_ids"] = out;
    j["text"] = text;
    j["finish_reason"] = finish;
    if (f.sampling.n_logprobs > 0) j["logprobs"] = logprobs;
    j["usage"] = {{"prompt_tokens", prompt.size()}, {"completion_tokens", out.size()}};
    j["timing"] = {{"prefill_s", pre_s}, {"decode_s", dec_s}};
    std::cout << j.dump() << std::endl;
  } else {
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::printf("\n");
    std::fprintf(stderr,
                 "[%s] prompt %zu tokens in %.3f s (%.1f tok/s), generated %zu in %.3f s (%.1f "
                 "tok/s), finish: %s\n",
                 info.device_name.c_str(), prompt.size(), pre_s, prompt.size() / pre_s, out.size(),
                 dec_s, out.empty() ? 0.0 : out.size() / dec_s, finish.c_str());
  }
}

int run_generate(const generate_flags& f) {
  if (f.prompts.empty() == f.chat.empty())
    throw std::invalid_argument("give --prompt (one or more) or --chat, not both");
  if (auto err = validate(f.sampling); !err.empty()) throw std::invalid_argument(err);
  auto model = open_model(f.engine);
  auto tok = tokenizer::create(model->vocab());

  // Every prompt is checked before the model goes to the device.
  std::vector<std::vector<int32_t>> prompts;
  if (!f.chat.empty()) {
    std::vector<chat_message> msgs;
    if (!f.system.empty()) msgs.push_back({"system", f.system});
    msgs.push_back({"user", f.chat});
    const auto chat = render_chat_prompt(model->vocab().chat_template, *tok, msgs, true);
    prompts.push_back(tok->encode(chat.text, model->vocab().add_bos && !chat.carries_bos, true));
  } else {
    for (const auto& p : f.prompts)
      prompts.push_back(tok->encode(p, model->vocab().add_bos && !f.no_bos, false));
  }
  const int n_ctx = model->hparams().n_ctx_train;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string which = prompts.size() > 1 ? " " + std::to_string(i + 1) : "";
    if (prompts[i].empty())
      throw std::invalid_argument("the prompt" + which + " encodes to no tokens");
    if (static_cast<int>(prompts[i].size()) >= n_ctx)
      throw std::invalid_argument("prompt" + which + " of " + std::to_string(prompts[i].size()) +
                                  " tokens does not fit the model's context of " +
                                  std::to_string(n_ctx));
  }

  actor_env env;
  auto opts = device_options(f.engine);
  auto dev = spawn_device(*env.sys, model, opts);
  auto fwd = blocking_forward(*env.sys, dev);
  const auto info = query_info(*env.sys, dev);
  for (const auto& prompt : prompts) generate_one(f, fwd, info, *tok, n_ctx, prompt);
  anon_send_exit(dev, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app) {
  auto f = std::make_shared<generate_flags>();
  auto* cmd = app.add_subcommand("generate", "generate text for a prompt");
  add_engine_flags(*cmd, f->engine);
  // One value a -p (`-p hello world` is an error naming "world", not two
  // prompts); repeat -p for several.
  cmd->add_option("-p,--prompt", f->prompts,
                  "raw prompt text (BOS added when the model wants it); repeat for several, run "
                  "one after another")
      ->allow_extra_args(false);
  cmd->add_option("--chat", f->chat, "a user message, rendered with the model's chat template");
  cmd->add_option("--system", f->system, "system message for --chat");
  cmd->add_option("-n,--max-tokens", f->max_tokens, "most tokens to generate")
      ->default_val(128)
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature", f->sampling.temperature, "0 = greedy")->default_val(0.0f);
  cmd->add_option("--top-k", f->sampling.top_k, "0 = off")->default_val(0);
  cmd->add_option("--top-p", f->sampling.top_p, "1 = off")->default_val(1.0f);
  cmd->add_option("--min-p", f->sampling.min_p, "0 = off")->default_val(0.0f);
  cmd->add_option("--repeat-penalty", f->sampling.repetition_penalty, "1 = off")->default_val(1.0f);
  cmd->add_option("--presence-penalty", f->sampling.presence_penalty)->default_val(0.0f);
  cmd->add_option("--frequency-penalty", f->sampling.frequency_penalty)->default_val(0.0f);
  cmd->add_option("--seed", f->sampling.seed, "sampling seed")
      ->default_val(0)
      ->check(whole_number());
  cmd->add_option("--logprobs", f->sampling.n_logprobs,
                  "report the top N logprobs per token (--json)")
      ->default_val(0)
      ->check(CLI::Range(0, 20));
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_flag("--no-bos", f->no_bos, "do not add BOS to a raw prompt");
  cmd->add_flag("--json", f->json,
                "print one JSON object per prompt: prompt_token_ids, token_ids, text, "
                "finish_reason");
  cmd->callback([f] {
    int rc = run_generate(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
