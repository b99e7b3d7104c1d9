#include "runtime/text/chat_template.hpp"

#include "runtime/text/tokenizer.hpp"

#include <ctime>
#include <map>
#include <mutex>
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
  if (f == chat_format::jinja) return;  // the template decides (raise_exception)
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

// Phi-3 and the DeepSeek families, as llama.cpp's built-ins write them:
// each role's opener, the content, and its closer; system messages as they
// are (Phi-3: a turn of their own).
std::string render_phi3_or_deepseek(chat_format f, const std::vector<chat_message>& messages,
                                    bool add_generation_prompt) {
  constexpr std::string_view eos =
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  constexpr std::string_view ds_user = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
  constexpr std::string_view ds_assistant =
      "<\xEF\xBD\x9C"
      "Assistant\xEF\xBD\x9C>";
  std::string out;
  for (const chat_message& m : messages) {
    const bool system = m.role == "system", user = m.role == "user";
    switch (f) {
      case chat_format::phi3:
        out.append("<|").append(m.role).append("|>\n").append(m.content).append("<|end|>\n");
        break;
      case chat_format::deepseek:
        if (system)
          out.append(m.content);
        else if (user)
          out.append("### Instruction:\n").append(m.content).append("\n");
        else
          out.append("### Response:\n").append(m.content).append("\n<|EOT|>\n");
        break;
      case chat_format::deepseek2:
        if (system)
          out.append(m.content).append("\n\n");
        else if (user)
          out.append("User: ").append(m.content).append("\n\n");
        else
          out.append("Assistant: ").append(m.content).append(eos);
        break;
      default:  // deepseek3
        if (system)
          out.append(m.content).append("\n\n");
        else if (user)
          out.append(ds_user).append(m.content);
        else
          out.append(ds_assistant).append(m.content).append(eos);
        break;
    }
  }
  if (add_generation_prompt) {
    out.append(f == chat_format::phi3        ? std::string_view("<|assistant|>\n")
               : f == chat_format::deepseek  ? std::string_view("### Response:\n")
               : f == chat_format::deepseek2 ? std::string_view("Assistant:")
                                             : ds_assistant);
  }
  return out;
}

bool has(const std::string& source, std::string_view marker) {
  return source.find(marker) != std::string::npos;
}

jinja::value jinja_context(const chat_template_info& info,
                           const std::vector<chat_message>& messages, bool add_generation_prompt) {
  jinja::value ctx = jinja::value::object();
  ctx["messages"] = jinja::value::array();
  for (const chat_message& m : messages)
    ctx["messages"].push_back({{"role", m.role}, {"content", m.content}});
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = info.bos_token;
  ctx["eos_token"] = info.eos_token;
  ctx["enable_thinking"] = true;  // as llama.cpp passes it by default
  // Today's date as llama.cpp gives it (date_string "26 Nov 2026", datetime
  // "Nov 26 2026"); fixed ones where the caller sets them.
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  auto format = [&](const char* f) {
    char buf[32];
    return std::string(buf, std::strftime(buf, sizeof buf, f, &tm));
  };
  ctx["date_string"] = info.date_string.empty() ? format("%d %b %Y") : info.date_string;
  ctx["datetime"] = info.datetime.empty() ? format("%b %d %Y") : info.datetime;
  if (info.reads_functions) ctx["functions"] = "";
  return ctx;
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
  if (has(source, "<|assistant|>") && has(source, "<|end|>")) {
    info.format = chat_format::phi3;
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
  if (has(source, "### Instruction:") && has(source, "<|EOT|>")) {
    info.format = chat_format::deepseek;
    return info;
  }
  if (has(source, "'Assistant: ' + message['content'] + eos_token")) {
    info.format = chat_format::deepseek2;
    return info;
  }
  if (has(source,
          "<\xEF\xBD\x9C"
          "Assistant\xEF\xBD\x9C>") &&
      has(source, "<\xEF\xBD\x9CUser\xEF\xBD\x9C>") &&
      has(source,
          "<\xEF\xBD\x9C"
          "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>")) {
    info.format = chat_format::deepseek3;
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
  try {
    return jinja_chat_template(source);
  } catch (const std::exception& e) {
    refuse(source,
           "neither ChatML, llama-2 [INST]/<<SYS>>, Phi-3 <|assistant|>/<|end|>, Gemma "
           "<start_of_turn>, Llama 3 <|start_header_id|>, DeepSeek (Coder, V2, V3) nor Mistral "
           "[INST]/[AVAILABLE_TOOLS], and not Jinja troupe can run: " +
               std::string(e.what()));
  }
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
    case chat_format::phi3:
    case chat_format::deepseek:
    case chat_format::deepseek2:
    case chat_format::deepseek3:
      return render_phi3_or_deepseek(info.format, messages, add_generation_prompt);
    case chat_format::jinja: {
      if (info.system_role || messages.empty() || messages.front().role != "system")
        return info.program->render(jinja_context(info, messages, add_generation_prompt));
      // As llama.cpp: the system message joins the next one, or goes.
      std::vector<chat_message> folded(messages.begin() + 1, messages.end());
      if (!folded.empty())
        folded.front().content = messages.front().content + "\n" + folded.front().content;
      return info.program->render(jinja_context(info, folded, add_generation_prompt));
    }
  }
  throw std::runtime_error("unsupported chat template: unknown format");
}

chat_template_info jinja_chat_template(const std::string& source) {
  chat_template_info info;
  info.format = chat_format::jinja;
  info.program = std::make_shared<const jinja::program>(source);
  info.reads_functions = has(source, " functools[");  // llama.cpp's mark of FireFunction v2
  // llama.cpp's capability probe: does a system message's text come out?
  constexpr std::string_view probe = "System message";
  try {
    const std::string out = info.program->render(
        jinja_context(info, {{"system", std::string(probe)}, {"user", "User message"}}, false));
    info.system_role = out.find(probe) != std::string::npos;
  } catch (const std::exception&) {
    info.system_role = false;
  }
  return info;
}

chat_prompt render_chat_prompt(const std::string& template_source, const tokenizer& tok,
                               const std::vector<chat_message>& messages,
                               bool add_generation_prompt) {
  // A model's template is parsed (and, for Jinja, probed) once per process,
  // not per request; a template that cannot run is refused each time.
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const chat_template_info>> parsed;
  std::shared_ptr<const chat_template_info> cached;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = parsed.find(template_source); it != parsed.end()) cached = it->second;
  }
  if (!cached) {
    cached = std::make_shared<const chat_template_info>(parse_chat_template(template_source));
    std::lock_guard<std::mutex> lock(mutex);
    if (parsed.size() >= 16) parsed.clear();  // a handful of models per process
    parsed.emplace(template_source, cached);
  }
  chat_template_info info = *cached;
  if (tok.bos() >= 0) info.bos_token = tok.piece(tok.bos());
  if (tok.eos() >= 0) info.eos_token = tok.piece(tok.eos());
  chat_prompt p;
  p.text = render_chat(info, messages, add_generation_prompt);
  // A llama-2 prompt spells its own "<s>"; a Jinja one may write bos_token.
  p.carries_bos = p.text.rfind("<s>", 0) == 0 ||
                  (!info.bos_token.empty() && p.text.rfind(info.bos_token, 0) == 0);
  return p;
}

std::string render_chat(const std::string& template_source,
                        const std::vector<chat_message>& messages, bool add_generation_prompt) {
  return render_chat(parse_chat_template(template_source), messages, add_generation_prompt);
}

}  // namespace troupe
