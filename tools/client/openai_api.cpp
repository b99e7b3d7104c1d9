#include "tools/client/openai_api.hpp"

#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "runtime/common/base64.hpp"
#include "runtime/common/json_depth.hpp"
#include "runtime/common/media_marker.hpp"
#include "tools/client/openai_tools.hpp"

namespace troupe::openai {

namespace {

using json = nlohmann::json;
using in_json = nlohmann::ordered_json;  // request bodies: keys in their order

const char* const k_token_prompt_rule =
    "a token prompt must hold token ids only (integers in [0, 2147483647])";

// A number field in [lo, hi] (absent: nullopt, no error).
std::optional<api_error> number(const in_json& body, const char* key, double lo, double hi,
                                std::optional<double>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number())
    return invalid_request(key, std::string("'") + key + "' must be a number, got " + it->dump());
  const double x = it->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    return invalid_request(key, std::string("'") + key + "' must be in [" + json(lo).dump() + ", " +
                                    json(hi).dump() + "], got " + it->dump());
  out = x;
  return std::nullopt;
}

std::optional<api_error> integer(const in_json& body, const char* key, int64_t lo, int64_t hi,
                                 std::optional<int64_t>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer())
    return invalid_request(key, std::string("'") + key + "' must be an integer, got " + it->dump());
  const int64_t x = it->get<int64_t>();
  if (x < lo || x > hi)
    return invalid_request(key, std::string("'") + key + "' must be in [" + std::to_string(lo) +
                                    ", " + std::to_string(hi) + "], got " + it->dump());
  out = x;
  return std::nullopt;
}

std::optional<api_error> boolean(const in_json& body, const char* key, bool& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean())
    return invalid_request(key,
                           std::string("'") + key + "' must be true or false, got " + it->dump());
  out = it->get<bool>();
  return std::nullopt;
}

// True when `key` of object `o` is the string `want` (value() would throw
// for a key of another type).
bool string_is(const in_json& o, const char* key, const char* want) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() && it->get_ref<const std::string&>() == want;
}

// A chat message's content: a string, or text parts.
// An image part's bytes: from a data URL ("data:image/png;base64,...");
// the server fetches nothing, so other URLs are refused by name.
std::optional<api_error> image_part(const in_json& part, std::string& bytes) {
  const in_json* url = nullptr;
  if (auto it = part.find("image_url"); it != part.end()) {
    if (it->is_string())
      url = &*it;
    else if (it->is_object() && it->contains("url") && (*it)["url"].is_string())
      url = &(*it)["url"];
  }
  if (!url) return invalid_request("messages", "an image_url part needs 'image_url': {'url': ...}");
  const std::string& u = url->get_ref<const std::string&>();
  const auto comma = u.find(',');
  if (u.rfind("data:", 0) != 0 || comma == std::string::npos ||
      u.substr(0, comma).find(";base64") == std::string::npos)
    return invalid_request(
        "messages",
        "image_url: only base64 data URLs (data:image/png;base64,...) are taken; "
        "this server fetches no URLs");
  // Its media type, where it names one, must be an image's.
  std::string type(std::string_view(u).substr(5, comma - 5));
  type = type.substr(0, type.find(';'));
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!type.empty() && type.rfind("image/", 0) != 0)
    return invalid_request("messages",
                           "image_url: the data URL's type is '" + type + "', not an image's");
  // Base64 wrapped in lines (as MIME and Python's encodebytes write it)
  // or spaced: the white space is not part of it.
  std::string_view payload = std::string_view(u).substr(comma + 1);
  std::string unwrapped;
  if (payload.find_first_of(" \t\r\n") != std::string_view::npos) {
    for (char c : payload)
      if (c != ' ' && c != '\t' && c != '\r' && c != '\n') unwrapped += c;
    payload = unwrapped;
  }
  auto decoded = from_base64(payload);
  if (!decoded) return invalid_request("messages", "image_url: the data URL is not valid base64");
  bytes = std::move(*decoded);
  return std::nullopt;
}

