// The gateway's path for one client frame (actors/gateway.cpp), without
// CAF or a socket: wire::ClientMessage::ParseFromArray; for a frame it
// refuses, invalid_utf8_field and peek_generate_id (actors/wire_checks);
// for a Generate, the request actor's checks (check_generate,
// actors/generate_check) against two in-memory models: a SentencePiece
// vocabulary with the llama-2 chat template and a GPT-2 byte-level one with
// ChatML.  check_generate reports a bad request as a rejection, never by
// exception: anything escaping is a finding.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "actors/generate_check.hpp"
#include "actors/wire_checks.hpp"
#include "messages/client.pb.h"
#include "runtime/text/unicode.hpp"

namespace {

std::unique_ptr<troupe::tokenizer> spm, bpe;

const char* const k_llama2_template =
    "{% if messages[0]['role'] == 'system' %}{{ '<<SYS>>\\n' + messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' }}{% endif %}{% for message in messages %}{% if message['role'] == "
    "'user' %}{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}";
const char* const k_chatml_template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// SentencePiece: <unk> <s> </s>, the 256 byte pieces, a few scored pieces.
troupe::vocab_data spm_vocab() {
  troupe::vocab_data v;
  v.model = "llama";
  v.pre = "default";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.kinds = {troupe::token_kind::unknown, troupe::token_kind::control, troupe::token_kind::control};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.tokens.push_back(name);
    v.kinds.push_back(troupe::token_kind::byte);
  }
  const char* pieces[] = {"\xE2\x96\x81",
                          "\xE2\x96\x81t",
                          "\xE2\x96\x81th",
                          "\xE2\x96\x81the",
                          "e",
                          "h",
                          "t",
                          "o",
                          "n",
                          "ce",
                          "\xE2\x96\x81O",
                          "\xE2\x96\x81Once",
                          "[",
                          "]",
                          "INST",
                          "<<",
                          "SYS",
                          ">>",
                          "\xC3\xA9",
                          "\xE2\x96\x81up"};
  for (const char* p : pieces) {
    v.tokens.push_back(p);
    v.kinds.push_back(troupe::token_kind::normal);
  }
  v.scores.resize(v.tokens.size());
  for (size_t i = 0; i < v.scores.size(); ++i) v.scores[i] = -static_cast<float>(i % 97);
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_space_prefix = true;
  return v;
}

// GPT-2 byte-level BPE: the 256 byte characters, a few merges, ChatML's
// control tokens.
troupe::vocab_data bpe_vocab() {
  troupe::vocab_data v;
  v.model = "gpt2";
  v.pre = "smollm";
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    v.tokens.push_back(troupe::unicode::to_utf8(printable ? b : next++));
  }
  v.merges = {"\xC4\xA0 t", "h e", "\xC4\xA0t he", "i n", "o n", "\xC4\xA0 a", "e r", "1 2"};
  for (const auto& m : v.merges) {
    const size_t sep = m.find(' ');
    v.tokens.push_back(m.substr(0, sep) + m.substr(sep + 1));
  }
  v.kinds.assign(v.tokens.size(), troupe::token_kind::normal);
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(special);
    v.kinds.push_back(troupe::token_kind::control);
  }
  v.eos = static_cast<int32_t>(v.tokens.size()) - 3;
  return v;
}

void check(const troupe::wire::Generate& g, const troupe::tokenizer& tok, const char* chat) {
  troupe::generate_limits limits;
  limits.tok = &tok;
  limits.chat_template = chat;
  limits.add_bos = tok.add_bos();
  limits.max_len = 512;
  limits.default_max_tokens = 64;
  troupe::generate_plan plan;
  if (const auto bad = troupe::check_generate(g, limits, plan)) {
    if (bad->message.empty()) std::abort();
    return;
  }
  // What is accepted fits the context and names tokens of the vocabulary.
  if (plan.prompt.empty() || plan.max_tokens <= 0 ||
      plan.prompt.size() + static_cast<size_t>(plan.max_tokens) > size_t{512})
    std::abort();
  for (const int32_t t : plan.prompt)
    if (t < 0 || t >= tok.n_vocab()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every frame whose text is not UTF-8; the gateway silences it too.
  google::protobuf::SetLogHandler(nullptr);
  spm = troupe::tokenizer::create(spm_vocab());
  bpe = troupe::tokenizer::create(bpe_vocab());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)troupe::peek_generate_id(data, size);  // the gateway's path for a frame too large
  troupe::wire::ClientMessage msg;
  if (!msg.ParseFromArray(data, static_cast<int>(size))) {
    if (const auto bad = troupe::invalid_utf8_field(data, size))
      if (bad->field.empty()) std::abort();
    return 0;
  }
  if (msg.body_case() != troupe::wire::ClientMessage::kGenerate) return 0;
  check(msg.generate(), *spm, k_llama2_template);
  check(msg.generate(), *bpe, k_chatml_template);
  return 0;
}
