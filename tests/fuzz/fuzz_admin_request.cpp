// The admin endpoint's request parser (net/admin_request): the input is
// a request body as the endpoint receives it.  parse_admin_request never
// throws (any exception is a finding) and what it accepts is a request
// whose command is a string and whose count is in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "net/admin_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const auto parsed = troupe::parse_admin_request(body);
  if (const auto* req = std::get_if<troupe::admin_request>(&parsed)) {
    (void)troupe::admin_command_is_read_only(req->command);
  } else if (std::get<troupe::admin_refusal>(parsed).code.empty()) {
    std::abort();  // a refusal always names its code
  }
  return 0;
}
