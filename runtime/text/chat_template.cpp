#include "runtime/text/chat_template.hpp"

#include <optional>
#include <stdexcept>
#include <string_view>

namespace troupe {

namespace {

constexpr std::string_view k_im_start = "<|im_start|>";
constexpr std::string_view k_im_end = "<|im_end|>";

[[noreturn]] void refuse(const std::string& source, const std::string& why) {
  std::string head = source.substr(0, 60);
  for (char& c : head) {
    if (c == '\n') c = ' ';
  }
  throw std::runtime_error("unsupported chat template: " + why +
                           (source.empty() ? "" : " (template starts '" + head + "')"));
}

// The Jinja string literal whose opening quote is at source[quote]; nullopt
// when it is not one or does not end.
std::optional<std::string> read_string_literal(const std::string& source, size_t quote) {
  const char q = source[quote];
  if (q != '\'' && q != '"') return std::nullopt;
  std::string out;
  for (size_t i = quote + 1; i < source.size(); ++i) {
    const char c = source[i];
    if (c == q) return out;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i == source.size()) break;
    switch (source[i]) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      default:
        out += source[i];
        break;  // \\ \' \"
    }
  }
  return std::nullopt;
}

// ChatML templates that give a default system turn spell it as one literal:
// '<|im_start|>system\nYou are ...<|im_end|>\n'.  A literal that stops after
// "system\n" is the start of a rendered system message, not a default.
std::string find_default_system(const std::string& source) {
  const std::string opener = std::string(k_im_start) + "system\n";
  for (size_t at = source.find(k_im_start); at != std::string::npos;
       at = source.find(k_im_start, at + 1)) {
    if (at == 0) continue;
    const auto literal = read_string_literal(source, at - 1);
    if (!literal || literal->compare(0, opener.size(), opener) != 0) continue;
    const size_t end = literal->find(k_im_end, opener.size());
    if (end == std::string::npos) continue;
    return literal->substr(opener.size(), end - opener.size());
  }
  return {};
}

void check_role(chat_format f, const chat_message& m) {
  if (m.role == "system" || m.role == "user" || m.role == "assistant") return;
  if (f == chat_format::llama3 && m.role == "ipython") return;
  if (f == chat_format::mistral &&
      (m.role == "available_tools" || m.role == "tool_calls" || m.role == "tool_results"))
    return;
  throw std::runtime_error(
      "unsupported chat role '" + m.role + "' (allowed: system, user, assistant" +
      (f == chat_format::llama3    ? ", ipython"
       : f == chat_format::mistral ? ", available_tools, tool_calls, tool_results"
                                   : "") +
      ")");
}

std::string strip(std::string_view s) {
  constexpr std::string_view blanks = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(blanks);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(blanks);
  return std::string(s.substr(b, e - b + 1));
}

std::string render_chatml(const chat_template_info& info, const std::vector<chat_message>& messages,
                          bool add_generation_prompt) {
  std::string out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out += k_im_start;
    out += role;
    out += '\n';
    out += content;
    out += k_im_end;
    out += '\n';
  };
  if (!messages.empty() && messages.front().role != "system" && !info.default_system.empty()) {
    turn("system", info.default_system);
  }
  for (const chat_message& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) {
    out += k_im_start;
    out += "assistant\n";
  }
  return out;
}

// Meta's llama-2 chat template: an optional leading system message folded
// into the first user turn, then strictly alternating user/assistant turns.
std::string render_llama2(const std::vector<chat_message>& messages) {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages.front().role == "system") {
    system = messages.front().content;
    first = 1;
  }
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    const bool want_user = (i - first) % 2 == 0;
    if (m.role != (want_user ? "user" : "assistant")) {
      throw std::runtime_error("llama-2 chat template: message " + std::to_string(i) +
                               " has role '" + m.role + "', expected '" +
                               (want_user ? "user" : "assistant") +
                               "' (roles must alternate user/assistant after one optional system)");
    }
    if (want_user) {
      std::string content;
      if (i == first && first == 1) {
        content.append("<<SYS>>\n").append(system).append("\n<</SYS>>\n\n");
      }
      content.append(m.content);
      out.append("<s>[INST] ").append(strip(content)).append(" [/INST]");
    } else {
      out.append(" ").append(strip(m.content)).append(" </s>");
    }
  }
  return out;
}

