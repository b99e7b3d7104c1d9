// The KV page pool (runtime/engine/page_pool.hpp):
// each operation, LRU eviction, prefix hits, copy-on-write, and a randomized
// run against a fake arena that records which token each KV slot holds.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/engine/page_pool.hpp"

namespace troupe {
namespace {

// Stands in for the device: slot[page * page_size + offset] is the token
// whose KV that slot holds, so a wrong page table reads wrong tokens.
struct fake_arena {
  int ps;
  std::vector<int32_t> slot;
  fake_arena(int n_pages, int page_size) : ps(page_size), slot(size_t(n_pages) * ps, -1) {}

  void run(const step_allocation& a) {
    for (const auto& c : a.copies)
      for (int t = 0; t < c.tokens; ++t) slot[c.dst * ps + t] = slot[c.src * ps + t];
  }
  void write(const std::vector<int32_t>& pages, const std::vector<int32_t>& tokens, int from,
             int to) {
    for (int p = from; p < to; ++p) slot[pages[p / ps] * ps + p % ps] = tokens[p];
  }
  bool holds(const std::vector<int32_t>& pages, const std::vector<int32_t>& tokens, int n) const {
    for (int p = 0; p < n; ++p)
      if (slot[pages[p / ps] * ps + p % ps] != tokens[p]) return false;
    return true;
  }
};

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// Prefills `tokens` for a new sequence: prefix match, then one step for the
// rest, then commit.  Returns the tokens the prefix match saved.
int32_t prefill(page_pool& pool, fake_arena& arena, uint64_t seq,
                const std::vector<int32_t>& tokens) {
  int32_t cached = pool.match_prefix(seq, tokens).cached_tokens;
  auto a = pool.allocate_step({{seq, int32_t(tokens.size())}});
  EXPECT_TRUE(a.ok);
  arena.run(a);
  arena.write(a.tables[0].pages, tokens, cached, int(tokens.size()));
  pool.commit_full_pages(seq, tokens);
  EXPECT_EQ(pool.check_invariants(), "");
  return cached;
}

TEST(PagePool, StartsAllFreeAndHashesAreSalted) {
  page_pool pool(10, 4, 1);
  auto st = pool.stats();
  EXPECT_EQ(st.total, 10);
  EXPECT_EQ(st.free, 10);
  EXPECT_EQ(st.used() + st.reusable, 0);
  EXPECT_EQ(pool.available(), 10);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_THROW(page_pool(4, 0, 1), std::invalid_argument);
  EXPECT_THROW(page_pool(-1, 4, 1), std::invalid_argument);
  // Hashes chain and are salted with the model, so two models never share pages.
  auto t = iota_tokens(4, 3);
  EXPECT_NE(page_hash(0, t.data(), 4, 1), page_hash(0, t.data(), 4, 2));
  EXPECT_NE(page_hash(0, t.data(), 4, 1), page_hash(5, t.data(), 4, 1));
  EXPECT_EQ(page_hash(9, t.data(), 4, 1), page_hash(9, t.data(), 4, 1));
  EXPECT_NE(fingerprint_salt("model-a"), fingerprint_salt("model-b"));
}

TEST(PagePool, AllocateStepIsAllOrNothing) {
  page_pool pool(6, 4, 1);
  auto a = pool.allocate_step({{1, 5}, {2, 8}});  // 2 + 2 pages
  ASSERT_TRUE(a.ok);
  ASSERT_EQ(a.tables.size(), 2u);
  EXPECT_EQ(a.tables[0].pages.size(), 2u);
  EXPECT_EQ(a.tables[1].pages.size(), 2u);
  EXPECT_EQ(a.tables[1].n_tokens, 8);
  EXPECT_TRUE(a.copies.empty());
  EXPECT_EQ(pool.stats().mapped, 4);
  EXPECT_EQ(pool.state(a.tables[0].pages[0]), page_state::mapped);
  EXPECT_EQ(pool.refcount(a.tables[0].pages[0]), 1);

  // Seq 1 grows within its page (no new page), seq 2 needs 2 more, seq 3
  // needs 1: 3 > 2 free, so nothing may change.
  auto before = pool.table(1);
  auto refused = pool.allocate_step({{1, 7}, {2, 16}, {3, 1}});
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.pages_short, 1);
  EXPECT_TRUE(refused.tables.empty());
  EXPECT_EQ(pool.table(1), before);
  EXPECT_EQ(pool.table(2).size(), 2u);
  EXPECT_FALSE(pool.has_sequence(3));
  EXPECT_EQ(pool.stats().free, 2);
  EXPECT_EQ(pool.stats().alloc_failures, 1u);
  EXPECT_EQ(pool.check_invariants(), "");

