// troupe::parse_chat_template and render_chat (runtime/text/chat_template): the
// input up to its first NUL is a template; the rest is messages, each
// "role\x01content" and separated by NUL.  std::runtime_error is the
// documented error channel (unsupported template, unknown role, llama-2
// turns that do not alternate).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/text/chat_template.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t at = input.find('\0');
  const std::string source = input.substr(0, at);
  std::vector<troupe::chat_message> messages;
  while (at != std::string::npos && messages.size() < 64) {
    const size_t next = input.find('\0', at + 1);
    const std::string one = input.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    const size_t sep = one.find('\x01');
    messages.push_back(
        {one.substr(0, sep), sep == std::string::npos ? std::string() : one.substr(sep + 1)});
    at = next;
  }
  try {
    const auto info = troupe::parse_chat_template(source);
    const std::string a = troupe::render_chat(info, messages, true);
    const std::string b = troupe::render_chat(source, messages, false);
    (void)a;
    (void)b;
  } catch (const std::runtime_error&) {
  }
  return 0;
}