// A message's content as text; image parts become the media marker there
// and their bytes go to `images`, in order.
std::optional<api_error> content_text(const in_json& c, std::string& out,
                                      std::vector<std::string>& images) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  const auto bad = [] {
    return invalid_request("messages",
                           "a message's 'content' must be a string or text and image_url parts");
  };
  if (!c.is_array()) return bad();
  for (const auto& part : c) {
    if (!part.is_object()) return bad();
    if (string_is(part, "type", "image_url")) {
      std::string bytes;
      if (auto e = image_part(part, bytes)) return e;
      images.push_back(std::move(bytes));
      out += k_media_marker;
      continue;
    }
    if (!string_is(part, "type", "text") || !part.contains("text") || !part["text"].is_string())
      return bad();
    out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}

json completion_logprobs(const std::vector<wire::TokenLogprob>& lps,
                         const token_text_fn& token_text, size_t offset) {
  json tokens = json::array(), lp = json::array(), top = json::array(), off = json::array();
  for (const auto& t : lps) {
    const std::string s = token_text(t.token());
    tokens.push_back(s);
    lp.push_back(t.logprob());
    json alts = json::object();
    for (const auto& a : t.top()) alts[token_text(a.token())] = a.logprob();
    top.push_back(alts);
    off.push_back(offset);
    offset += s.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
}

json chat_logprobs(const std::vector<wire::TokenLogprob>& lps, const token_text_fn& token_text,
                   int top_n) {
  json content = json::array();
  for (const auto& t : lps) {
    const std::string s = token_text(t.token());
    json alts = json::array();
    for (int i = 0; i < t.top_size() && i < top_n; ++i) {
      const std::string a = token_text(t.top(i).token());
      alts.push_back({{"token", a}, {"logprob", t.top(i).logprob()}, {"bytes", bytes_of(a)}});
    }
    content.push_back(
        {{"token", s}, {"logprob", t.logprob()}, {"bytes", bytes_of(s)}, {"top_logprobs", alts}});
  }
  return {{"content", content}};
}

// Latency targets beyond an hour are no target; the prompt class's length
// is the server's own limit (actors/generate_check's k_max_prompt_class),
// checked here too so the 400 names the field.
constexpr int64_t k_max_slo_ms = 3'600'000;
constexpr size_t k_max_prompt_class_bytes = 128;

// How the request is scheduled: its class (troupe's `request_class`
// online|offline, or OpenAI's `service_tier`, whose "flex" (cheaper,
// slower) is troupe's offline class), its latency targets (`slo_ttft_ms`,
// `slo_tpot_ms`; absent or 0: its class's from the server's config) and
// the class its output length is predicted by (`prompt_class`,
// docs/bench_service.md).  These were ZeroMQ-only; an OpenAI client sends
// them as extra body fields.
std::optional<api_error> scheduling(const in_json& body, wire::Generate& g) {
  std::optional<bool> offline;
  if (auto it = body.find("request_class"); it != body.end() && !it->is_null()) {
    if (!string_is(body, "request_class", "online") && !string_is(body, "request_class", "offline"))
      return invalid_request(
          "request_class", "'request_class' must be \"online\" or \"offline\", got " + it->dump());
    offline = string_is(body, "request_class", "offline");
  }
  if (auto it = body.find("service_tier"); it != body.end() && !it->is_null()) {
    bool known = false;
    for (const char* tier : {"auto", "default", "flex", "scale", "priority"})
      known = known || string_is(body, "service_tier", tier);
    if (!known)
      return invalid_request(
          "service_tier",
          "'service_tier' must be auto, default, flex, scale or priority, got " + it->dump());
    // auto and default state no preference; flex asks for the offline
    // class, scale and priority for the online one.
    if (!string_is(body, "service_tier", "auto") && !string_is(body, "service_tier", "default")) {
      const bool flex = string_is(body, "service_tier", "flex");
      if (offline && *offline != flex)
        return invalid_request("service_tier",
                               "'service_tier' and 'request_class' disagree (flex is the offline "
                               "class, scale and priority the online one; give one of them)");
      offline = flex;
    }
  }
  if (offline) g.set_request_class(*offline ? wire::OFFLINE : wire::ONLINE);
  std::optional<int64_t> ms;
  if (auto e = integer(body, "slo_ttft_ms", 0, k_max_slo_ms, ms)) return e;
  if (ms) g.set_slo_ttft_ms(static_cast<uint32_t>(*ms));
  ms.reset();
  if (auto e = integer(body, "slo_tpot_ms", 0, k_max_slo_ms, ms)) return e;
  if (ms) g.set_slo_tpot_ms(static_cast<uint32_t>(*ms));
  if (auto it = body.find("prompt_class"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || it->get_ref<const std::string&>().size() > k_max_prompt_class_bytes)
      return invalid_request("prompt_class", "'prompt_class' must be a string of at most " +
                                                 std::to_string(k_max_prompt_class_bytes) +
                                                 " bytes");
    g.set_prompt_class(it->get<std::string>());
  }
  return std::nullopt;
}

}  // namespace

