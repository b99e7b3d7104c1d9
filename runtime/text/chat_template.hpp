#pragma once
// Chat prompts from the Jinja template a model ships, for the template
// families troupe recognises (no Jinja interpreter): ChatML
// ("<|im_start|>role\ncontent<|im_end|>\n", SmolLM2, Qwen) with the default
// system message the template inserts, llama-2 ("[INST] <<SYS>>") and
// Gemma ("<start_of_turn>user\n...<end_of_turn>\n", "model" for the
// assistant, a system message folded into the first user turn) and Llama 3
// ("<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>") as
// llama.cpp's built-in templates of those names render them; Mistral's
// "[INST]" turns as its v3 and v3-tekken Jinja templates do (v1 as
// llama.cpp's built-in mistral-v1).  Anything else is refused rather than
// guessed at.
#include <string>
#include <vector>

namespace troupe {

struct chat_message {
  // "system", "user" or "assistant"; Llama 3 also "ipython" (a tool's
  // result); Mistral also "available_tools", "tool_calls" and
  // "tool_results", whose content is written as it is, outside [INST]
  // (tools/client/openai_tools spells them).
  std::string role;
  std::string content;
};

enum class chat_format { chatml, llama2, gemma, llama3, mistral };

// Mistral's spacing variants (llama.cpp's mistral-v1, -v3, -v3-tekken).
enum class mistral_style { v1, v3, tekken };

struct chat_template_info {
  chat_format format = chat_format::chatml;
  mistral_style mistral = mistral_style::v3;
  // ChatML: the system message the template puts first when the
  // conversation does not start with one; empty when it has none.
  std::string default_system;
};

// Throws std::runtime_error("unsupported chat template: ...").
chat_template_info parse_chat_template(const std::string& template_source);

// The prompt text, special tokens spelled out (encode it with
// parse_special, and without BOS for llama-2: the text carries "<s>").
// add_generation_prompt: open an assistant turn at the end (ChatML; a
// llama-2 prompt always ends ready for the answer).  Throws
// std::runtime_error for an unsupported template, an unknown role, or (for
// llama-2) turns that do not alternate user/assistant.
std::string render_chat(const std::string& template_source,
                        const std::vector<chat_message>& messages, bool add_generation_prompt);
std::string render_chat(const chat_template_info& info, const std::vector<chat_message>& messages,
                        bool add_generation_prompt);

}  // namespace troupe
