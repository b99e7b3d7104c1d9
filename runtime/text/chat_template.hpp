#pragma once
// Chat prompts from the Jinja template a model ships, for the template
// families troupe recognises (no Jinja interpreter): ChatML
// ("<|im_start|>role\ncontent<|im_end|>\n", SmolLM2, Qwen) with the default
// system message the template inserts, llama-2 ("[INST] <<SYS>>") and
// Gemma ("<start_of_turn>user\n...<end_of_turn>\n", "model" for the
// assistant, a system message folded into the first user turn) and Llama 3
// ("<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>"), Phi-3 and
// DeepSeek's three (Coder, V2, V3/R1) as llama.cpp's built-in templates of
// those names render them, recognised by the markers llama.cpp looks for;
// Mistral's "[INST]" turns as its v3 and v3-tekken Jinja templates do (v1
// as llama.cpp's built-in mistral-v1).  Any other template is run by the
// Jinja interpreter (runtime/text/jinja), with Hugging Face's environment;
// one it cannot run is refused rather than guessed at.
#include <memory>
#include <string>
#include <vector>

#include "runtime/text/jinja.hpp"

namespace troupe {

struct chat_message {
  // "system", "user" or "assistant"; Llama 3 also "ipython" (a tool's
  // result); Mistral also "available_tools", "tool_calls" and
  // "tool_results", whose content is written as it is, outside [INST]
  // (tools/client/openai_tools spells them).
  std::string role;
  std::string content;
};

enum class chat_format {
  chatml,
  llama2,
  gemma,
  llama3,
  mistral,
  phi3,       // "<|role|>\ncontent<|end|>\n"
  deepseek,   // DeepSeek Coder: "### Instruction:" / "### Response:" ... "<|EOT|>"
  deepseek2,  // DeepSeek V2: "User: " / "Assistant: " ... end of sentence
  deepseek3,  // DeepSeek V3 and R1: "<｜User｜>" / "<｜Assistant｜>"
  jinja,      // any other template, run by runtime/text/jinja
};

// Mistral's spacing variants (llama.cpp's mistral-v1, -v3, -v3-tekken).
enum class mistral_style { v1, v3, tekken };

struct chat_template_info {
  chat_format format = chat_format::chatml;
  mistral_style mistral = mistral_style::v3;
  // ChatML: the system message the template puts first when the
  // conversation does not start with one; empty when it has none.
  std::string default_system;
  // jinja: the compiled template, and the text of the special tokens it
  // may write (bos_token, eos_token; empty unless the caller sets them).
  std::shared_ptr<const jinja::program> program;
  std::string bos_token, eos_token;
  // jinja: whether the template writes a system message (probed as
  // llama.cpp probes it); where not, the system message is folded into the
  // next one, as llama.cpp does.
  bool system_role = true;
  // jinja: the date_string templates may print ("26 Nov 2026"); empty:
  // today's (UTC), as llama.cpp gives it.
  std::string date_string;
  // jinja: the datetime FireFunction v2's template prints ("Nov 26 2026");
  // empty: today's.
  std::string datetime;
  // jinja: FireFunction v2's template, which prints the context variable
  // `functions` (the tools' JSON); llama.cpp gives it "" without tools,
  // and so does troupe, whose templates get no tools.
  bool reads_functions = false;
};

// Throws std::runtime_error("unsupported chat template: ...").
chat_template_info parse_chat_template(const std::string& template_source);
// The template as Jinja, whatever its family (what parse_chat_template
// falls back to); throws std::runtime_error naming what cannot run.
chat_template_info jinja_chat_template(const std::string& template_source);

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

class tokenizer;

// A chat's prompt for a model: its template rendered with the text of the
// tokenizer's BOS and EOS (for templates that write them); carries_bos:
// the text starts with BOS already, so encoding must not add another.
struct chat_prompt {
  std::string text;
  bool carries_bos = false;
};
chat_prompt render_chat_prompt(const std::string& template_source, const tokenizer& tok,
                               const std::vector<chat_message>& messages,
                               bool add_generation_prompt);

}  // namespace troupe
