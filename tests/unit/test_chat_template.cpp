// Chat prompts rendered from the templates models ship, compared with the
// exact text their Jinja templates produce.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/model/model_file.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"

namespace troupe {
namespace {

const std::string& smollm_template() {
  static const std::string source = [] {
    const resolved_model r = resolve_model("smollm2-135m-instruct");
    return model_file::open(r.model_path)->vocab().chat_template;
  }();
  return source;
}

// SmolLM2's template as its GGUF carries it (also checked against the file).
const std::string k_smollm_source =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, SmolLM2TemplateIsTheOneInTheFile) {
  EXPECT_EQ(smollm_template(), k_smollm_source);
  const chat_template_info info = parse_chat_template(smollm_template());
  EXPECT_EQ(info.format, chat_format::chatml);
  EXPECT_EQ(info.default_system,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST(ChatTemplate, SmolLM2SingleUserGetsDefaultSystem) {
  const std::string got = render_chat(smollm_template(), {{"user", "What is 2+2?"}}, true);
  EXPECT_EQ(got,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(smollm_template(), {{"user", "Hi"}}, false),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, SmolLM2MultiTurnWithSystem) {
  const std::vector<chat_message> messages = {
      {"system", "You are terse."},
      {"user", "Name a colour."},
      {"assistant", "Blue."},
      {"user", "Another one, please.\n"},
  };
  EXPECT_EQ(render_chat(smollm_template(), messages, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nName a colour.<|im_end|>\n"
            "<|im_start|>assistant\nBlue.<|im_end|>\n"
            "<|im_start|>user\nAnother one, please.\n<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, SmolLM2EmptyConversation) {
  // The template's loop never runs, so no default system message either.
  EXPECT_EQ(render_chat(smollm_template(), {}, true), "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(smollm_template(), {}, false), "");
}

TEST(ChatTemplate, RenderedPromptTokenizesWithControlTokens) {
  const resolved_model r = resolve_model("smollm2-135m-instruct");
  const auto tok = tokenizer::create(model_file::open(r.model_path)->vocab());
  const std::string prompt = render_chat(smollm_template(), {{"user", "Hi"}}, true);
  const auto tokens = tok->encode(prompt, tok->add_bos(), true);
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.front(), tok->token_id("<|im_start|>"));
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), tok->token_id("<|im_start|>")), 3);
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), tok->token_id("<|im_end|>")), 2);
  EXPECT_EQ(tok->decode(tokens, true), prompt);
}

