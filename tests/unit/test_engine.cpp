// runtime/engine/engine without an actor system: a fake device that carries out
// the engine's commands in order and records every step plan.  Its "model"
// reads the context back from the KV pages it was written to, so a token
// comes out right only when every page the step's table names holds the
// right tokens: prefix caching, preemption (recompute and swap), drafts,
// step overlap, export and import are checked by the outputs alone against
// a reference computed from the tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <variant>

#include "runtime/engine/engine.hpp"
#include "runtime/engine/kv_blob.hpp"

namespace troupe {
namespace {

constexpr int32_t k_vocab = 61;
constexpr int32_t k_page = 4;

// The next token after a context: a hash of every (position, token).  The
// cyclic model instead continues 0, 1, ..., 5, 0, ... from the last token
// (text that repeats itself, so that n-gram drafts are accepted); both read
// the whole context from the pages.
bool cyclic_model = false;

int32_t next_of(const std::vector<int32_t>& ctx) {
  if (cyclic_model) return (ctx.back() + 1) % 6;
  uint64_t h = 7;
  for (size_t i = 0; i < ctx.size(); ++i) h = h * 31 + uint64_t(ctx[i]) * (i + 3);
  return static_cast<int32_t>(h % k_vocab);
}

// What greedy decoding gives for `prompt`, `n` tokens.
std::vector<int32_t> reference(std::vector<int32_t> prompt, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(next_of(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

device_info fake_info(int32_t n_pages) {
  device_info d;
  d.device_name = "fake";
  d.model_fingerprint = "fake-model";
  d.n_vocab = k_vocab;
  d.n_ctx = 512;
  d.n_pages = n_pages;
  d.page_size = k_page;
  // K and V of one layer, one head of one float: what kv_blob expects of
  // this geometry.  The fake keeps the token in both.
  d.kv_bytes_per_page = 2 * k_page * sizeof(int32_t);
  d.n_layers = 1;
  d.n_kv_heads = 1;
  d.head_dim = 1;
  d.kv_dtype = "f32";
  return d;
}

struct seq_out {
  std::vector<int32_t> tokens;
  finish_reason finish = finish_reason::none;
  std::string error;
  int32_t cached = 0;
  int preempted = 0;
  int32_t accepted = 0;
  std::vector<float> embedding;
  // When its first batch and its last came out, counted in the device's
  // emits over all sequences (-1: not yet).
  int first_at = -1, end_at = -1;
};

// Carries out an engine's commands as a device would, in order, and
// answers them one at a time (the device answers in order too).
struct fake_device {
  engine& eng;
  std::vector<int32_t> kv;  // per page slot: the token whose KV it holds (-1: never written)
  std::vector<forward_batch> plans;
  std::map<uint64_t, seq_out> by_key;
  std::deque<std::function<void()>> answers;
  std::vector<int32_t> last_drawn;  // the previous step's draws (placeholders)
  int most_in_flight = 0;
  int emits = 0;  // emit commands carried out
  int asked_rounds = 0;
  std::vector<engine_cmd::round_done> rounds;
  bool fail_next_forward = false;
  bool fail_swap_in = false;
  bool fail_swap_out = false;
  // Swap through the KV store: swapped-out KV goes to swap_store (the
  // kv_pool), comes back at swap_fetch (or the fetch fails).
  bool store_swaps = false;
  bool fail_swap_fetch = false;
  std::map<uint64_t, std::vector<uint8_t>> swap_store;
  size_t swap_fetches = 0;
  int32_t nan_at_position = -1;  // logits of a row at this position come back NaN

  explicit fake_device(engine& e) : eng(e), kv(size_t(e.info().n_pages) * k_page, -1) {}

  int32_t& slot(const std::vector<int32_t>& pages, int32_t pos) {
    return kv.at(size_t(pages.at(pos / k_page)) * k_page + pos % k_page);
  }

  forward_result run_forward(forward_batch b) {
    for (const auto& p : b.placeholders) b.tokens[p.row] = last_drawn.at(p.drawn_index);
    forward_result r;
    r.n_vocab = k_vocab;
    std::vector<int32_t> next(b.tokens.size(), -1);
    for (const auto& s : b.seqs) {
      for (int32_t j = 0; j < s.n_rows; ++j) {
        const int32_t row = s.first_row + j;
        const int32_t pos = b.positions[row];
        slot(s.pages, pos) = b.tokens[row];
        std::vector<int32_t> ctx;
        bool garbage = false;
        for (int32_t q = 0; q <= pos; ++q) {
          ctx.push_back(slot(s.pages, q));
          garbage = garbage || ctx.back() < 0;
        }
        // A row that reads an unwritten slot gives a token no reference has.
        next[row] = garbage ? k_vocab - 1 : next_of(ctx);
      }
    }
    for (int32_t row : b.logit_rows) {
      std::vector<float> l(k_vocab, 0.0f);
      l[next.at(row)] = 10.0f;
      if (b.positions[row] == nan_at_position) l.assign(k_vocab, std::nanf(""));
      r.logits.insert(r.logits.end(), l.begin(), l.end());
    }
    // An embedding row's "hidden state": its next token and a 1, so the
    // pooled vector is right only if every row read the right context.
    r.n_embd = 2;
    for (int32_t row : b.hidden_rows) {
      r.hidden.push_back(static_cast<float>(next.at(row)));
      r.hidden.push_back(1.0f);
    }
    last_drawn.clear();
    for (const auto& p : b.presample) last_drawn.push_back(next.at(b.logit_rows.at(p.logit_index)));
    r.drawn = last_drawn;
    return r;
  }

  std::vector<uint8_t> read(const std::vector<int32_t>& pages) {
    std::vector<uint8_t> out;
    for (int32_t p : pages) {
      const auto* b = reinterpret_cast<const uint8_t*>(&kv[size_t(p) * k_page]);
      for (int half = 0; half < 2; ++half) out.insert(out.end(), b, b + k_page * sizeof(int32_t));
    }
    return out;
  }

  void write(const std::vector<int32_t>& pages, const std::vector<uint8_t>& data) {
    const size_t page_bytes = 2 * k_page * sizeof(int32_t);
    ASSERT_GE(data.size(), pages.size() * page_bytes);
    for (size_t i = 0; i < pages.size(); ++i)
      std::memcpy(&kv[size_t(pages[i]) * k_page], data.data() + i * page_bytes,
                  k_page * sizeof(int32_t));
  }

  void carry_out() {
    for (auto& cmd : eng.take_commands()) {
      std::visit(
          [this](auto& c) {
            using T = std::decay_t<decltype(c)>;
            if constexpr (std::is_same_v<T, engine_cmd::forward>) {
              plans.push_back(c.batch);
              const uint64_t id = c.step;
              if (c.dummy) {
                answers.push_back([this] { eng.on_dummy_done(); });
              } else if (std::exchange(fail_next_forward, false)) {
                answers.push_back([this, id] { eng.on_step_failed(id, "injected"); });
              } else {
                auto r = std::make_shared<forward_result>(run_forward(std::move(c.batch)));
                answers.push_back([this, id, r] { eng.on_step_done(id, *r); });
              }
            } else if constexpr (std::is_same_v<T, engine_cmd::copy_pages>) {
              for (size_t i = 0; i < c.src.size(); ++i)
                for (int32_t s = 0; s < k_page; ++s)
                  kv[size_t(c.dst[i]) * k_page + s] = kv[size_t(c.src[i]) * k_page + s];
            } else if constexpr (std::is_same_v<T, engine_cmd::swap_out>) {
              auto data = read(c.pages);
              const uint64_t key = c.key;
              if (fail_swap_out)
                answers.push_back([this, key] { eng.on_swap_out_failed(key, "injected"); });
              else if (store_swaps)
                answers.push_back([this, key, data] {
                  swap_store[key] = data;
                  eng.on_swapped_to_store(key);
                });
              else
                answers.push_back([this, key, data] { eng.on_swapped_out(key, data); });
            } else if constexpr (std::is_same_v<T, engine_cmd::swap_fetch>) {
              const uint64_t key = c.key;
              ++swap_fetches;
              answers.push_back([this, key] {
                auto it = swap_store.find(key);
                if (fail_swap_fetch || it == swap_store.end()) {
                  swap_store.erase(key);
                  return eng.on_swap_fetch_failed(key, "injected");
                }
                auto data = std::move(it->second);
                swap_store.erase(it);
                eng.on_swap_fetched(key, std::move(data));
              });
            } else if constexpr (std::is_same_v<T, engine_cmd::swap_drop>) {
              swap_store.erase(c.key);
            } else if constexpr (std::is_same_v<T, engine_cmd::swap_in>) {
              if (fail_swap_in) {
                const uint64_t key = c.key;
                answers.push_back([this, key] { eng.fail(key, "swap-in: injected"); });
              } else {
                write(c.pages, c.data);
              }
            } else if constexpr (std::is_same_v<T, engine_cmd::export_read>) {
              exported[c.key] = read(c.pages);
            } else if constexpr (std::is_same_v<T, engine_cmd::spill>) {
              // The KV store, as a map: the pages as they are now.
              auto data = read(c.pages);
              const size_t per = eng.info().kv_bytes_per_page;
              auto& into = c.copy_of != 0 ? copies : store;
              for (size_t i = 0; i < c.meta.size(); ++i) {
                const auto& m = c.meta[i];
                into[m.hash] = {eng.kv_space(),
                                m.hash,
                                m.parent,
                                m.depth,
                                m.tokens,
                                std::vector<uint8_t>(data.begin() + long(i * per),
                                                     data.begin() + long((i + 1) * per))};
              }
            } else if constexpr (std::is_same_v<T, engine_cmd::load>) {
              write(c.pages, c.data);
              const auto pages = c.pages;
              answers.push_back([this, pages] { eng.on_loaded(pages); });
            } else if constexpr (std::is_same_v<T, engine_cmd::emit>) {
              auto& o = by_key[c.key];
              if (o.first_at < 0) o.first_at = emits;
              if (c.batch.finish != finish_reason::none) o.end_at = emits;
              ++emits;
              o.tokens.insert(o.tokens.end(), c.batch.tokens.begin(), c.batch.tokens.end());
              o.cached += c.batch.cached_tokens;
              o.accepted += c.batch.accepted;
              EXPECT_EQ(o.finish, finish_reason::none) << "a batch after the last one";
              o.finish = c.batch.finish;
              o.error = c.batch.error;
              o.embedding = c.batch.embedding;
            } else if constexpr (std::is_same_v<T, engine_cmd::preempted>) {
              ++by_key[c.key].preempted;
            } else if constexpr (std::is_same_v<T, engine_cmd::ask_round>) {
              ++asked_rounds;
            } else if constexpr (std::is_same_v<T, engine_cmd::round_done>) {
              rounds.push_back(c);
            }
          },
          cmd);
    }
    most_in_flight = std::max(most_in_flight, static_cast<int>(eng.in_flight()));
  }

  // The oldest outstanding answer goes back to the engine.
  void answer_next() {
    auto a = std::move(answers.front());
    answers.pop_front();
    a();
  }

  // Until nothing is left to answer; `between` runs after each answer.
  void settle(const std::function<void()>& between = {}) {
    carry_out();
    for (int guard = 0; !answers.empty() && guard < 100000; ++guard) {
      answer_next();
      if (between) between();
      carry_out();
    }
    ASSERT_TRUE(answers.empty()) << "the engine never went idle";
  }

  std::map<uint64_t, std::vector<uint8_t>> exported;
  std::map<uint64_t, kv_page> store;   // spilled pages by hash
  std::map<uint64_t, kv_page> copies;  // pages running sequences copied (kv_copy_pages), by hash

  // The store's leading run of the pages `prompt` lacks in the arena.
  // The stored pages `e` would load for the prompt (e: this device's
  // engine unless another one asks).
  std::vector<kv_page> fetch(const std::vector<int32_t>& prompt, bool from_copies = false,
                             const engine* e = nullptr) {
    auto& from = from_copies ? copies : store;
    int32_t cached = 0;
    auto hashes = (e ? *e : eng).prefix_hashes(prompt, cached);
    std::vector<kv_page> out;
    for (size_t i = size_t(cached); i < hashes.size() && from.count(hashes[i]); ++i)
      out.push_back(from[hashes[i]]);
    return out;
  }
};

instance_options options(int32_t max_batch, int32_t chunk,
                         preempt_mode mode = preempt_mode::recompute) {
  instance_options o;
  o.limits.max_batch_tokens = max_batch;
  o.limits.max_seqs = 16;
  o.limits.chunk_size = chunk;
  o.preemption = mode;
  o.step_overlap = false;
  return o;
}

sequence_spec spec(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  sequence_spec r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> prompt_of(int32_t seed, int32_t len) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((seed * 7 + i * 3) % (k_vocab - 1));
  return p;
}

uint64_t enqueue(engine& e, sequence_spec r) {
  uint64_t key = 0;
  int32_t ahead = 0;
  EXPECT_EQ(e.enqueue(std::move(r), key, ahead), "");
  return key;
}

// Every page free or reusable, no sequence left, the invariants hold.
void expect_released(const engine& e) {
  auto s = e.stats();
  EXPECT_EQ(s.kv_check, "");
  EXPECT_EQ(s.kv.allocated, 0);
  EXPECT_EQ(s.kv.sequences, 0);
  EXPECT_EQ(s.waiting + s.running, 0);
}

// Several sequences, enqueued together: each gets what it gets alone, in
// steps that batch them (chunked prefill included).
void check_batched(instance_options o, int32_t n_pages) {
  engine e(fake_info(n_pages), o);
  fake_device dev(e);
  std::map<uint64_t, std::vector<int32_t>> want;
  for (int i = 0; i < 6; ++i) {
    auto p = prompt_of(i + 1, 5 + 7 * i);
    want[enqueue(e, spec(100 + i, p, 12))] = reference(p, 12);
  }
  dev.settle();
  for (const auto& [key, w] : want) {
    EXPECT_EQ(dev.by_key[key].tokens, w) << "key " << key;
    EXPECT_EQ(dev.by_key[key].finish, finish_reason::max_tokens);
  }
  expect_released(e);
  size_t widest = 0;
  for (const auto& b : dev.plans) widest = std::max(widest, b.seqs.size());
  EXPECT_GT(widest, 1u) << "the steps never batched two sequences";
  for (const auto& b : dev.plans)
    EXPECT_LE(static_cast<int32_t>(b.tokens.size()), o.limits.max_batch_tokens);
}

// What the fake device's pooled embedding of `prompt` is: the mean over
// its positions of (the next token after the prefix, 1), L2-normalised.
std::vector<float> reference_embedding(const std::vector<int32_t>& prompt) {
  double a = 0, b = 0;
  for (size_t i = 1; i <= prompt.size(); ++i) {
    a += next_of(std::vector<int32_t>(prompt.begin(), prompt.begin() + long(i)));
    b += 1;
  }
  a /= double(prompt.size());
  b /= double(prompt.size());
  const double n = std::sqrt(a * a + b * b);
  return {float(a / n), float(b / n)};
}

// The KV store's hooks: pages the arena evicts are offered (spill, read
// before anything writes them), and a prompt queued with the store's pages
// has them written into its table at admission: it computes only the rest,
// and its output is right only if every loaded page holds the right tokens.
TEST(Engine, EvictedPrefixPagesComeBackFromTheStore) {
  auto o = options(16, 8);
  o.kv_tiers = true;
  engine e(fake_info(12), o);
  fake_device dev(e);
  const auto a = prompt_of(1, 41), b = prompt_of(2, 41), c = prompt_of(3, 41);
  for (uint64_t id : {1, 2, 3}) {  // three long prompts: the third evicts the first
    const auto& p = id == 1 ? a : id == 2 ? b : c;
    enqueue(e, spec(id, p, 4));
    dev.settle();
  }
  EXPECT_GT(e.stats().spilled_pages, 0u);
  auto pages = dev.fetch(a);
  ASSERT_GE(pages.size(), 2u);
  uint64_t key = 0;
  int32_t ahead = 0;
  ASSERT_EQ(e.enqueue(spec(4, a, 4), key, ahead, pages), "");
  dev.settle();
  EXPECT_EQ(dev.by_key[key].tokens, reference(a, 4));
  // As many as the arena gives, one page left for the chunk after them.
  const uint64_t loaded = e.stats().loaded_pages;
  EXPECT_EQ(loaded, std::min<uint64_t>(pages.size(), 11));
  EXPECT_GE(dev.by_key[key].cached, int32_t(loaded) * k_page);
  expect_released(e);
  // Pages of another prompt, or out of order, are not taken.
  auto wrong = dev.fetch(b);
  std::reverse(wrong.begin(), wrong.end());
  ASSERT_EQ(e.enqueue(spec(5, c, 4), key, ahead, wrong), "");
  dev.settle();
  EXPECT_EQ(dev.by_key[key].tokens, reference(c, 4));
  EXPECT_EQ(e.stats().loaded_pages, loaded);
  expect_released(e);
}

// Recovery from KV copies (issue 39): a sequence that keeps copies hands
// its full pages, kv_copy_pages at a time, to its copy store as they fill,
// prompt and generated tokens alike.  When its instance is lost, another
// engine resumes it from the copies plus the tail: same tokens, the copied
// pages loaded, not computed.
TEST(Engine, KvCopiesLetAnotherEngineResumeTheSequence) {
  engine a(fake_info(32), options(16, 8));
  fake_device da(a);
  const auto p = prompt_of(6, 37);
  auto s = spec(1, p, 30);
  s.kv_copy_pages = 2;
  const uint64_t k = enqueue(a, s);
  da.settle();
  const auto want = reference(p, 30);
  EXPECT_EQ(da.by_key[k].tokens, want);
  // 66 tokens computed (the last one sampled, not computed): their full
  // pages, copied two at a time; no other spill.
  const size_t full = 66 / k_page;
  EXPECT_EQ(a.stats().copied_pages, full - full % 2);
  EXPECT_EQ(da.copies.size(), full - full % 2);
  EXPECT_TRUE(da.store.empty());
  // Lost after 20 tokens: the request resumes elsewhere with what streamed.
  engine b(fake_info(32), options(16, 8));
  fake_device db(b);
  auto r = spec(1, p, 30);
  r.generated.assign(want.begin(), want.begin() + 20);
  std::vector<int32_t> tokens = p;
  tokens.insert(tokens.end(), r.generated.begin(), r.generated.end());
  auto pages = da.fetch(tokens, true, &b);
  // 57 tokens: the full pages before the one holding the last token.
  const size_t mapped = 56 / k_page;
  ASSERT_EQ(pages.size(), mapped);
  uint64_t key = 0;
  int32_t ahead = 0;
  ASSERT_EQ(b.enqueue(r, key, ahead, pages), "");
  db.settle();
  EXPECT_EQ(db.by_key[key].tokens, std::vector<int32_t>(want.begin() + 20, want.end()));
  EXPECT_EQ(b.stats().loaded_pages, mapped);
  // Computed: the tail after the copied pages, then one row per token.
  EXPECT_EQ(b.stats().prefill_tokens + b.stats().decode_tokens, 57u - mapped * k_page + 9);
  // Without copies asked for, nothing is copied.
  engine c(fake_info(32), options(16, 8));
  fake_device dc(c);
  enqueue(c, spec(2, p, 30));
  dc.settle();
  EXPECT_EQ(c.stats().copied_pages, 0u);
  EXPECT_TRUE(dc.copies.empty());
  expect_released(a);
  expect_released(b);
}

// An embedding request pools every row of its prompt, in chunks, beside a
// generating sequence, even where the prefix cache holds its prompt's
// pages (a generation of the same prompt ran first); nothing is sampled.
TEST(Engine, EmbeddingsPoolEveryRowOfThePrompt) {
  engine e(fake_info(64), options(16, 6));
  fake_device dev(e);
  const auto p = prompt_of(4, 23);
  const uint64_t gen = enqueue(e, spec(1, p, 4));
  dev.settle();
  EXPECT_EQ(dev.by_key[gen].tokens, reference(p, 4));
  auto embed_spec = [](uint64_t id, std::vector<int32_t> prompt) {
    auto r = spec(id, std::move(prompt), 1);
    r.embed = true;
    return r;
  };
  const size_t plans_before = dev.plans.size();
  const uint64_t k1 = enqueue(e, embed_spec(2, p));
  const auto q = prompt_of(9, 11);
  const uint64_t k2 = enqueue(e, embed_spec(3, q));
  const uint64_t g2 = enqueue(e, spec(4, prompt_of(5, 7), 6));
  dev.settle();
  for (auto [key, prompt] : {std::pair{k1, p}, std::pair{k2, q}}) {
    const auto want = reference_embedding(prompt);
    ASSERT_EQ(dev.by_key[key].embedding.size(), 2u) << key;
    EXPECT_NEAR(dev.by_key[key].embedding[0], want[0], 1e-6);
    EXPECT_NEAR(dev.by_key[key].embedding[1], want[1], 1e-6);
    EXPECT_EQ(dev.by_key[key].finish, finish_reason::embedded);
    EXPECT_TRUE(dev.by_key[key].tokens.empty());
  }
  EXPECT_EQ(dev.by_key[g2].tokens, reference(prompt_of(5, 7), 6));
  // Every row of both prompts was computed (no cached rows), none sampled.
  size_t hidden = 0, most_rows = 0;
  for (size_t i = plans_before; i < dev.plans.size(); ++i) {
    hidden += dev.plans[i].hidden_rows.size();
    most_rows = std::max(most_rows, dev.plans[i].tokens.size());
  }
  EXPECT_EQ(hidden, p.size() + q.size());
  EXPECT_LE(most_rows, 16u);
  expect_released(e);
}

// Exported mid-prompt (a migration), an embedding leaves no KV behind it:
// the importer computes its prompt afresh and pools the same vector.
TEST(Engine, AnExportedEmbeddingStartsAfreshWhereItGoes) {
  engine a(fake_info(64), options(4, 4));
  fake_device da(a);
  const auto p = prompt_of(6, 19);
  auto r = spec(7, p, 1);
  r.embed = true;
  enqueue(a, r);
  da.carry_out();
  da.answer_next();  // one chunk of 4 rows done
  da.carry_out();
  engine::export_start x;
  ASSERT_EQ(a.begin_export(7, x), "");
  EXPECT_TRUE(x.blob.tokens.empty());
  da.settle();
  expect_released(a);
  engine b(fake_info(64), options(4, 4));
  fake_device db(b);
  uint64_t key = 0;
  int32_t n_kv = -1;
  ASSERT_EQ(b.import(r, encode_kv_blob(x.blob), key, n_kv), "");
  EXPECT_EQ(n_kv, 0);
  db.settle();
  const auto want = reference_embedding(p);
  ASSERT_EQ(db.by_key[key].embedding.size(), 2u);
  EXPECT_NEAR(db.by_key[key].embedding[0], want[0], 1e-6);
  EXPECT_EQ(db.by_key[key].finish, finish_reason::embedded);
  expect_released(b);
}

TEST(Engine, BatchedSequencesGetWhatTheyGetAlone) {
  check_batched(options(32, 8), 64);
}

TEST(Engine, StepOverlapKeepsEveryOutputWithTwoStepsInFlight) {
  auto o = options(32, 8);
  o.step_overlap = true;
  engine e(fake_info(64), o);
  fake_device dev(e);
  auto p = prompt_of(3, 9);
  const uint64_t k = enqueue(e, spec(1, p, 20));
  auto q = prompt_of(5, 6);
  const uint64_t k2 = enqueue(e, spec(2, q, 15));
  dev.settle();
  EXPECT_EQ(dev.by_key[k].tokens, reference(p, 20));
  EXPECT_EQ(dev.by_key[k2].tokens, reference(q, 15));
  EXPECT_EQ(dev.most_in_flight, 2);
  EXPECT_GT(e.stats().overlapped_steps, 0u);
  bool placeholders = false;
  for (const auto& b : dev.plans) placeholders = placeholders || !b.placeholders.empty();
  EXPECT_TRUE(placeholders);
  expect_released(e);
}

TEST(Engine, ASharedPrefixIsComputedOnce) {
  engine e(fake_info(64), options(64, 64));
  fake_device dev(e);
  auto prefix = prompt_of(2, 16);  // four full pages
  auto a = prefix, b = prefix;
  a.push_back(1);
  b.push_back(2);
  const uint64_t ka = enqueue(e, spec(1, a, 4));
  dev.settle();
  const size_t plans_before = dev.plans.size();
  const uint64_t kb = enqueue(e, spec(2, b, 4));
  dev.settle();
  EXPECT_EQ(dev.by_key[ka].tokens, reference(a, 4));
  EXPECT_EQ(dev.by_key[kb].tokens, reference(b, 4));
  EXPECT_EQ(dev.by_key[ka].cached, 0);
  EXPECT_EQ(dev.by_key[kb].cached, 16);
  // b's prefill computed only what was not cached: its first step's rows.
  EXPECT_EQ(dev.plans.at(plans_before).tokens.size(), 1u);
  EXPECT_EQ(e.stats().cached_tokens, 16u);
  expect_released(e);
}

// Too few pages for everyone: preemption, invisible in the outputs.
void check_preemption(preempt_mode mode, bool store_swaps = false, bool fail_fetch = false) {
  engine e(fake_info(14), options(64, 16, mode));
  fake_device dev(e);
  dev.store_swaps = store_swaps;
  dev.fail_swap_fetch = fail_fetch;
  std::map<uint64_t, std::vector<int32_t>> want;
  for (int i = 0; i < 4; ++i) {
    auto p = prompt_of(10 + i, 10);
    want[enqueue(e, spec(i + 1, p, 14))] = reference(p, 14);
  }
  dev.settle();
  int preempted = 0;
  for (const auto& [key, w] : want) {
    EXPECT_EQ(dev.by_key[key].tokens, w) << "key " << key;
    preempted += dev.by_key[key].preempted;
  }
  EXPECT_GT(preempted, 0) << "the pool was large enough: nothing tested";
  auto s = e.stats();
  EXPECT_GT(mode == preempt_mode::swap ? s.preempted_swap : s.preempted_recompute, 0u);
  EXPECT_EQ(s.swap_bytes, 0u);
  if (store_swaps) {
    EXPECT_GT(dev.swap_fetches, 0u) << "nothing was swapped through the store";
    EXPECT_TRUE(dev.swap_store.empty()) << "swapped KV left in the store";
  }
  expect_released(e);
}

TEST(Engine, PreemptionByRecomputeKeepsOutputs) {
  check_preemption(preempt_mode::recompute);
}
TEST(Engine, PreemptionBySwapKeepsOutputs) {
  check_preemption(preempt_mode::swap);
}
// Swap through the KV store (issue 39): the swapped-out KV waits in the
// store, comes back when the arena has room, same outputs; a fetch the
// store fails recomputes, same outputs.
TEST(Engine, PreemptionBySwapThroughTheStoreKeepsOutputs) {
  check_preemption(preempt_mode::swap, true);
  check_preemption(preempt_mode::swap, true, true);
}

TEST(Engine, DraftsAreVerifiedAndKeepEveryOutput) {
  auto o = options(64, 16);
  o.draft_tokens = 4;
  engine e(fake_info(64), o);
  fake_device dev(e);
  // A prompt that repeats itself gives the n-gram proposer drafts; the
  // hash model rejects nearly all of them, the cyclic one accepts them.
  std::vector<int32_t> p;
  for (int i = 0; i < 24; ++i) p.push_back(i % 6);
  const uint64_t k = enqueue(e, spec(1, p, 24));
  dev.settle();
  EXPECT_EQ(dev.by_key[k].tokens, reference(p, 24));
  EXPECT_GT(e.stats().draft_tokens, 0u);
  cyclic_model = true;
  const size_t plans_before = dev.plans.size();
  const uint64_t kc = enqueue(e, spec(2, p, 24));
  dev.settle();
  cyclic_model = false;
  std::vector<int32_t> want;
  for (int i = 0; i < 24; ++i) want.push_back(i % 6);  // the prompt's cycle, continued
  EXPECT_EQ(dev.by_key[kc].tokens, want);
  EXPECT_GE(dev.by_key[kc].accepted, 16) << "drafts of a cycle were not accepted";
  EXPECT_LE(dev.plans.size() - plans_before, 6u) << "accepted drafts saved no steps";
  expect_released(e);
}

TEST(Engine, CancelAtAnyPointReleasesEverything) {
  // Swap with the swapped KV in the store too: a cancel there drops it.
  for (int m = 0; m < 3; ++m) {
    const auto mode = m == 0 ? preempt_mode::recompute : preempt_mode::swap;
    for (int at = 0; at < 12; ++at) {
      engine e(fake_info(14), options(32, 8, mode));
      fake_device dev(e);
      dev.store_swaps = m == 2;
      std::vector<uint64_t> keys;
      for (int i = 0; i < 4; ++i) keys.push_back(enqueue(e, spec(i + 1, prompt_of(i, 11), 10)));
      int answered = 0;
      bool aborted[2] = {false, false};
      dev.settle([&] {
        if (++answered == at) {
          aborted[0] = e.abort(2);
          aborted[1] = e.abort(3);
        }
      });
      for (int i : {1, 2}) {
        const auto& o = dev.by_key[keys[i]];
        if (aborted[i - 1]) {
          EXPECT_EQ(o.finish, finish_reason::aborted) << "at " << at;
          EXPECT_LT(o.tokens.size(), 10u);
        } else {
          EXPECT_EQ(o.tokens, reference(prompt_of(i, 11), 10)) << "at " << at;
        }
      }
      for (int i : {0, 3}) EXPECT_EQ(dev.by_key[keys[i]].tokens, reference(prompt_of(i, 11), 10));
      if (at > 0 && at < 6) {
        EXPECT_TRUE(aborted[0] && aborted[1]) << "at " << at;
      }
      EXPECT_TRUE(dev.swap_store.empty()) << "at " << at;
      expect_released(e);
    }
  }
}

TEST(Engine, RefusesBadRequestsByName) {
  engine e(fake_info(16), options(32, 8));
  uint64_t key = 0;
  int32_t ahead = 0;
  auto refused = [&](sequence_spec r, const std::string& why) {
    auto got = e.enqueue(std::move(r), key, ahead);
    EXPECT_NE(got.find(why), std::string::npos) << got;
  };
  refused(spec(1, {}, 4), "empty prompt");
  refused(spec(1, prompt_of(1, 64), 4), "leaves no room");
  refused(spec(1, {1, k_vocab}, 4), "outside the vocabulary");
  refused(spec(1, {1, -1}, 4), "outside the vocabulary");
  refused(spec(1, {1, 2}, 0), "max_tokens must be positive");
  auto r = spec(1, {1, 2}, 4);
  r.sampling.top_p = 2;
  refused(r, "top_p");
  r = spec(1, {1, 2}, 4);
  r.constraint = "a+";
  refused(r, "cannot apply output constraints");
  EXPECT_EQ(e.enqueue(spec(1, {1, 2}, 4), key, ahead), "");
  refused(spec(1, {3}, 4), "already in use");
}

TEST(Engine, ExportedMidStreamItContinuesIdenticallyElsewhere) {
  engine a(fake_info(64), options(32, 8));
  engine b(fake_info(64), options(32, 8));
  fake_device da(a), db(b);
  auto p = prompt_of(4, 13);
  const uint64_t ka = enqueue(a, spec(7, p, 20));
  int answered = 0;
  std::vector<uint8_t> blob;
  da.settle([&] {
    if (++answered != 4) return;
    engine::export_start x;
    ASSERT_EQ(a.begin_export(7, x), "");
    ASSERT_FALSE(x.pages.empty());
    da.carry_out();
    ASSERT_TRUE(a.end_export(x.key));
    x.blob.pages = da.exported.at(x.key);
    blob = encode_kv_blob(x.blob);
  });
  const auto& first = da.by_key[ka].tokens;
  ASSERT_FALSE(blob.empty());
  ASSERT_LT(first.size(), 20u);
  auto r = spec(7, p, 20);
  r.generated = first;
  uint64_t kb = 0;
  int32_t n_kv = 0;
  ASSERT_EQ(b.import(r, blob, kb, n_kv), "");
  EXPECT_GT(n_kv, 0);
  db.settle();
  auto all = first;
  all.insert(all.end(), db.by_key[kb].tokens.begin(), db.by_key[kb].tokens.end());
  EXPECT_EQ(all, reference(p, 20));
  expect_released(a);
  expect_released(b);
}

TEST(Engine, ABlobThatDoesNotFitIsRefusedByName) {
  engine a(fake_info(64), options(32, 8));
  fake_device da(a);
  auto p = prompt_of(4, 9);
  enqueue(a, spec(7, p, 3));
  da.carry_out();
  da.answer_next();  // the first prefill chunk
  da.carry_out();
  engine::export_start x;
  ASSERT_EQ(a.begin_export(7, x), "");
  da.carry_out();
  a.end_export(x.key);
  ASSERT_EQ(x.blob.tokens.size(), 8u);
  x.blob.pages = da.exported.at(x.key);
  auto info = fake_info(64);
  info.page_size = 8;
  info.kv_bytes_per_page = 2 * 8 * sizeof(int32_t);
  engine other(info, options(32, 8));
  uint64_t key = 0;
  int32_t n_kv = 0;
  auto why = other.import(spec(7, p, 3), encode_kv_blob(x.blob), key, n_kv);
  EXPECT_NE(why.find("does not fit"), std::string::npos) << why;
  auto q = p;
  q[0] = (q[0] + 1) % k_vocab;
  engine same(fake_info(64), options(32, 8));
  why = same.import(spec(7, q, 3), encode_kv_blob(x.blob), key, n_kv);
  EXPECT_NE(why.find("not the start"), std::string::npos) << why;
  why = same.import(spec(7, p, 3), {1, 2, 3}, key, n_kv);
  EXPECT_FALSE(why.empty());
}

TEST(Engine, AFailedStepFailsItsSequencesAndTheRestGoOn) {
  engine e(fake_info(64), options(32, 32));
  fake_device dev(e);
  auto p = prompt_of(1, 6);
  const uint64_t k1 = enqueue(e, spec(1, p, 6));
  dev.fail_next_forward = true;
  dev.carry_out();  // the failing step is on the device
  auto q = prompt_of(2, 7);
  const uint64_t k2 = enqueue(e, spec(2, q, 6));  // waits behind it, then runs
  dev.settle();
  EXPECT_EQ(dev.by_key[k1].finish, finish_reason::error);
  EXPECT_NE(dev.by_key[k1].error.find("forward: injected"), std::string::npos);
  EXPECT_EQ(dev.by_key[k2].tokens, reference(q, 6));
  const uint64_t k3 = enqueue(e, spec(3, p, 6));
  dev.settle();
  EXPECT_EQ(dev.by_key[k3].tokens, reference(p, 6));
  expect_released(e);
}

// An exception in one sequence's bookkeeping (the sampler refusing NaN
// logits) ends that sequence with an error; the others go on untouched.
TEST(Engine, AnExceptionInOneSequenceEndsOnlyThatSequence) {
  engine e(fake_info(64), options(64, 32));
  fake_device dev(e);
  dev.nan_at_position = 9;
  auto hit = prompt_of(1, 6);      // samples at positions 5, 6, ...: 9 among them
  auto spared = prompt_of(2, 12);  // its first sample is at position 11
  const uint64_t kh = enqueue(e, spec(1, hit, 10));
  const uint64_t ks = enqueue(e, spec(2, spared, 10));
  dev.settle();
  EXPECT_EQ(dev.by_key[kh].finish, finish_reason::error);
  EXPECT_NE(dev.by_key[kh].error.find("step result"), std::string::npos) << dev.by_key[kh].error;
  EXPECT_EQ(dev.by_key[kh].tokens, reference(hit, 4)) << "the tokens of positions 5 to 8";
  EXPECT_EQ(dev.by_key[ks].tokens, reference(spared, 10));
  dev.nan_at_position = -1;
  const uint64_t k3 = enqueue(e, spec(3, hit, 10));
  dev.settle();
  EXPECT_EQ(dev.by_key[k3].tokens, reference(hit, 10)) << "the engine serves on";
  expect_released(e);
}

TEST(Engine, AFailedPageWriteFailsThatSequenceOnly) {
  engine e(fake_info(14), options(64, 16, preempt_mode::swap));
  fake_device dev(e);
  dev.fail_swap_in = true;
  std::map<uint64_t, std::vector<int32_t>> want;
  for (int i = 0; i < 4; ++i) {
    auto p = prompt_of(20 + i, 10);
    want[enqueue(e, spec(i + 1, p, 14))] = reference(p, 14);
  }
  dev.settle();
  int failed = 0;
  for (const auto& [key, w] : want) {
    const auto& o = dev.by_key[key];
    if (o.finish == finish_reason::error) {
      ++failed;
      EXPECT_NE(o.error.find("swap-in"), std::string::npos);
    } else {
      EXPECT_EQ(o.tokens, w);
    }
  }
  EXPECT_GT(failed, 0);
  expect_released(e);
}

TEST(Engine, LockstepStepsOnlyInRoundsAndRunsDummySteps) {
  engine e(fake_info(64), options(32, 32));
  fake_device dev(e);
  ASSERT_EQ(e.join_group(), "");
  EXPECT_EQ(e.stats().kv_check, "");
  auto p = prompt_of(1, 5);
  const uint64_t k = enqueue(e, spec(1, p, 3));
  dev.carry_out();
  EXPECT_TRUE(dev.plans.empty()) << "stepped outside a round";
  EXPECT_EQ(dev.asked_rounds, 1);
  for (uint64_t round = 1; round < 10 && dev.by_key[k].finish == finish_reason::none; ++round) {
    const size_t plans = dev.plans.size();
    const int asked = dev.asked_rounds;
    e.on_round(round);
    dev.settle();
    EXPECT_EQ(dev.plans.size(), plans + 1) << "one step per round";
    if (dev.by_key[k].finish == finish_reason::none) {
      EXPECT_EQ(dev.asked_rounds, asked + 1) << "work left: the next round is asked for";
    }
  }
  EXPECT_EQ(dev.by_key[k].tokens, reference(p, 3));
  const size_t before = dev.plans.size();
  e.on_round(100);  // nothing to compute: a one-row dummy step
  dev.settle();
  ASSERT_EQ(dev.plans.size(), before + 1);
  EXPECT_EQ(dev.plans.back().tokens.size(), 1u);
  ASSERT_FALSE(dev.rounds.empty());
  EXPECT_TRUE(dev.rounds.back().dummy);
  EXPECT_EQ(dev.rounds.back().round, 100u);
  e.leave_group();
  expect_released(e);
}

TEST(Engine, LiveLimitsAreCheckedAndTakeEffect) {
  engine e(fake_info(64), options(32, 8));
  int32_t old = 0;
  EXPECT_NE(e.set_limit("page_size", 8, old).find("cannot change live"), std::string::npos);
  EXPECT_NE(e.set_limit("max_seqs", 0, old), "");
  ASSERT_EQ(e.set_limit("max_seqs", 1, old), "");
  EXPECT_EQ(old, 16);
  fake_device dev(e);
  for (int i = 0; i < 3; ++i) enqueue(e, spec(i + 1, prompt_of(i, 5), 4));
  dev.settle();
  for (const auto& b : dev.plans) EXPECT_EQ(b.seqs.size(), 1u);
  std::string was;
  EXPECT_NE(e.set_role("chef", was), "");
  EXPECT_EQ(e.set_role("prefill", was), "");
  EXPECT_EQ(was, "mixed");
  EXPECT_EQ(e.stats().role, "prefill");
}

TEST(Engine, APreemptedSequenceWhoseSwapOutFailsIsRecomputed) {
  engine e(fake_info(64), options(32, 32, preempt_mode::swap));
  fake_device dev(e);
  dev.fail_swap_out = true;
  auto p = prompt_of(3, 9);
  const uint64_t k = enqueue(e, spec(1, p, 12));
  int answered = 0;
  dev.settle([&] {
    if (++answered == 3) {
      EXPECT_EQ(e.preempt_request(1), "");
      EXPECT_NE(e.preempt_request(1).find("not running"), std::string::npos);
    }
  });
  EXPECT_EQ(dev.by_key[k].preempted, 1);
  EXPECT_EQ(dev.by_key[k].tokens, reference(p, 12));
  EXPECT_EQ(e.stats().preempted_swap, 1u);
  EXPECT_NE(e.preempt_request(1).find("no sequence"), std::string::npos);
  expect_released(e);
}

TEST(Engine, ASequenceWithNothingComputedExportsAtOnceAndStartsAfreshElsewhere) {
  engine a(fake_info(64), options(32, 8));
  engine b(fake_info(64), options(32, 8));
  fake_device db(b);
  auto p = prompt_of(5, 10);
  enqueue(a, spec(4, p, 6));
  a.take_commands();  // its first step never runs
  engine::export_start x;
  ASSERT_EQ(a.begin_export(4, x), "");
  EXPECT_TRUE(x.pages.empty());
  EXPECT_TRUE(x.blob.tokens.empty());
  EXPECT_FALSE(a.end_export(x.key)) << "it left at once";
  uint64_t key = 0;
  int32_t n_kv = -1;
  ASSERT_EQ(b.import(spec(4, p, 6), encode_kv_blob(x.blob), key, n_kv), "");
  EXPECT_EQ(n_kv, 0);
  db.settle();
  EXPECT_EQ(db.by_key[key].tokens, reference(p, 6));
  EXPECT_EQ(a.stats().kv.allocated, 0);
  expect_released(b);
}

TEST(Engine, ASequenceAbortedWhileItsPagesAreReadLeavesNoExport) {
  engine a(fake_info(64), options(32, 32));
  fake_device da(a);
  enqueue(a, spec(9, prompt_of(6, 12), 20));
  da.carry_out();
  da.answer_next();  // prefilled: its KV is in pages
  engine::export_start x;
  ASSERT_EQ(a.begin_export(9, x), "");
  ASSERT_FALSE(x.pages.empty());
  EXPECT_NE(a.begin_export(9, x).find("being read"), std::string::npos);
  EXPECT_TRUE(a.abort(9));
  EXPECT_FALSE(a.end_export(x.key)) << "it ended while its pages were read";
  da.settle();
  EXPECT_EQ(da.by_key[x.key].finish, finish_reason::aborted);
  expect_released(a);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Static batches (runtime/engine/admission, --batching static): no new
// sequence starts until every member of the batch running has finished;
// outputs are what each gets alone.
TEST(Engine, StaticBatchesStartNoNewSequenceUntilTheBatchHasFinished) {
  auto o = options(16, 8);
  o.admission.mode = batching_mode::static_batches;
  o.admission.order = batch_order::fifo;
  o.admission.odbs.max_batch = 2;
  engine e(fake_info(64), o);
  fake_device dev(e);
  const int32_t lens[] = {3, 12, 5, 7, 2};
  std::vector<uint64_t> keys;
  std::map<uint64_t, std::vector<int32_t>> want;
  for (int i = 0; i < 5; ++i) {
    auto p = prompt_of(i + 1, 6);
    keys.push_back(enqueue(e, spec(100 + i, p, lens[i])));
    want[keys.back()] = reference(p, lens[i]);
  }
  dev.settle();
  for (const auto& [key, w] : want) EXPECT_EQ(dev.by_key[key].tokens, w) << "key " << key;
  // The first step took the one sequence there was; the other four came
  // while it ran and form two batches of two, in arrival order.
  auto& out = dev.by_key;
  for (int i : {1, 2}) EXPECT_GT(out[keys[i]].first_at, out[keys[0]].end_at) << i;
  for (int i : {3, 4})
    for (int j : {1, 2}) EXPECT_GT(out[keys[i]].first_at, out[keys[j]].end_at) << i << j;
  // Within a batch, both ran together.
  EXPECT_LT(out[keys[2]].first_at, out[keys[1]].end_at);
  EXPECT_EQ(e.stats().static_batches, 3u);
  expect_released(e);
}

// A static batch whose last member leaves with no step to follow (its KV
// exported from a prefill instance, or cancelled while parked) lets the
// next batch start at once: nothing else would wake the engine.
TEST(Engine, TheNextStaticBatchStartsWhenTheLastMemberLeavesBetweenSteps) {
  auto o = options(32, 8);
  o.admission.mode = batching_mode::static_batches;
  o.admission.order = batch_order::fifo;
  o.admission.odbs.max_batch = 1;
  engine e(fake_info(64), o);
  fake_device dev(e);
  auto parked = [](uint64_t id) {
    auto r = spec(id, prompt_of(int32_t(id), 6), 20);
    r.prefill_only = true;  // first token out, then its KV waits for export
    return r;
  };
  enqueue(e, parked(1));
  const auto p2 = prompt_of(2, 5);
  const uint64_t k2 = enqueue(e, spec(2, p2, 3));
  dev.settle();
  ASSERT_TRUE(dev.by_key[k2].tokens.empty()) << "it is not in the running batch";
  engine::export_start x;
  ASSERT_EQ(e.begin_export(1, x), "");
  dev.carry_out();
  ASSERT_TRUE(e.end_export(x.key));
  dev.settle();
  EXPECT_EQ(dev.by_key[k2].tokens, reference(p2, 3)) << "it started once the member left";

  enqueue(e, parked(3));
  const auto p4 = prompt_of(4, 5);
  const uint64_t k4 = enqueue(e, spec(4, p4, 3));
  dev.settle();
  ASSERT_TRUE(dev.by_key[k4].tokens.empty());
  EXPECT_TRUE(e.abort(3));
  dev.settle();
  EXPECT_EQ(dev.by_key[k4].tokens, reference(p4, 3)) << "it started once the member was cancelled";
  expect_released(e);
}

// The length predictor learns each class from finished sequences, and the
// length order admits the class predicted shorter first.
TEST(Engine, TheLengthOrderAdmitsTheClassPredictedShorterFirst) {
  auto o = options(16, 8);
  o.limits.max_seqs = 1;
  o.admission.order = batch_order::length;
  engine e(fake_info(64), o);
  fake_device dev(e);
  auto of_class = [](uint64_t id, const char* cls, int32_t n) {
    auto r = spec(id, prompt_of(int32_t(id), 5), n);
    r.prompt_class = cls;
    return r;
  };
  for (int i = 0; i < 3; ++i) {
    enqueue(e, of_class(10 + i, "long", 20));
    enqueue(e, of_class(20 + i, "short", 2));
    dev.settle();
  }
  auto s = e.stats();
  EXPECT_EQ(s.length_predicted, 6u);
  // The first of each class was predicted by the fallback (bucket 4,
  // [32, 64)); once seen, a class's bucket ([16, 32), [0, 8)) is right.
  EXPECT_EQ(s.length_right, 4u);
  // All four may generate 20 tokens: only the prediction tells them apart.
  const uint64_t l1 = enqueue(e, of_class(30, "long", 20));  // starts at once
  const uint64_t l2 = enqueue(e, of_class(31, "long", 20));
  const uint64_t s1 = enqueue(e, of_class(32, "short", 20));
  const uint64_t s2 = enqueue(e, of_class(33, "short", 20));
  dev.settle();
  auto& out = dev.by_key;
  EXPECT_LT(out[l1].first_at, out[s1].first_at);
  EXPECT_LT(out[s1].end_at, out[l2].first_at);
  EXPECT_LT(out[s2].end_at, out[l2].first_at);
  // The long ones were predicted right, the "short" ones wrong this time.
  EXPECT_EQ(e.stats().length_predicted, 10u);
  EXPECT_EQ(e.stats().length_right, 6u);
  expect_released(e);
}

}  // namespace
}  // namespace troupe