api_error invalid_request(const std::string& param, const std::string& message) {
  api_error e;
  e.status = 400;
  e.param = param;
  e.message = message;
  return e;
}

api_error body_too_deep() {
  return invalid_request(
      "", "the request body nests more than " + std::to_string(k_max_body_depth) + " levels deep");
}

json error_body(const api_error& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::optional<api_error> check_model(const in_json& body, const std::string& served) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return invalid_request("model", "'model' must be a string");
  if (it->get<std::string>() == served) return std::nullopt;
  api_error e;
  e.status = 404;
  e.type = "NotFoundError";
  e.param = "model";
  e.code = "model_not_found";
  e.message = "The model '" + it->get<std::string>() + "' does not exist (this server serves '" +
              served + "')";
  return e;
}

std::optional<api_error> parse(const in_json& body, bool chat, const std::string& served, call& out,
                               tool_format tools) {
  if (!body.is_object()) return invalid_request("", "the request body must be a JSON object");
  if (json_nests_deeper(body, k_max_body_depth)) return body_too_deep();
  out = call{};
  out.chat = chat;
  if (auto e = check_model(body, served)) return e;

  // The prompts.
  std::vector<wire::Generate> prompts;
  if (chat) {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty())
      return invalid_request("messages", "'messages' must be a non-empty array of {role, content}");
    // The deprecated function-calling fields would otherwise be dropped
    // without a word, as tools once were.
    for (const char* legacy : {"functions", "function_call"})
      if (auto f = body.find(legacy); f != body.end() && !f->is_null())
        return invalid_request(legacy, std::string("'") + legacy +
                                           "' is OpenAI's deprecated form: use 'tools' and "
                                           "'tool_choice'");
    if (auto e = parse_tools(body, out.tools)) return e;
    out.tools.format = tools;
    std::vector<std::pair<std::string, std::string>> msgs;  // role, content
    std::vector<std::string> images;                        // in the order they are marked
    for (const auto& m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return invalid_request("messages", "each message needs a 'role' string");
      std::string role = m["role"].get<std::string>(), text;
      bool tool_turn = false;  // a tool's result, or an assistant's calls
      if (auto e = tool_message(m, tools, role, text, tool_turn)) return e;
      if (tool_turn) {
        msgs.emplace_back(role, text);
        continue;
      }
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant")
        return invalid_request("messages",
                               "unsupported role '" + role + "' (system, user, assistant, tool)");
      std::string content;
      const size_t images_before = images.size();
      if (auto e = content_text(m.contains("content") ? m["content"] : in_json(nullptr), content,
                                images))
        return e;
      // As OpenAI: a system's or an assistant's words are text.
      if (images.size() != images_before && role != "user")
        return invalid_request(
            "messages", "image_url parts go in 'user' messages only, not in '" + role + "' ones");
      msgs.emplace_back(role, std::move(content));
    }
    if (out.tools.active()) {
      if (auto e = place_tools(out.tools, msgs)) return e;
    }
    wire::Generate g;
    for (const auto& [role, content] : msgs) {
      auto* cm = g.mutable_chat()->add_messages();
      cm->set_role(role);
      cm->set_content(content);
    }
    for (auto& bytes : images) g.add_images(std::move(bytes));
    prompts.push_back(std::move(g));
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return invalid_request("prompt", "'prompt' is required");
    auto add_text = [&](const std::string& s) {
      wire::Generate g;
      g.set_text(s);
      prompts.push_back(std::move(g));
      out.echo_text.push_back(s);
    };
    auto add_ids = [&](const in_json& ids) -> bool {
      wire::Generate g;
      auto* t = g.mutable_tokens();
      for (const auto& x : ids) {
        // Read wide and checked: get<int32_t> would wrap 2^32 + 5 to 5.
        if (!x.is_number_integer()) return false;
        if (x.is_number_unsigned() ? x.get<uint64_t>() > uint64_t(INT32_MAX)
                                   : x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
          return false;
        t->add_ids(static_cast<int32_t>(x.get<int64_t>()));
      }
      prompts.push_back(std::move(g));
      out.echo_text.emplace_back();
      return true;
    };
    if (it->is_string()) {
      add_text(it->get<std::string>());
    } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
      if (!add_ids(*it)) return invalid_request("prompt", k_token_prompt_rule);
    } else if (it->is_array() && !it->empty()) {
      for (const auto& p : *it) {
        if (p.is_string())
          add_text(p.get<std::string>());
        else if (p.is_array() && !add_ids(p))
          return invalid_request("prompt", k_token_prompt_rule);
        else if (!p.is_string() && !p.is_array())
          return invalid_request("prompt",
                                 "'prompt' must be a string, strings, token ids, or lists of them");
      }
    } else {
      return invalid_request("prompt",
                             "'prompt' must be a string, strings, token ids, or lists of them");
    }
    if (prompts.size() > 64) return invalid_request("prompt", "at most 64 prompts in one request");
  }

  // The sampling and the rest.
  wire::Generate base;
  auto* s = base.mutable_sampling();
  std::optional<double> x;
  std::optional<int64_t> i;
  if (auto e = integer(body, "max_tokens", 1, 1 << 20, i)) return e;
  if (i) base.set_max_tokens(static_cast<int32_t>(*i));
  i.reset();
  if (auto e = integer(body, "max_completion_tokens", 1, 1 << 20, i)) return e;
  if (i) base.set_max_tokens(static_cast<int32_t>(*i));
  i.reset();
  // troupe's extension: speculative decoding's draft length for this request.
  if (auto e = integer(body, "draft_tokens", 0, 16, i)) return e;
  if (i) base.set_draft_tokens(static_cast<int32_t>(*i));
  if (auto e = scheduling(body, base)) return e;
  if (auto e = number(body, "temperature", 0, 2, x)) return e;
  if (x) s->set_temperature(static_cast<float>(*x));
  x.reset();
  if (auto e = number(body, "top_p", 1e-9, 1, x)) return e;
  if (x) s->set_top_p(static_cast<float>(*x));
  x.reset();
  if (auto e = number(body, "min_p", 0, 1, x)) return e;
  if (x) s->set_min_p(static_cast<float>(*x));
  x.reset();
  if (auto e = number(body, "presence_penalty", -2, 2, x)) return e;
  if (x) s->set_presence_penalty(static_cast<float>(*x));
  x.reset();
  if (auto e = number(body, "frequency_penalty", -2, 2, x)) return e;
  if (x) s->set_frequency_penalty(static_cast<float>(*x));
  x.reset();
  if (auto e = number(body, "repetition_penalty", 1e-9, 10, x)) return e;
  if (x) s->set_repetition_penalty(static_cast<float>(*x));
  i.reset();
  if (auto e = integer(body, "top_k", -1, 1 << 20, i)) return e;
  if (i && *i > 0) s->set_top_k(static_cast<int32_t>(*i));
  i.reset();
  std::optional<uint64_t> seed;
  if (auto e = integer(body, "seed", 0, INT64_MAX, i)) return e;
  if (i) seed = static_cast<uint64_t>(*i);
  i.reset();
  if (auto e = integer(body, "n", 1, 16, i)) return e;
  out.n = i ? static_cast<int>(*i) : 1;
  // Refused rather than ignored (issue 34): a client asking for them would
  // silently get something else.
  i.reset();
  if (auto e = integer(body, "best_of", 1, 16, i)) return e;
  if (i && *i != out.n)
    return invalid_request(
        "best_of",
        "'best_of' other than 'n' is not supported (every sample is returned: ask for n)");
  // {"token id": bias}: the ids are checked against the vocabulary where
  // the request is checked (actors/generate_check), the biases here.
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || it->size() > 1024)
      return invalid_request("logit_bias",
                             "'logit_bias' must be an object of at most 1024 token ids (as "
                             "strings) mapping to biases in [-100, 100]");
    auto& bias = *base.mutable_sampling()->mutable_logit_bias();
    for (const auto& [key, value] : it->items()) {
      int64_t id = -1;
      auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0 ||
          id > INT32_MAX)
        return invalid_request("logit_bias",
                               "'logit_bias' keys must be token ids, got '" + key + "'");
      if (!value.is_number() || !std::isfinite(value.get<double>()) ||
          std::fabs(value.get<double>()) > 100.0)
        return invalid_request(
            "logit_bias", "'logit_bias' values must be numbers in [-100, 100] (token " + key + ")");
      if (bias.count(static_cast<int32_t>(id)))  // "5" and "05": which would win?
        return invalid_request("logit_bias",
                               "'logit_bias' names token " + std::to_string(id) + " twice");
      bias[static_cast<int32_t>(id)] = value.get<float>();
    }
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string() && !it->get<std::string>().empty()) {
      base.add_stop(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 16) {
      for (const auto& st : *it) {
        if (!st.is_string() || st.get<std::string>().empty())
          return invalid_request("stop", "'stop' must be a non-empty string or up to 16 of them");
        base.add_stop(st.get<std::string>());
      }
    } else {
      return invalid_request("stop", "'stop' must be a non-empty string or up to 16 of them");
    }
  }
  bool ignore_eos = false;
  if (auto e = boolean(body, "ignore_eos", ignore_eos)) return e;
  base.set_ignore_eos(ignore_eos);
  if (auto e = boolean(body, "stream", out.stream)) return e;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return invalid_request("stream_options",
                             "'stream_options' must be an object, got " + it->dump());
    if (auto e = boolean(*it, "include_usage", out.include_usage)) return e;
  }
  if (chat) {
    if (auto e = boolean(body, "logprobs", out.logprobs)) return e;
    i.reset();
    if (auto e = integer(body, "top_logprobs", 0, 20, i)) return e;
    out.top_logprobs = i ? static_cast<int>(*i) : 0;
    if (out.top_logprobs > 0 && !out.logprobs)
      return invalid_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  } else {
    i.reset();
    if (auto e = integer(body, "logprobs", 0, 20, i)) return e;
    out.logprobs = i.has_value();
    out.top_logprobs = i ? static_cast<int>(*i) : 0;
    if (auto e = boolean(body, "echo", out.echo)) return e;
  }
  // Structured output: OpenAI's response_format, or vLLM's guided_* extras;
  // one of them (two would each constrain the output, and one would lose).
  {
    int constraints = 0;
    for (const char* key : {"guided_choice", "guided_regex", "guided_json"})
      if (auto it = body.find(key); it != body.end() && !it->is_null()) ++constraints;
    if (auto it = body.find("response_format"); it != body.end() && it->is_object() &&
                                                it->contains("type") && (*it)["type"].is_string() &&
                                                (*it)["type"] != "text")
      ++constraints;
    if (constraints > 1)
      return invalid_request(
          "response_format",
          "give one of response_format, guided_json, guided_regex, guided_choice");
  }
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    std::string type;  // stays "" (refused below) when absent or not a string
    if (it->is_object())
      if (const auto t = it->find("type"); t != it->end() && t->is_string())
        type = t->get<std::string>();
    if (type == "json_object") {
      base.set_json_object(true);
    } else if (type == "json_schema") {
      const in_json js = it->value("json_schema", in_json::object());
      if (!js.is_object() || !js.contains("schema") || !js["schema"].is_object())
        return invalid_request("response_format",
                               "json_schema needs {\"json_schema\": {\"schema\": {...}}}");
      base.set_guided_json(js["schema"].dump());
    } else if (type != "text") {
      return invalid_request("response_format",
                             "'response_format' type must be text, json_object or json_schema");
    }
  }
  if (auto it = body.find("guided_choice"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || it->empty())
      return invalid_request("guided_choice",
                             "'guided_choice' must be a non-empty list of strings");
    auto* list = base.mutable_guided_choice();
    for (const auto& x : *it) {
      if (!x.is_string() || x.get<std::string>().empty())
        return invalid_request("guided_choice",
                               "'guided_choice' must be a non-empty list of strings");
      list->add_choices(x.get<std::string>());
    }
  }
  if (auto it = body.find("guided_regex"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || it->get_ref<const std::string&>().empty())
      return invalid_request(
          "guided_regex",
          "'guided_regex' must be a non-empty string (omit it for unconstrained output)");
    base.set_guided_regex(it->get<std::string>());
  }
  if (auto it = body.find("guided_json"); it != body.end() && !it->is_null()) {
    if (it->is_string())
      base.set_guided_json(it->get<std::string>());
    else if (it->is_object())
      base.set_guided_json(it->dump());
    else
      return invalid_request("guided_json",
                             "'guided_json' must be a JSON schema (an object or its text)");
  }
  // A forced tool choice is a constraint on the output: the call's JSON.
  if (out.tools.forced()) {
    if (base.constraint_case() != wire::Generate::CONSTRAINT_NOT_SET)
      return invalid_request(
          "tool_choice",
          "a required or named 'tool_choice' cannot be combined with response_format or "
          "guided_* (both constrain the output)");
    base.set_guided_json(forced_schema(out.tools));
  }
  // The wire asks for "each token's logprob and the top n" with n > 0.
  if (out.logprobs) base.set_logprobs(std::max(1, out.top_logprobs));

  // One Generate per prompt and sample; samples of one prompt differ by
  // seed (seed, seed + 1, ...: reproducible when a seed is given).
  std::random_device rd;
  uint64_t id = 1;
  for (const auto& p : prompts)
    for (int k = 0; k < out.n; ++k) {
      wire::Generate g = base;
      g.MergeFrom(p);
      g.set_request_id(id++);
      if (seed)
        g.mutable_sampling()->set_seed(*seed + static_cast<uint64_t>(k));
      else if (out.n > 1)
        g.mutable_sampling()->set_seed((uint64_t(rd()) << 32) | rd());
      out.generates.push_back(std::move(g));
    }
  return std::nullopt;
}