  auto fits = pool.allocate_step({{1, 7}, {2, 16}});
  ASSERT_TRUE(fits.ok);
  EXPECT_EQ(fits.tables[0].pages, before);
  EXPECT_EQ(pool.stats().free, 0);
  // Asking for fewer tokens than held changes nothing and still answers.
  auto same = pool.allocate_step({{2, 3}});
  ASSERT_TRUE(same.ok);
  EXPECT_EQ(same.tables[0].n_tokens, 16);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, FreeReturnsPagesToFreeOrReusable) {
  page_pool pool(8, 4, 1);
  fake_arena arena(8, 4);
  prefill(pool, arena, 1, iota_tokens(10, 100));  // 2 full pages committed, 1 partial
  EXPECT_EQ(pool.stats().mapped, 3);
  EXPECT_EQ(pool.free_sequence(1), 3);
  auto st = pool.stats();
  EXPECT_EQ(st.reusable, 2);  // the indexed full pages
  EXPECT_EQ(st.free, 6);
  EXPECT_EQ(st.sequences, 0);
  EXPECT_EQ(pool.free_sequence(1), 0);  // a second free is harmless
  EXPECT_EQ(pool.available(), 8);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, PrefixHitComputesOnlyTheSuffix) {
  page_pool pool(16, 4, 7);
  fake_arena arena(16, 4);
  auto system = iota_tokens(12, 500);  // a shared "system prompt" of 3 pages
  auto a = system;
  a.insert(a.end(), {1, 2, 3});
  EXPECT_EQ(prefill(pool, arena, 1, a), 0);
  auto a_pages = pool.table(1);
  pool.free_sequence(1);

  auto b = system;
  b.insert(b.end(), {9, 8, 7, 6, 5});
  auto m = pool.match_prefix(2, b);
  EXPECT_EQ(m.cached_tokens, 12);
  ASSERT_EQ(m.pages.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(a_pages.begin(), a_pages.begin() + 3), m.pages);
  EXPECT_TRUE(arena.holds(m.pages, b, 12));
  EXPECT_EQ(pool.state(m.pages[0]), page_state::mapped);  // reusable -> mapped
  // Only the 5-token suffix needs pages: 2 more.
  int free_before = pool.stats().free;
  auto s = pool.allocate_step({{2, int32_t(b.size())}});
  ASSERT_TRUE(s.ok);
  EXPECT_EQ(s.tables[0].pages.size(), 5u);
  EXPECT_EQ(pool.stats().free, free_before - 2);
  auto st = pool.stats();
  EXPECT_EQ(st.prefix_queries, 2u);
  EXPECT_EQ(st.prefix_query_tokens, a.size() + b.size());
  EXPECT_EQ(st.prefix_hit_tokens, 12u);
  EXPECT_DOUBLE_EQ(st.hit_rate(), 12.0 / double(a.size() + b.size()));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, MatchNeverCoversTheWholePrompt) {
  page_pool pool(8, 4, 1);
  fake_arena arena(8, 4);
  auto p = iota_tokens(9, 1);  // two full pages and one more token
  prefill(pool, arena, 1, p);
  // An 8-token prompt is two full cached pages: only the first is mapped,
  // so the last page's tokens are computed and yield logits.
  auto m = pool.match_prefix(2, iota_tokens(8, 1));
  EXPECT_EQ(m.cached_tokens, 4);
  EXPECT_EQ(pool.refcount(m.pages[0]), 2);  // shared with live sequence 1
  EXPECT_EQ(pool.match_prefix(3, iota_tokens(4, 1)).cached_tokens, 0);
  EXPECT_EQ(pool.match_prefix(4, {}).cached_tokens, 0);
  EXPECT_EQ(pool.match_prefix(5, iota_tokens(9, 1)).cached_tokens, 8);
  // A different first page misses, even though page 2's tokens match.
  auto other = iota_tokens(9, 1);
  other[0] = 77;
  EXPECT_EQ(pool.match_prefix(6, other).cached_tokens, 0);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, FreePagesFirstThenLruEviction) {
  page_pool pool(9, 4, 1);
  fake_arena arena(9, 4);
  // Three sequences of 2 full pages + 1 token each, freed in order 1, 2, 3.
  for (uint64_t s = 1; s <= 3; ++s) prefill(pool, arena, s, iota_tokens(9, int32_t(s) * 100));
  std::vector<std::vector<int32_t>> tables;
  for (uint64_t s = 1; s <= 3; ++s) tables.push_back(pool.table(s));
  for (uint64_t s = 1; s <= 3; ++s) pool.free_sequence(s);
  EXPECT_EQ(pool.stats().reusable, 6);
  EXPECT_EQ(pool.stats().free, 3);

  // Three pages come from the free list; no eviction.
  ASSERT_TRUE(pool.allocate_step({{10, 12}}).ok);
  EXPECT_EQ(pool.stats().evictions, 0u);
  EXPECT_EQ(pool.stats().reusable, 6);
  // The next page evicts the least recently released: sequence 1's tail page.
  ASSERT_TRUE(pool.allocate_step({{10, 13}}).ok);
  EXPECT_EQ(pool.stats().evictions, 1u);
  EXPECT_EQ(pool.table(10).back(), tables[0][1]);
  EXPECT_EQ(pool.state(tables[0][0]), page_state::reusable);
  // Sequence 1 now hits only its first page; mapping it protects it.
  EXPECT_EQ(pool.match_prefix(11, iota_tokens(9, 100)).cached_tokens, 4);
  EXPECT_EQ(pool.state(tables[0][0]), page_state::mapped);
  // Next evictions: sequence 2's pages, tail first, then sequence 3's.
  ASSERT_TRUE(pool.allocate_step({{10, 21}}).ok);
  auto t = pool.table(10);
  EXPECT_EQ(t[4], tables[1][1]);
  EXPECT_EQ(t[5], tables[1][0]);
  EXPECT_EQ(pool.state(tables[2][0]), page_state::reusable);
  EXPECT_EQ(pool.match_prefix(12, iota_tokens(9, 200)).cached_tokens, 0);
  EXPECT_EQ(pool.match_prefix(13, iota_tokens(9, 300)).cached_tokens, 8);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, ForkSharesPagesAndCopiesOnWrite) {
  page_pool pool(8, 4, 1);
  fake_arena arena(8, 4);
  auto p = iota_tokens(6, 10);
  prefill(pool, arena, 1, p);
  EXPECT_EQ(pool.fork(1, 2), 2);
  EXPECT_EQ(pool.table(2), pool.table(1));
  EXPECT_EQ(pool.refcount(pool.table(1)[1]), 2);
  EXPECT_THROW(pool.fork(1, 2), std::invalid_argument);
  EXPECT_THROW(pool.fork(99, 3), std::invalid_argument);

  // The child writes position 6 into the shared partial page: it gets a copy.
  int32_t shared = pool.table(1)[1];
  auto c = pool.allocate_step({{2, 7}});
  ASSERT_TRUE(c.ok);
  ASSERT_EQ(c.copies.size(), 1u);
  EXPECT_EQ(c.copies[0].seq, 2u);
  EXPECT_EQ(c.copies[0].src, shared);
  EXPECT_EQ(c.copies[0].tokens, 2);
  EXPECT_EQ(c.copies[0].dst, pool.table(2)[1]);
  EXPECT_NE(pool.table(2)[1], shared);
  EXPECT_EQ(pool.table(2)[0], pool.table(1)[0]);
  EXPECT_EQ(pool.refcount(shared), 1);
  arena.run(c);
  auto child = p;
  child.push_back(42);
  arena.write(pool.table(2), child, 6, 7);
  // The parent now owns its page alone and writes in place.
  auto d = pool.allocate_step({{1, 7}});
  ASSERT_TRUE(d.ok);
  EXPECT_TRUE(d.copies.empty());
  auto parent = p;
  parent.push_back(43);
  arena.write(pool.table(1), parent, 6, 7);
  EXPECT_TRUE(arena.holds(pool.table(1), parent, 7));
  EXPECT_TRUE(arena.holds(pool.table(2), child, 7));

  // Both writing in the same step: one copy, the other writes in place.
  pool.fork(1, 3);
  auto e = pool.allocate_step({{1, 8}, {3, 8}});
  ASSERT_TRUE(e.ok);
  EXPECT_EQ(e.copies.size(), 1u);
  EXPECT_NE(pool.table(1)[1], pool.table(3)[1]);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, TruncateIntoAnIndexedPageCopiesIt) {
  page_pool pool(8, 4, 1);
  fake_arena arena(8, 4);
  auto p = iota_tokens(9, 10);
  prefill(pool, arena, 1, p);
  int32_t second = pool.table(1)[1];
  EXPECT_EQ(pool.truncate(1, 6), 1);  // drops the third page
  EXPECT_EQ(pool.table(1).size(), 2u);
  EXPECT_EQ(pool.truncate(1, 6), 0);
  // Writing position 6 must not touch the indexed page 2 of the prefix.
  auto a = pool.allocate_step({{1, 7}});
  ASSERT_TRUE(a.ok);
  ASSERT_EQ(a.copies.size(), 1u);
  EXPECT_EQ(a.copies[0].src, second);
  EXPECT_EQ(pool.state(second), page_state::reusable);
  EXPECT_EQ(pool.match_prefix(2, p).cached_tokens, 8);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, SwapOutAndImport) {
  page_pool pool(6, 4, 1);
  fake_arena arena(6, 4);
  auto p = iota_tokens(7, 40);
  prefill(pool, arena, 1, p);
  auto out = pool.export_pages(1);
  EXPECT_EQ(out.n_tokens, 7);
  EXPECT_EQ(out.pages, pool.table(1));
  std::vector<int32_t> host(arena.slot.begin(), arena.slot.end());
  pool.free_sequence(1);
  EXPECT_THROW(pool.export_pages(1), std::invalid_argument);

  EXPECT_TRUE(pool.reserve(7).empty());  // more than the arena
  auto r = pool.reserve(2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(pool.state(r[0]), page_state::allocated);
  EXPECT_EQ(pool.stats().allocated, 2);
  EXPECT_EQ(pool.check_invariants(), "");
  for (int i = 0; i < 2; ++i)
    for (int t = 0; t < 4; ++t) arena.slot[r[i] * 4 + t] = host[out.pages[i] * 4 + t];
  EXPECT_THROW(pool.attach({9, 9, r}), std::invalid_argument);  // 9 tokens need 3 pages
  pool.attach({9, 7, r});
  EXPECT_EQ(pool.stats().allocated, 0);
  EXPECT_EQ(pool.table(9), r);
  EXPECT_TRUE(arena.holds(r, p, 7));
  EXPECT_THROW(pool.unreserve(r), std::invalid_argument);  // mapped, not reserved
  auto spare = pool.reserve(1);
  EXPECT_EQ(pool.unreserve(spare), 1);
  EXPECT_EQ(pool.state(spare[0]), page_state::free);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, MisuseThrowsAndChangesNothing) {
  page_pool pool(4, 4, 1);
  pool.allocate_step({{1, 3}});
  EXPECT_THROW(pool.allocate_step({{2, 1}, {2, 2}}), std::invalid_argument);
  EXPECT_THROW(pool.allocate_step({{2, -1}}), std::invalid_argument);
  EXPECT_THROW(pool.match_prefix(1, iota_tokens(8, 0)), std::invalid_argument);
  EXPECT_THROW(pool.commit_full_pages(5, {}), std::invalid_argument);
  EXPECT_THROW(pool.truncate(5, 0), std::invalid_argument);
  EXPECT_THROW(pool.state(4), std::invalid_argument);
  EXPECT_THROW(pool.unreserve({0}), std::invalid_argument);
  EXPECT_EQ(pool.stats().mapped, 1);
  EXPECT_EQ(pool.stats().sequences, 1);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, Utilization) {
  page_pool pool(8, 4, 1);
  pool.allocate_step({{1, 5}, {2, 4}});  // 9 tokens in 3 pages
  auto st = pool.stats();
  EXPECT_EQ(st.cached_tokens, 9);
  EXPECT_DOUBLE_EQ(st.utilization(), 9.0 / 12.0);
  pool.fork(1, 3);  // shared pages count once
  EXPECT_EQ(pool.stats().cached_tokens, 9);
}

// Several hundred random operations against the fake arena, with the
// invariants checked after every one.
void random_run(uint32_t seed) {
  const int n_pages = 40, ps = 4;
  page_pool pool(n_pages, ps, 0xabc);
  fake_arena arena(n_pages, ps);
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return int(rng() % unsigned(n)); };
  std::vector<std::vector<int32_t>> docs;  // shared prefixes
  for (int d = 0; d < 4; ++d) docs.push_back(iota_tokens(24, 1000 * (d + 1)));

  struct model_seq {
    std::vector<int32_t> tokens;
    int32_t computed = 0;
  };
  std::map<uint64_t, model_seq> live;
  std::vector<std::vector<int32_t>> to_recompute;
  struct swapped_seq {
    std::vector<int32_t> tokens;
    int32_t computed;
    std::vector<int32_t> data;
  };
  std::vector<swapped_seq> swapped;
  uint64_t next_id = 1;
  size_t copies = 0, swap_ins = 0;
  auto any_live = [&]() { return std::next(live.begin(), pick(int(live.size()))); };
  auto preempt = [&]() {
    auto it = any_live();
    if (pick(2) == 0) {
      to_recompute.push_back(it->second.tokens);
    } else {
      auto out = pool.export_pages(it->first);
      swapped_seq s{it->second.tokens, out.n_tokens, {}};
      for (int p = 0; p < out.n_tokens; ++p)
        s.data.push_back(arena.slot[out.pages[p / ps] * ps + p % ps]);
      swapped.push_back(std::move(s));
    }
    pool.free_sequence(it->first);
    live.erase(it);
  };

  for (int op = 0; op < 700; ++op) {
    int kind = pick(100);
    if (kind < 22 && live.size() < 10) {  // admit a new or preempted sequence
      std::vector<int32_t> prompt;
      if (!to_recompute.empty() && pick(2) == 0) {
        prompt = to_recompute.back();
        to_recompute.pop_back();
      } else {
        const auto& d = docs[pick(int(docs.size()))];
        prompt.assign(d.begin(), d.begin() + 1 + pick(int(d.size())));
        for (int i = pick(8); i > 0; --i) prompt.push_back(pick(900));
      }
      uint64_t id = next_id++;
      auto m = pool.match_prefix(id, prompt);
      ASSERT_EQ(m.cached_tokens % ps, 0);
      ASSERT_LT(m.cached_tokens, int32_t(prompt.size()));
      ASSERT_TRUE(arena.holds(m.pages, prompt, m.cached_tokens)) << "stale prefix hit";
      live[id] = {prompt, m.cached_tokens};
    } else if (kind < 60 && !live.empty()) {  // one step over a few sequences
      std::vector<alloc_request> reqs;
      std::vector<uint64_t> ids;
      for (auto& [id, s] : live)
        if (pick(3) != 0) {
          if (s.computed == int32_t(s.tokens.size())) s.tokens.push_back(pick(900));  // decode
          int32_t chunk = std::min<int32_t>(1 + pick(10), int32_t(s.tokens.size()) - s.computed);
          reqs.push_back({id, s.computed + chunk});
          ids.push_back(id);
        }
      auto before = pool.stats();
      auto a = pool.allocate_step(reqs);
      if (!a.ok) {
        ASSERT_GT(a.pages_short, 0);
        auto after = pool.stats();
        ASSERT_EQ(after.free, before.free);
        ASSERT_EQ(after.mapped, before.mapped);
        ASSERT_EQ(after.reusable, before.reusable);
        if (!live.empty()) preempt();
      } else {
        arena.run(a);
        copies += a.copies.size();
        for (size_t i = 0; i < reqs.size(); ++i) {
          auto& s = live[ids[i]];
          ASSERT_EQ(a.tables[i].pages, pool.table(ids[i]));
          arena.write(a.tables[i].pages, s.tokens, s.computed, reqs[i].tokens_needed);
          s.computed = reqs[i].tokens_needed;
          if (pick(3) != 0)
            pool.commit_full_pages(
                ids[i], std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.computed));
        }
      }
    } else if (kind < 68 && !live.empty()) {  // fork (parallel sampling)
      auto it = any_live();
      uint64_t id = next_id++;
      pool.fork(it->first, id);
      auto& parent = it->second;
      live[id] = {{parent.tokens.begin(), parent.tokens.begin() + parent.computed},
                  parent.computed};
    } else if (kind < 82 && !live.empty()) {  // finish or cancel
      auto it = any_live();
      pool.free_sequence(it->first);
      live.erase(it);
    } else if (kind < 87 && !live.empty()) {  // truncate (e.g. rejected draft tokens)
      auto it = any_live();
      int32_t n = pick(it->second.computed + 1);
      pool.truncate(it->first, n);
      it->second.tokens.resize(n);
      it->second.computed = n;
    } else if (kind < 89 && !live.empty()) {
      preempt();
    } else if (!swapped.empty()) {  // swap a sequence back in
      auto s = swapped.back();
      auto r = pool.reserve(pool.pages_for(s.computed));
      if (r.empty() && s.computed > 0) continue;
      swapped.pop_back();
      ++swap_ins;
      for (int p = 0; p < s.computed; ++p) arena.slot[r[p / ps] * ps + p % ps] = s.data[p];
      uint64_t id = next_id++;
      pool.attach({id, s.computed, r});
      live[id] = {s.tokens, s.computed};
    }
    ASSERT_EQ(pool.check_invariants(), "") << "seed " << seed << " op " << op;
    for (const auto& [id, s] : live)
      ASSERT_TRUE(arena.holds(pool.table(id), s.tokens, s.computed))
          << "seed " << seed << " op " << op << ": sequence " << id << " lost its KV";
    auto st = pool.stats();
    ASSERT_EQ(st.free + st.allocated + st.mapped + st.reusable, n_pages);
  }

