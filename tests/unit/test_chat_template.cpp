// Chat prompts rendered from the templates models ship, compared with the
// exact text their Jinja templates produce.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(ChatTemplate, RefusesUnknownTemplatesAndRoles) {
  EXPECT_THROW(render_chat("", {{"user", "Hi"}}, true), std::runtime_error);
  try {
    render_chat("{% for m in messages %}<|user|>{{ m.content }}<|end|>{% endfor %}",
                {{"user", "Hi"}}, true);
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported chat template"), std::string::npos);
  }
  EXPECT_THROW(render_chat(k_smollm_source, {{"tool", "x"}}, true), std::runtime_error);
}

}  // namespace
}  // namespace troupe