// Gemma's turns, as llama.cpp's built-in gemma template renders them: the
// system messages (trimmed) prefixed to the next user turn, "assistant"
// named "model", every content trimmed; BOS comes from the tokenizer.
std::string render_gemma(const std::vector<chat_message>& messages, bool add_generation_prompt) {
  std::string out, system;
  for (const chat_message& m : messages) {
    if (m.role == "system") {
      system += strip(m.content);
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out.append("<start_of_turn>").append(role).append("\n");
    if (!system.empty() && role != "model") {
      out.append(system).append("\n\n");
      system.clear();
    }
    out.append(strip(m.content)).append("<end_of_turn>\n");
  }
  if (add_generation_prompt) out.append("<start_of_turn>model\n");
  return out;
}

// Llama 3, as llama.cpp's built-in llama3 template: every turn a header,
// its trimmed content and <|eot_id|>; BOS comes from the tokenizer.
std::string render_llama3(const std::vector<chat_message>& messages, bool add_generation_prompt) {
  std::string out;
  for (const chat_message& m : messages)
    out.append("<|start_header_id|>")
        .append(m.role)
        .append("<|end_header_id|>\n\n")
        .append(strip(m.content))
        .append("<|eot_id|>");
  if (add_generation_prompt) out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out;
}

// Mistral's [INST] turns.  v1 as llama.cpp's built-in mistral-v1
// template (the system message opens the first turn).  v3 and v3-tekken as
// Mistral's own Jinja templates (Mistral-7B-v0.3's, Nemo's), which llama.cpp
// runs with --jinja: the system message goes into the last user turn
// (when the conversation ends with one), an answer is " " + its trimmed
// text (v3) or its text (tekken), and the tool turns are written as they
// are, the available tools just before the last user turn.  BOS comes
// from the tokenizer; the answer follows [/INST] or a tool's results.
std::string render_mistral(mistral_style style, const std::vector<chat_message>& messages) {
  std::string out, system;
  if (style == mistral_style::v1) {
    bool inside = false;
    for (const chat_message& m : messages) {
      if (!inside) out.append(" [INST] ");
      inside = true;
      if (m.role == "system") {
        out.append(m.content).append("\n\n");
      } else if (m.role == "user") {
        out.append(m.content).append(" [/INST]");
      } else {
        out.append(" ").append(m.content).append("</s>");
        inside = false;
      }
    }
    return out;
  }
  const std::string space = style == mistral_style::v3 ? " " : "";
  for (const chat_message& m : messages)
    if (m.role == "system") system.append(m.content);
  for (size_t i = 0; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    if (m.role == "system") continue;
    if (m.role == "available_tools" || m.role == "tool_results") {
      out.append(m.content);
    } else if (m.role == "tool_calls") {
      out.append(m.content).append("</s>");
    } else if (m.role == "user") {
      out.append("[INST]").append(space);
      if (i + 1 == messages.size() && !system.empty()) out.append(system).append("\n\n");
      out.append(m.content).append("[/INST]");
    } else {
      out.append(space)
          .append(style == mistral_style::v3 ? strip(m.content) : m.content)
          .append("</s>");
    }
  }
  return out;
}

}  // namespace

chat_template_info parse_chat_template(const std::string& source) {
  if (source.empty()) refuse(source, "the model has no chat template");
  chat_template_info info;
  if (source.find(k_im_start) != std::string::npos && source.find(k_im_end) != std::string::npos) {
    info.format = chat_format::chatml;
    info.default_system = find_default_system(source);
    return info;
  }
  if (source.find("[INST]") != std::string::npos && source.find("<<SYS>>") != std::string::npos) {
    info.format = chat_format::llama2;
    return info;
  }
  if (source.find("<start_of_turn>") != std::string::npos) {
    info.format = chat_format::gemma;
    return info;
  }
  if (source.find("<|start_header_id|>") != std::string::npos &&
      source.find("<|end_header_id|>") != std::string::npos) {
    info.format = chat_format::llama3;
    return info;
  }
  // Mistral's official v1, v3 and v3-tekken templates, told apart as
  // llama.cpp tells them ([SYSTEM_PROMPT] templates, v7, are not read).
  if (source.find("[INST]") != std::string::npos &&
      source.find("[SYSTEM_PROMPT]") == std::string::npos &&
      (source.find("' [INST] ' + system_message") != std::string::npos ||
       source.find("[AVAILABLE_TOOLS]") != std::string::npos)) {
    info.format = chat_format::mistral;
    info.mistral = source.find(" [INST]") != std::string::npos      ? mistral_style::v1
                   : source.find("\"[INST]\"") != std::string::npos ? mistral_style::tekken
                                                                    : mistral_style::v3;
    return info;
  }
  refuse(source,
         "neither ChatML, llama-2 [INST]/<<SYS>>, Gemma <start_of_turn>, Llama 3 "
         "<|start_header_id|> nor Mistral [INST]/[AVAILABLE_TOOLS]");
}

std::string render_chat(const chat_template_info& info, const std::vector<chat_message>& messages,
                        bool add_generation_prompt) {
  for (const chat_message& m : messages) check_role(info.format, m);
  switch (info.format) {
    case chat_format::chatml:
      return render_chatml(info, messages, add_generation_prompt);
    case chat_format::llama2:
      return render_llama2(messages);
    case chat_format::gemma:
      return render_gemma(messages, add_generation_prompt);
    case chat_format::llama3:
      return render_llama3(messages, add_generation_prompt);
    case chat_format::mistral:
      return render_mistral(info.mistral, messages);
  }
  throw std::runtime_error("unsupported chat template: unknown format");
}

std::string render_chat(const std::string& template_source,
                        const std::vector<chat_message>& messages, bool add_generation_prompt) {
  return render_chat(parse_chat_template(template_source), messages, add_generation_prompt);
}

}  // namespace troupe