  auto st = pool.stats();
  EXPECT_GT(st.prefix_hit_tokens, 0u) << "seed " << seed;
  EXPECT_GT(st.alloc_failures, 0u) << "seed " << seed;
  EXPECT_GT(st.evictions, 0u) << "seed " << seed;
  EXPECT_GT(copies, 0u) << "seed " << seed;
  EXPECT_GT(swap_ins, 0u) << "seed " << seed;
  for (const auto& [id, s] : live) pool.free_sequence(id);
  st = pool.stats();
  EXPECT_EQ(st.sequences, 0);
  EXPECT_EQ(st.mapped + st.allocated, 0);
  EXPECT_EQ(st.free + st.reusable, n_pages);
  EXPECT_EQ(pool.available(), n_pages);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, RandomOperationsKeepInvariants) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    random_run(seed);
    if (HasFatalFailure()) return;
  }
}

// KV store hooks: an evicted indexed page is recorded with what the
// host tier needs (hash, parent, depth, tokens), and a page loaded back at
// an admission joins the sequence's table and the index.
TEST(PagePool, RecordsEvictionsAndAppendsLoadedPages) {
  page_pool pool(3, 4, fingerprint_salt("m"));
  pool.record_evictions(true);
  const auto prompt = iota_tokens(9, 100);  // two full pages and one token
  pool.match_prefix(1, prompt);
  ASSERT_TRUE(pool.allocate_step({{1, 9}}).ok);
  EXPECT_EQ(pool.commit_full_pages(1, prompt), 2);
  const auto hashes = pool.prompt_hashes(prompt);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(pool.cached_pages(prompt), 2);
  pool.free_sequence(1);
  EXPECT_FALSE(pool.has_evicted());
  // Three fresh pages evict both indexed ones (the tail first).
  ASSERT_TRUE(pool.allocate_step({{2, 12}}).ok);
  auto ev = pool.take_evicted();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].hash, hashes[1]);
  EXPECT_EQ(ev[0].parent, hashes[0]);
  EXPECT_EQ(ev[0].depth, 1);
  EXPECT_EQ(ev[0].tokens, (std::vector<int32_t>{104, 105, 106, 107}));
  EXPECT_EQ(ev[1].hash, hashes[0]);
  EXPECT_EQ(ev[1].depth, 0);
  EXPECT_EQ(pool.cached_pages(prompt), 0);
  pool.free_sequence(2);

  // Loaded back at an admission: the sequence's cached run (none here)
  // mapped, reserved pages appended to its table and indexed.
  EXPECT_EQ(pool.match_prefix(3, prompt).cached_tokens, 0);
  auto r = pool.reserve(2);
  ASSERT_EQ(r.size(), 2u);
  pool.append_loaded(3, r[0], ev[1].hash, 0, 0, ev[1].tokens);
  EXPECT_THROW(pool.append_loaded(3, r[1], ev[0].hash, ev[0].parent, 0, ev[0].tokens),
               std::invalid_argument);  // depth 0 again: not the table's next page
  pool.append_loaded(3, r[1], ev[0].hash, ev[0].parent, 1, ev[0].tokens);
  EXPECT_EQ(pool.table(3), r);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(pool.cached_pages(prompt), 2);
  // The table grows on from there; freed, the loaded pages stay indexed.
  ASSERT_TRUE(pool.allocate_step({{3, 9}}).ok);
  pool.free_sequence(3);
  EXPECT_EQ(pool.match_prefix(4, prompt).cached_tokens, 8);
  // A page whose load failed leaves the index.
  EXPECT_TRUE(pool.indexes(r[1], ev[0].hash));
  pool.forget(r[1]);
  EXPECT_FALSE(pool.indexes(r[1], ev[0].hash));
  EXPECT_EQ(pool.check_invariants(), "");
  pool.free_sequence(4);
  EXPECT_EQ(pool.cached_pages(prompt), 1);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_THROW(pool.append_loaded(5, r[1], 1, 0, 0, ev[0].tokens), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