api_error from_wire(const wire::Error& e) {
  api_error out;
  out.message = e.message();
  out.code = wire::ErrorCode_Name(e.code());
  switch (e.code()) {
    case wire::INVALID_ARGUMENT:
    case wire::CONTEXT_OVERFLOW:
    case wire::FRAME_TOO_LARGE:
    case wire::MALFORMED:
      out.status = 400;
      break;
    case wire::OVERLOADED:
      out.status = 429;
      out.type = "rate_limit_error";
      break;
    case wire::SHUTTING_DOWN:
    case wire::UNAVAILABLE:
      out.status = 503;
      out.type = "service_unavailable";
      break;
    default:
      out.status = 500;
      out.type = "server_error";
  }
  return out;
}

std::optional<std::string> finish_reason(wire::FinishReason r) {
  switch (r) {
    case wire::STOP:
    case wire::EOS:
      return "stop";
    case wire::LENGTH:
      return "length";
    default:
      return std::nullopt;
  }
}

json response(const call& c, const std::string& id, const std::string& model, int64_t created,
              const std::vector<choice>& choices, const token_text_fn& token_text) {
  json out_choices = json::array();
  uint64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& ch = choices[i];
    if (i % size_t(c.n) == 0) prompt += ch.prompt_tokens;
    completion += ch.completion_tokens;
    json one = {{"index", i}, {"finish_reason", c.chat ? chat_finish(c, ch) : ch.finish}};
    if (c.chat) {
      one["message"] = {{"role", "assistant"}, {"content", ch.text}};
      if (c.tools.active()) {
        const auto reply = parse_reply(ch.text, c.tools);
        one["message"]["content"] = reply.content ? json(*reply.content) : json(nullptr);
        if (!reply.calls.empty())
          one["message"]["tool_calls"] = tool_calls_json(reply.calls, false);
      }
      one["logprobs"] =
          c.logprobs ? chat_logprobs(ch.logprobs, token_text, c.top_logprobs) : json(nullptr);
    } else {
      const std::string head = c.echo ? c.echo_text[i / size_t(c.n)] : "";
      one["text"] = head + ch.text;
      one["logprobs"] =
          c.logprobs ? completion_logprobs(ch.logprobs, token_text, head.size()) : json(nullptr);
    }
    out_choices.push_back(std::move(one));
  }
  return {{"id", id},
          {"object", c.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", out_choices},
          {"usage",
           {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}}}};
}