TEST(ChatTemplate, ChatMLWithoutDefaultSystem) {
  const std::string source =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  EXPECT_EQ(parse_chat_template(source).default_system, "");
  EXPECT_EQ(render_chat(source, {{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, DefaultSystemWithEscapedNewlines) {
  // Qwen-style: the literal spells its newlines as \n escapes.
  const std::string source =
      "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are Qwen, a "
      "\\'helpful\\' assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
      "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}";
  EXPECT_EQ(parse_chat_template(source).default_system, "You are Qwen, a 'helpful' assistant.");
}

TEST(ChatTemplate, Llama2Style) {
  const std::string source =
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
      "{% set system_message = messages[0]['content'] %}{% else %}"
      "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
      "{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}"
      "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
      "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
      "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
      "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
      "eos_token }}{% endif %}{% endfor %}";
  EXPECT_EQ(parse_chat_template(source).format, chat_format::llama2);
  const std::vector<chat_message> messages = {
      {"system", "Be brief."}, {"user", "Hi "}, {"assistant", " Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(render_chat(source, messages, true),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>"
            "<s>[INST] Bye [/INST]");
  EXPECT_EQ(render_chat(source, {{"user", "Hi"}}, true), "<s>[INST] Hi [/INST]");
  EXPECT_THROW(render_chat(source, {{"user", "a"}, {"user", "b"}}, true), std::runtime_error);
}

// Gemma: what llama.cpp's built-in gemma template renders (llama-server
// --no-jinja --chat-template gemma, /apply-template, October 2026), and
// the template troupe gives Gemma 3 files that carry none.
TEST(ChatTemplate, GemmaFoldsSystemIntoTheFirstUserTurn) {
  const std::string source = "{{ bos_token }}{% for m in messages %}<start_of_turn>...";
  EXPECT_EQ(parse_chat_template(source).format, chat_format::gemma);
  const std::vector<chat_message> messages = {
      {"system", "Be brief. "}, {"user", " Hi "}, {"assistant", " Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(render_chat(source, messages, true),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
            "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_chat(source, {{"user", "Hi"}}, false), "<start_of_turn>user\nHi<end_of_turn>\n");
}

// Llama 3 and Mistral v1: what llama.cpp's built-in llama3 and mistral-v1
// templates render (llama-server --no-jinja --chat-template NAME,
// /apply-template, October 2026); Mistral v3-tekken: what llama.cpp
// renders through Mistral Nemo's own template (--jinja
// --chat-template-file models/templates/mistralai-Mistral-Nemo-Instruct-
// 2407.jinja: the system message in the last user turn), v3 by the same
// rules with Mistral-7B-v0.3's spacing.
TEST(ChatTemplate, Llama3AndMistralAsLlamaCppRendersThem) {
  const std::vector<chat_message> messages = {{"system", "You are terse."},
                                              {"user", "Hi there"},
                                              {"assistant", " Hello! "},
                                              {"user", "Weather?"}};
  const std::string llama3 =
      "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] "
      "+ '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}";
  EXPECT_EQ(parse_chat_template(llama3).format, chat_format::llama3);
  EXPECT_EQ(render_chat(llama3, messages, true),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::string v3 = "{%- if tools %}[AVAILABLE_TOOLS]{%- endif %}{{ '[INST] ' + m }}";
  const std::string tekken = "{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + m + \"[/INST]\" }}";
  const std::string v1 = "{{ bos_token + ' [INST] ' + system_message }}";
  EXPECT_EQ(parse_chat_template(v3).mistral, mistral_style::v3);
  EXPECT_EQ(parse_chat_template(tekken).mistral, mistral_style::tekken);
  EXPECT_EQ(parse_chat_template(v1).mistral, mistral_style::v1);
  EXPECT_EQ(render_chat(v3, messages, true),
            "[INST] Hi there[/INST] Hello!</s>[INST] You are terse.\n\nWeather?[/INST]");
  EXPECT_EQ(render_chat(tekken, messages, true),
            "[INST]Hi there[/INST] Hello! </s>[INST]You are terse.\n\nWeather?[/INST]");
  EXPECT_EQ(render_chat(v1, messages, true),
            " [INST] You are terse.\n\nHi there [/INST]  Hello! </s> [INST] Weather? [/INST]");
  // Tool turns only where their family has them.
  EXPECT_NO_THROW(render_chat(llama3, {{"user", "x"}, {"ipython", "\"ok\""}}, true));
  EXPECT_THROW(render_chat(llama3, {{"tool_calls", "x"}}, true), std::runtime_error);
  EXPECT_THROW(render_chat(v3, {{"ipython", "x"}}, true), std::runtime_error);
}

// Phi-3 and DeepSeek's Coder, V2 and V3/R1 families, recognised by the
// markers llama.cpp looks for and rendered as its built-ins render them.
TEST(ChatTemplate, Phi3AndDeepSeekAsLlamaCppRendersThem) {
  const std::vector<chat_message> messages = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Sky?"}};
  const std::string phi3 =
      "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] "
      "+ '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
      "{% endif %}";
  EXPECT_EQ(parse_chat_template(phi3).format, chat_format::phi3);
  EXPECT_EQ(render_chat(phi3, messages, true),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nSky?<|end|>\n<|assistant|>\n");
  const std::string coder = "{{ '### Instruction:\n' + content }}{{ '\n<|EOT|>\n' }}";
  EXPECT_EQ(render_chat(coder, messages, true),
            "Be brief.### Instruction:\nHi\n### Response:\nHello.\n<|EOT|>\n"
            "### Instruction:\nSky?\n### Response:\n");
  const std::string v2 = "{{ 'Assistant: ' + message['content'] + eos_token }}";
  EXPECT_EQ(render_chat(v2, messages, true),
            "Be brief.\n\nUser: Hi\n\nAssistant: Hello.<\uff5cend\u2581of\u2581sentence\uff5c>"
            "User: Sky?\n\nAssistant:");
  const std::string v3 =
      "{{'<\uff5cUser\uff5c>' + c}}{{'<\uff5cAssistant\uff5c>' + c + "
      "'<\uff5cend\u2581of\u2581sentence\uff5c>'}}";
  EXPECT_EQ(parse_chat_template(v3).format, chat_format::deepseek3);
  EXPECT_EQ(render_chat(v3, messages, false),
            "Be brief.\n\n<\uff5cUser\uff5c>Hi<\uff5cAssistant\uff5c>Hello."
            "<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>Sky?");
}

// A template of no known family runs through the Jinja interpreter, with
// the caller's special tokens; one it cannot run is refused, naming why.
TEST(ChatTemplate, OtherTemplatesRunAsJinja) {
  const std::string zephyr =
      "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] + eos_token }}\n{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";
  auto info = parse_chat_template(zephyr);
  EXPECT_EQ(info.format, chat_format::jinja);
  info.eos_token = "</s>";
  EXPECT_EQ(render_chat(info, {{"user", "Hi"}, {"tool", "42"}}, true),
            "<|user|>\nHi</s>\n<|tool|>\n42</s>\n<|assistant|>\n");
  const std::string strict =
      "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok";
  try {
    render_chat(strict, {{"assistant", "x"}}, true);
    FAIL() << "expected the template's own error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("user first"), std::string::npos) << e.what();
  }
}

// Real models' templates (Llama 3.1 and 3.3, Qwen 2.5 and 3, DeepSeek R1,
// Phi-3.5, Mistral Nemo, SmolLM3, Hermes 3, Gemma 2, Kimi K2, Command R+),
// three conversations each, run as Jinja and compared with llama.cpp's
// `llama-server --jinja` renderings (tests/data/chat_template_golden.json,
// recorded by tools/record_template_golden.py), its system-role fold for
// templates that drop or refuse system messages (Gemma 2) included.
TEST(ChatTemplate, RealTemplatesAsJinjaRenderAsLlamaCppRendersThem) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/tests/data/chat_template_golden.json");
  ASSERT_TRUE(in.good());
  const auto golden = nlohmann::json::parse(in);
  ASSERT_GE(golden.size(), 8u);
  for (auto it = golden.begin(); it != golden.end(); ++it) {
    SCOPED_TRACE(it.key());
    const auto& g = it.value();
    auto info = jinja_chat_template(g["source"].get<std::string>());
    info.bos_token = g["bos_token"].get<std::string>();
    info.eos_token = g["eos_token"].get<std::string>();
    info.date_string = g["date_string"].get<std::string>();
    info.datetime = g.value("datetime", "");
    for (const auto& c : g["conversations"]) {
      std::vector<chat_message> messages;
      for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
      if (!c["error"].is_null()) {
        EXPECT_THROW(render_chat(info, messages, true), std::runtime_error) << c["error"];
        continue;
      }
      // llama.cpp drops a leading BOS from the text (its tokenizer adds
      // one); troupe keeps it and adds none (chat_prompt): same tokens.
      std::string got = render_chat(info, messages, true);
      if (!info.bos_token.empty() && got.rfind(info.bos_token, 0) == 0)
        got.erase(0, info.bos_token.size());
      EXPECT_EQ(got, c["prompt"].get<std::string>()) << c["messages"].dump();
    }
  }
}

TEST(ChatTemplate, RefusesUnknownTemplatesAndRoles) {
  EXPECT_THROW(render_chat("", {{"user", "Hi"}}, true), std::runtime_error);
  try {
    render_chat(
        "{% while true %}{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% endwhile %}",
        {{"user", "Hi"}}, true);
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported chat template"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("unsupported statement 'while'"), std::string::npos);
  }
  EXPECT_THROW(render_chat(k_smollm_source, {{"tool", "x"}}, true), std::runtime_error);
}

}  // namespace
}  // namespace troupe
