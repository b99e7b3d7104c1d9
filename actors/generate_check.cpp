#include "actors/generate_check.hpp"

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>

#include "runtime/common/json_depth.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/json_schema_regex.hpp"
#include "runtime/text/regex_dfa.hpp"

namespace troupe {

namespace {

// `text` as tokens with each image marker replaced by `rows` placeholder
// tokens (their rows come from the encoder), the spans in `spans`.  The
// text between markers is tokenized piece by piece, as llama.cpp's mtmd
// does, the BOS (where the model wants one) before the first only.
// "" or why the markers do not fit the images.
std::string encode_with_images(const tokenizer& tok, std::string_view text, bool add_bos,
                               bool special, int n_images, int32_t rows,
                               std::vector<int32_t>& prompt, std::vector<prompt_embeds>& spans) {
  std::vector<std::string_view> pieces;
  for (size_t at = 0;;) {
    const size_t m = text.find(k_media_marker, at);
    pieces.push_back(text.substr(at, m == std::string_view::npos ? m : m - at));
    if (m == std::string_view::npos) break;
    at = m + k_media_marker.size();
  }
  const int markers = static_cast<int>(pieces.size()) - 1;
  if (markers != n_images)
    return std::to_string(n_images) + " images but " + std::to_string(markers) + " '" +
           std::string(k_media_marker) + "' markers in the prompt (one marks each image's place)";
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) {
      spans.push_back({static_cast<int32_t>(prompt.size()), rows, {}});
      // Any token of the vocabulary: the rows' input is the image's.
      prompt.insert(prompt.end(), static_cast<size_t>(rows), 0);
    }
    const auto t = tok.encode(std::string(pieces[i]), add_bos && i == 0, special);
    prompt.insert(prompt.end(), t.begin(), t.end());
  }
  return {};
}

}  // namespace

