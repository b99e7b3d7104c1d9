#pragma once
// What a serving benchmark sends and when: datasets of requests and arrival
// schedules, all seeded so that two runs (troupe and a peer) see the same
// load.  Definitions follow `vllm bench serve`:
//   - random dataset: input and output lengths uniform in
//     [floor(L * (1 - r)), ceil(L * (1 + r))] for --random-range-ratio r,
//     prompts of token ids (offset + i + j) % span, after an optional shared
//     random prefix of --random-prefix-len tokens;
//   - arrivals: gaps drawn from Gamma(shape = burstiness,
//     scale = 1 / (rate * burstiness)), Poisson when burstiness is 1; an
//     infinite rate sends everything at once; the first request goes at 0.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace troupe::bench {

struct bench_request {
  size_t index = 0;
  std::string prompt_text;             // a text prompt, or
  std::vector<int32_t> prompt_tokens;  // token ids, sent as they are
  int prompt_len = 0;                  // tokens when known (ids), else 0 (the server says)
  int output_len = 0;                  // max_tokens; 0: the server's default
  bool offline = false;                // request class
  // Multi-turn conversations: a later turn goes `think_s` after request
  // `after` (the conversation's previous turn) ended, not on the arrival
  // schedule; -1: a first turn, sent on the schedule.
  long after = -1;
  double think_s = 0;
  int turn = 0;  // 0 for a conversation's first turn (and every other dataset)
};

// Token ids are drawn from [first_id, vocab_size): low ids are often
// special tokens (BOS, EOS, chat markers).
struct token_space {
  int32_t first_id = 256;
  int32_t vocab_size = 32000;
};

struct random_spec {
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0.0;  // [0, 1)
  int prefix_len = 0;
  token_space tokens;
  // Nonzero: other token ids than salt 0's, with the same prompt and
  // output lengths (the seed's), so runs at several rates can send new
  // prompts (no prompt cache answers them) of the same sizes.
  uint64_t content_salt = 0;
};

struct shared_prefix_spec {
  int num_groups = 4;
  int prefix_len = 512;
  int suffix_len = 64;
  int output_len = 128;
  token_space tokens;
};

// Conversations that resend their whole history each turn: a system prompt
// (its own per conversation, or one for all), then user and assistant
// messages of fixed lengths; turn k's prompt is the system prompt and the
// first k user messages with the k - 1 assistant answers between them (the
// dataset's answers, not the model's, so two servers see the same
// prompts).  Like vLLM's multi-turn benchmark with synthetic text.
struct multi_turn_spec {
  int turns = 5;
  int system_len = 256;
  int user_len = 64;
  int answer_len = 64;
  int output_len = 64;
  double think_s = 1.0;
  bool shared_system = false;  // one system prompt for every conversation
  token_space tokens;
};

// All throw std::invalid_argument (bad spec) or std::runtime_error (a file).
std::vector<bench_request> random_dataset(size_t n, const random_spec& spec, uint64_t seed);
std::vector<bench_request> shared_prefix_dataset(size_t n, const shared_prefix_spec& spec,
                                                 uint64_t seed);
// One JSON object per line: "prompt" (a string or an array of token ids) and
// optionally "output_tokens" (or "output_len", "max_tokens").  Lines are
// taken in order and reused cyclically when n exceeds them; default_output
// applies where a line gives no length.
std::vector<bench_request> jsonl_dataset(const std::string& path, size_t n, int default_output);
// ceil(n / turns) conversations, turns in order within each (request
// conversation * turns + turn); the last may be cut short at n.
std::vector<bench_request> multi_turn_dataset(size_t n, const multi_turn_spec& spec, uint64_t seed);

// Marks round(n * fraction) requests, chosen by the seed, offline.
void assign_classes(std::vector<bench_request>& reqs, double offline_fraction, uint64_t seed);

constexpr double infinite_rate = std::numeric_limits<double>::infinity();

// Send offsets in seconds from the start, non-decreasing, first at 0.
std::vector<double> gamma_arrivals(size_t n, double rate, double burstiness, uint64_t seed);
// A day in `period_s`: a Poisson process whose rate follows a cosine from
// `trough * peak_rate` (at 0) up to `peak_rate` (at half the period) and
// back, drawn by thinning; n arrivals (as many periods as they take).
std::vector<double> diurnal_arrivals(size_t n, double peak_rate, double trough, double period_s,
                                     uint64_t seed);
// A trace file: one timestamp in seconds per line (a number, or a JSON object
// with "timestamp"); shifted so the first is 0; must not decrease.
std::vector<double> load_trace(const std::string& path);

// A request trace in the Azure LLM inference trace format (CSV with a
// header naming TIMESTAMP, ContextTokens and GeneratedTokens, any order,
// any case; the 2023 and 2024 releases): the first n rows as requests of
// random token ids of the row's context length and its generated length
// as max_tokens, and their send times (seconds after the first row).
// TIMESTAMP is a number of seconds or a date-time "YYYY-MM-DD
// HH:MM:SS[.fraction][+HH:MM]".  Throws std::runtime_error naming the
// line for what it cannot read.
struct request_trace {
  std::vector<bench_request> requests;
  std::vector<double> send_s;
};
request_trace load_azure_trace(const std::string& path, size_t n, const token_space& tokens,
                               uint64_t seed);

}  // namespace troupe::bench
