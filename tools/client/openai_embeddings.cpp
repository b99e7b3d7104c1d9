#include "tools/client/openai_embeddings.hpp"

#include <cstring>

#include "runtime/common/base64.hpp"

namespace troupe::openai {

namespace {

using ojson = nlohmann::ordered_json;

std::optional<api_error> token_prompt(const ojson& ids, const std::string& where,
                                      wire::Generate& g) {
  if (ids.empty()) return invalid_request("input", "'" + where + "' must not be empty");
  for (const auto& t : ids) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
      return invalid_request("input", "'" + where + "' must hold token ids (integers >= 0)");
    g.mutable_tokens()->add_ids(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

std::string base64_of(const std::vector<float>& v) {
  // Little-endian float32, as OpenAI's base64 embeddings (this machine's order).
  return to_base64(
      std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

}  // namespace

std::optional<api_error> parse_embeddings(const ojson& body, const std::string& served,
                                          embeddings_call& out) {
  if (!body.is_object()) return invalid_request("", "the request body must be a JSON object");
  out = embeddings_call{};
  if (auto e = check_model(body, served)) return e;
  if (auto it = body.find("encoding_format"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "float" && *it != "base64"))
      return invalid_request("encoding_format", "'encoding_format' must be float or base64");
    out.base64 = *it == "base64";
  }
  if (auto it = body.find("dimensions"); it != body.end() && !it->is_null())
    return invalid_request("dimensions",
                           "'dimensions' is not supported: troupe returns the model's whole "
                           "hidden size (leave it out)");
  const auto input = body.find("input");
  const std::string shapes =
      "'input' must be a string, a list of strings, a list of token ids or a list of lists of "
      "token ids";
  if (input == body.end() || input->is_null()) return invalid_request("input", shapes);
  auto add = [&]() -> wire::Generate& {
    auto& g = out.generates.emplace_back();
    g.set_embedding(true);
    g.set_stream(false);
    return g;
  };
  if (input->is_string()) {
    if (input->get<std::string>().empty())
      return invalid_request("input", "'input' must not be an empty string");
    add().set_text(input->get<std::string>());
    return std::nullopt;
  }
  if (!input->is_array() || input->empty())
    return invalid_request("input", shapes + " (not empty)");
  if (input->size() > k_max_embedding_inputs)
    return invalid_request(
        "input", "'input' may hold at most " + std::to_string(k_max_embedding_inputs) + " items");
  if ((*input)[0].is_number())  // one prompt of token ids
    return token_prompt(*input, "input", add());
  const bool strings = (*input)[0].is_string();  // one shape for the whole list, as OpenAI's
  for (size_t i = 0; i < input->size(); ++i) {
    const auto& item = (*input)[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (item.is_string() != strings)
      return invalid_request("input", "'" + where +
                                          "': a list of strings or a list of token-id lists, "
                                          "not both");
    if (item.is_string()) {
      if (item.get<std::string>().empty())
        return invalid_request("input", "'" + where + "' must not be an empty string");
      add().set_text(item.get<std::string>());
    } else if (item.is_array()) {
      if (auto e = token_prompt(item, where, add())) return e;
    } else {
      return invalid_request("input", shapes);
    }
  }
  return std::nullopt;
}

nlohmann::json embeddings_response(const embeddings_call& c, const std::string& model,
                                   const std::vector<std::vector<float>>& vectors,
                                   uint64_t prompt_tokens) {
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = 0; i < vectors.size(); ++i)
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", c.base64 ? nlohmann::json(base64_of(vectors[i]))
                                           : nlohmann::json(vectors[i])}});
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace troupe::openai