std::optional<generate_rejection> check_generate(const wire::Generate& g,
                                                 const generate_limits& ctx, generate_plan& plan) {
  auto invalid = [](std::string m) {
    return generate_rejection{wire::INVALID_ARGUMENT, std::move(m)};
  };
  // proto3 keeps an enum value it does not know: say so, not serve it as online.
  if (!wire::RequestClass_IsValid(g.request_class()))
    return invalid("request_class " + std::to_string(g.request_class()) +
                   " is not ONLINE (0) or OFFLINE (1)");
  const int n_images = g.images_size();
  if (n_images > 0) {
    if (ctx.image_rows <= 0)
      return invalid("this server takes no images: it runs without a vision encoder (--mmproj)");
    if (n_images > k_max_images)
      return invalid(std::to_string(n_images) + " images: at most " + std::to_string(k_max_images) +
                     " per request");
    if (g.prompt_case() == wire::Generate::kTokens)
      return invalid("images go with a text or chat prompt (marked by '" +
                     std::string(k_media_marker) + "'), not with token ids");
    if (g.embedding()) return invalid("embedding requests take no images");
  }
  std::vector<int32_t> prompt;
  // Text (raw or rendered chat) to tokens, images in their places.
  auto encode = [&](const std::string& text, bool add_bos,
                    bool special) -> std::optional<generate_rejection> {
    if (n_images == 0) {
      prompt = ctx.tok->encode(text, add_bos, special);
      return std::nullopt;
    }
    auto why = encode_with_images(*ctx.tok, text, add_bos, special, n_images, ctx.image_rows,
                                  prompt, plan.images);
    if (!why.empty()) return invalid(why);
    return std::nullopt;
  };
  switch (g.prompt_case()) {
    case wire::Generate::kText:
      if (g.text().empty()) return invalid("empty prompt: text is \"\"");
      if (auto bad = encode(g.text(), ctx.add_bos, false)) return bad;
      break;
    case wire::Generate::kTokens:
      prompt.assign(g.tokens().ids().begin(), g.tokens().ids().end());
      for (int32_t t : prompt)
        if (t < 0 || t >= ctx.tok->n_vocab())
          return invalid("prompt token " + std::to_string(t) + " is outside the vocabulary of " +
                         std::to_string(ctx.tok->n_vocab()));
      break;
    case wire::Generate::kChat: {
      if (ctx.chat_template.empty()) return invalid("chat prompt: the model has no chat template");
      if (g.chat().messages().empty()) return invalid("empty prompt: chat has no messages");
      std::vector<chat_message> msgs;
      for (const auto& m : g.chat().messages()) msgs.push_back({m.role(), m.content()});
      chat_prompt chat;
      try {
        chat = render_chat_prompt(std::string(ctx.chat_template), *ctx.tok, msgs, true);
      } catch (const std::exception& e) {
        return invalid(std::string("chat prompt: ") + e.what());
      }
      if (auto bad = encode(chat.text, ctx.add_bos && !chat.carries_bos, true)) return bad;
      break;
    }
    case wire::Generate::PROMPT_NOT_SET:
      return invalid("empty prompt: give text, tokens or chat");
  }
  if (prompt.empty()) return invalid("empty prompt: it encodes to no tokens");

  const auto n_prompt = static_cast<int32_t>(prompt.size());
  const int32_t room = ctx.max_len - n_prompt;
  // An embedding generates nothing after its prompt: the whole context is its.
  if (room < 0 || (room == 0 && !g.embedding()))
    return generate_rejection{wire::CONTEXT_OVERFLOW, "prompt of " + std::to_string(n_prompt) +
                                                          " tokens does not fit the context of " +
                                                          std::to_string(ctx.max_len)};
  int32_t max_tokens = std::min(ctx.default_max_tokens, room);
  if (g.has_max_tokens()) {
    if (g.max_tokens() <= 0)
      return invalid("max_tokens must be positive, got " + std::to_string(g.max_tokens()));
    if (g.max_tokens() > room)
      return generate_rejection{wire::CONTEXT_OVERFLOW,
                                "prompt of " + std::to_string(n_prompt) + " tokens + max_tokens " +
                                    std::to_string(g.max_tokens()) + " exceed the context of " +
                                    std::to_string(ctx.max_len)};
    max_tokens = g.max_tokens();
  }

  sampling_params sp;
  const auto& s = g.sampling();
  if (s.has_temperature()) sp.temperature = s.temperature();
  if (s.has_top_k()) sp.top_k = s.top_k();
  if (s.has_top_p()) sp.top_p = s.top_p();
  if (s.has_min_p()) sp.min_p = s.min_p();
  if (s.has_repetition_penalty()) sp.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) sp.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) sp.frequency_penalty = s.frequency_penalty();
  if (s.has_penalty_last_n()) sp.penalty_last_n = s.penalty_last_n();
  if (s.has_seed()) sp.seed = s.seed();
  if (static_cast<size_t>(s.logit_bias_size()) > k_max_logit_bias)
    return invalid("logit_bias may hold at most " + std::to_string(k_max_logit_bias) +
                   " tokens, got " + std::to_string(s.logit_bias_size()));
  for (const auto& [token, bias] : s.logit_bias()) {
    if (token < 0 || token >= ctx.tok->n_vocab())
      return invalid("logit_bias: token " + std::to_string(token) + " is outside the vocabulary");
    sp.logit_bias.push_back({token, bias});
  }
  // A map's order is unspecified: sorted, the same request is the same params.
  std::sort(sp.logit_bias.begin(), sp.logit_bias.end(),
            [](const token_bias& a, const token_bias& b) { return a.token < b.token; });
  if (g.logprobs() < 0 || g.logprobs() > 20)
    return invalid("logprobs must be in [0, 20], got " + std::to_string(g.logprobs()));
  sp.n_logprobs = g.logprobs();
  sp.logprobs = g.logprobs() > 0;
  if (auto why = validate(sp); !why.empty()) return invalid("sampling: " + why);

  for (const auto& stop : g.stop())
    if (stop.empty()) return invalid("stop strings must not be empty");
  for (int32_t t : g.stop_token_ids())
    if (t < 0 || t >= ctx.tok->n_vocab())
      return invalid("stop token " + std::to_string(t) + " is outside the vocabulary");

  // Structured output as one regular expression (runtime/text/json_schema_regex);
  // it is compiled here too, so a bad one is refused before placement.
  try {
    switch (g.constraint_case()) {
      case wire::Generate::kGuidedRegex:
        // An empty pattern would read as "no constraint" further on.
        if (g.guided_regex().empty())
          return invalid("guided_regex is empty (omit it for unconstrained output)");
        plan.constraint = g.guided_regex();
        break;
      case wire::Generate::kGuidedJson: {
        // Bounded before parsing (json_text_nests_deeper); schema_regex
        // then holds it to its own, smaller depth.
        if (json_text_nests_deeper(g.guided_json(), k_max_schema_text_depth))
          return invalid("guided_json: the schema nests more than " +
                         std::to_string(k_max_schema_text_depth) + " levels deep");
        auto schema = nlohmann::ordered_json::parse(g.guided_json(), nullptr, false);
        if (schema.is_discarded()) return invalid("guided_json: the schema is not JSON");
        plan.constraint = schema_regex(schema);
        break;
      }
      case wire::Generate::kGuidedChoice:
        plan.constraint = choice_regex(std::vector<std::string>(g.guided_choice().choices().begin(),
                                                                g.guided_choice().choices().end()));
        break;
      case wire::Generate::kJsonObject:
        if (g.json_object()) plan.constraint = json_object_regex();
        break;
      case wire::Generate::CONSTRAINT_NOT_SET:
        break;
    }
    if (!plan.constraint.empty()) regex_dfa check(plan.constraint);
  } catch (const std::exception& e) {
    return invalid(std::string("output constraint: ") + e.what());
  }

  plan.prompt = std::move(prompt);
  plan.sampling = sp;
  plan.max_tokens = max_tokens;
  plan.stop_tokens.assign(g.stop_token_ids().begin(), g.stop_token_ids().end());
  plan.ignore_eos = g.ignore_eos();
  plan.cls = g.request_class() == wire::OFFLINE ? seq_class::offline : seq_class::online;
  const bool online = plan.cls == seq_class::online;
  plan.slo_ttft_ms =
      g.slo_ttft_ms() > 0 ? g.slo_ttft_ms() : (online ? ctx.online_ttft_ms : ctx.offline_ttft_ms);
  plan.slo_tpot_ms =
      g.slo_tpot_ms() > 0 ? g.slo_tpot_ms() : (online ? ctx.online_tpot_ms : ctx.offline_tpot_ms);
  plan.ttft_target_ms = plan.slo_ttft_ms;
  if (g.prompt_class().size() > k_max_prompt_class)
    return invalid("prompt_class: at most " + std::to_string(k_max_prompt_class) + " bytes, got " +
                   std::to_string(g.prompt_class().size()));
  plan.prompt_class = g.prompt_class();
  if (g.has_draft_tokens()) {
    if (g.draft_tokens() < 0 || g.draft_tokens() > k_max_draft_tokens)
      return invalid("draft_tokens must be 0.." + std::to_string(k_max_draft_tokens) + ", got " +
                     std::to_string(g.draft_tokens()));
    plan.draft_tokens = g.draft_tokens();
  }
  plan.stream = !g.has_stream() || g.stream();
  plan.stops.assign(g.stop().begin(), g.stop().end());
  if (g.embedding()) {
    // Nothing is generated: what shapes a generation is refused by name.
    std::vector<const google::protobuf::FieldDescriptor*> sampling;
    g.sampling().GetReflection()->ListFields(g.sampling(), &sampling);
    if (!sampling.empty())
      return invalid("embedding: sampling." + sampling.front()->name() +
                     " does not apply (nothing is generated)");
    const std::pair<bool, const char*> unused[] = {
        {g.has_max_tokens(), "max_tokens"},
        {g.stop_size() > 0, "stop"},
        {g.stop_token_ids_size() > 0, "stop_token_ids"},
        {g.ignore_eos(), "ignore_eos"},
        {g.logprobs() > 0, "logprobs"},
        {g.constraint_case() != wire::Generate::CONSTRAINT_NOT_SET, "an output constraint"},
        {g.has_draft_tokens(), "draft_tokens"}};
    for (const auto& [set, name] : unused)
      if (set)
        return invalid(std::string("embedding: ") + name +
                       " does not apply (nothing is generated)");
    plan.embed = true;
    plan.max_tokens = 1;
  }
  return std::nullopt;
}

}  // namespace troupe