json stream_chunk(const call& c, const std::string& id, const std::string& model, int64_t created,
                  size_t index, const std::string& text,
                  const std::vector<wire::TokenLogprob>& logprobs,
                  const std::optional<std::string>& finish, bool first,
                  const token_text_fn& token_text) {
  json one = {{"index", index}, {"finish_reason", finish ? json(*finish) : json(nullptr)}};
  if (c.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (!finish && !first)) delta["content"] = text;
    one["delta"] = delta;
    one["logprobs"] = c.logprobs && !logprobs.empty()
                          ? chat_logprobs(logprobs, token_text, c.top_logprobs)
                          : json(nullptr);
  } else {
    one["text"] = text;
    one["logprobs"] = c.logprobs && !logprobs.empty() ? completion_logprobs(logprobs, token_text, 0)
                                                      : json(nullptr);
  }
  return {{"id", id},
          {"object", c.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({one})}};
}

std::string chat_finish(const call& c, const choice& ch) {
  if (c.tools.active() && ch.finish == "stop" && !parse_reply(ch.text, c.tools).calls.empty())
    return "tool_calls";
  return ch.finish;
}

json tool_reply_chunk(const call& c, const std::string& id, const std::string& model,
                      int64_t created, size_t index, const std::string& text) {
  const auto reply = parse_reply(text, c.tools);
  json delta = json::object();
  if (reply.content) delta["content"] = *reply.content;
  if (!reply.calls.empty()) delta["tool_calls"] = tool_calls_json(reply.calls, true);
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", index},
                                    {"finish_reason", nullptr},
                                    {"delta", delta},
                                    {"logprobs", nullptr}}})}};
}

json usage_chunk(const call& c, const std::string& id, const std::string& model, int64_t created,
                 uint64_t prompt_tokens, uint64_t completion_tokens) {
  return {{"id", id},
          {"object", c.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

}  // namespace troupe::openai
