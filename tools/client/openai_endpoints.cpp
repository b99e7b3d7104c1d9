#include "tools/client/openai_endpoints.hpp"

#include <algorithm>

namespace troupe::openai {

std::optional<std::string> bearer_key(const std::string& authorization) {
  const std::string prefix = "Bearer ";
  if (authorization.rfind(prefix, 0) != 0) return std::nullopt;
  return authorization.substr(prefix.size());
}

api_error unauthorized() {
  api_error e;
  e.status = 401;
  e.message = "Incorrect API key provided (send it as 'Authorization: Bearer KEY').";
  e.code = "invalid_api_key";
  return e;
}

bool origin_allowed(const std::vector<std::string>& allowed, const std::string& origin) {
  return std::any_of(allowed.begin(), allowed.end(),
                     [&](const std::string& a) { return a == "*" || a == origin; });
}

std::optional<api_error> parse_tokenize(const nlohmann::ordered_json& body, tokenize_request& out) {
  const auto content = body.find("content");
  if (content == body.end() || !content->is_string())
    return invalid_request("content", "'content' must be a string");
  if (content->get_ref<const std::string&>().size() > k_max_tokenize_bytes)
    return invalid_request(
        "content", "'content' is " + std::to_string(content->get_ref<const std::string&>().size()) +
                       " bytes; /tokenize takes at most " + std::to_string(k_max_tokenize_bytes));
  out.content = content->get<std::string>();
  for (auto [key, flag] :
       {std::pair{"add_special", &out.add_special}, std::pair{"with_pieces", &out.with_pieces}}) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_boolean())
      return invalid_request(key, std::string("'") + key + "' must be true or false");
    *flag = it->get<bool>();
  }
  return std::nullopt;
}

std::optional<api_error> parse_detokenize(const nlohmann::ordered_json& body, int32_t vocab_size,
                                          std::vector<int32_t>& out) {
  const auto tokens = body.find("tokens");
  const std::string rule =
      "'tokens' must be a list of token ids in [0, " + std::to_string(vocab_size) + ")";
  if (tokens == body.end() || !tokens->is_array()) return invalid_request("tokens", rule);
  if (tokens->size() > k_max_detokenize_tokens)
    return invalid_request("tokens", "'tokens' has " + std::to_string(tokens->size()) +
                                         " ids; /detokenize takes at most " +
                                         std::to_string(k_max_detokenize_tokens));
  out.clear();
  for (const auto& t : *tokens) {
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() >= 1u << 31))
      return invalid_request("tokens", rule);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab_size) return invalid_request("tokens", rule);
    out.push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

}  // namespace troupe::openai
