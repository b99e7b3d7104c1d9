// Micro-batches of a pipelined step (runtime/engine/micro_batch.hpp): the
// split keeps every row, sequence, logit row, hidden row and draw exactly
// once, in groups of whole sequences; the merge puts the groups' results
// back in the step's order.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "runtime/engine/micro_batch.hpp"

namespace troupe {
namespace {

// A step of `seqs` sequences of 1 to 40 rows each (in a shuffled row
// order: sequence i's rows need not come before sequence i+1's), every
// token naming its row; some logit and hidden rows in a random order,
// draws of some logit rows; a stage input of width 3 naming its row.
forward_batch random_step(std::mt19937& rng, int seqs) {
  forward_batch b;
  std::vector<int> lens(seqs);
  int rows = 0;
  for (int& n : lens) rows += n = std::uniform_int_distribution<int>(1, 40)(rng);
  std::vector<int> order(seqs);
  for (int i = 0; i < seqs; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> first(seqs);
  int at = 0;
  for (int i : order) {
    first[i] = at;
    at += lens[i];
  }
  b.tokens.resize(rows);
  b.positions.resize(rows);
  for (int s = 0; s < seqs; ++s) {
    b.seqs.push_back({first[s], lens[s], {s, 100 + s}});
    for (int r = 0; r < lens[s]; ++r) {
      b.tokens[first[s] + r] = first[s] + r;
      b.positions[first[s] + r] = 1000 * s + r;
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < 3; ++k) b.stage_input.push_back(static_cast<float>(r * 3 + k));
    if (rng() % 3 == 0) b.logit_rows.push_back(r);
    if (rng() % 5 == 0) b.hidden_rows.push_back(r);
  }
  std::shuffle(b.logit_rows.begin(), b.logit_rows.end(), rng);
  std::shuffle(b.hidden_rows.begin(), b.hidden_rows.end(), rng);
  for (size_t i = 0; i < b.logit_rows.size(); ++i)
    if (rng() % 2 == 0) {
      presample_row p;
      p.logit_index = static_cast<int32_t>(i);
      p.position = static_cast<int64_t>(i);
      b.presample.push_back(p);
    }
  std::shuffle(b.presample.begin(), b.presample.end(), rng);
  b.step = 77;
  return b;
}

TEST(MicroBatch, SplitKeepsEverythingOnceAndMergeRestoresTheOrder) {
  std::mt19937 rng(35);
  for (int trial = 0; trial < 300; ++trial) {
    const int seqs = std::uniform_int_distribution<int>(1, 12)(rng);
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    const auto b = random_step(rng, seqs);
    const auto s = split_micro_batches(b, n);
    ASSERT_EQ(s.groups.size(), static_cast<size_t>(std::max(1, std::min(n, seqs))));
    // Every sequence in one group, the groups' sequences in the step's
    // order; each one's rows consecutive there, with the step's tokens,
    // positions and inputs.
    size_t seq = 0, rows = 0;
    std::vector<int> seen(b.seqs.size(), 0);
    for (const auto& g : s.groups) {
      ASSERT_FALSE(g.seqs.empty());
      EXPECT_EQ(g.step, 77u);
      EXPECT_EQ(g.tokens.size(), g.positions.size());
      EXPECT_EQ(g.stage_input.size(), 3 * g.tokens.size());
      int32_t next = 0, last_first = -1;
      for (const auto& q : g.seqs) {
        // The step's sequence: the one whose first row's token this is.
        const int32_t orig_first = g.tokens[q.first_row];
        const auto it = std::find_if(b.seqs.begin(), b.seqs.end(), [&](const forward_seq& o) {
          return o.first_row == orig_first;
        });
        ASSERT_NE(it, b.seqs.end());
        const auto& orig = *it;
        const size_t index = static_cast<size_t>(it - b.seqs.begin());
        EXPECT_GT(static_cast<int32_t>(index), last_first) << "out of the step's order";
        last_first = static_cast<int32_t>(index);
        ++seen[index];
        ++seq;
        EXPECT_EQ(q.first_row, next);
        EXPECT_EQ(q.n_rows, orig.n_rows);
        EXPECT_EQ(q.pages, orig.pages);
        for (int r = 0; r < q.n_rows; ++r) {
          EXPECT_EQ(g.tokens[q.first_row + r], orig.first_row + r);
          EXPECT_EQ(g.positions[q.first_row + r], b.positions[orig.first_row + r]);
          EXPECT_EQ(g.stage_input[3 * (q.first_row + r)], 3.0f * (orig.first_row + r));
        }
        next += q.n_rows;
      }
      rows += g.tokens.size();
      // Each group names its own logit rows, drawing from its own logits.
      for (const auto& p : g.presample)
        EXPECT_LT(static_cast<size_t>(p.logit_index), g.logit_rows.size());
    }
    for (int x : seen) EXPECT_EQ(x, 1);
    EXPECT_EQ(seq, b.seqs.size());
    ASSERT_EQ(s.rows.size(), b.tokens.size());
    for (size_t r = 0; r < b.tokens.size(); ++r)
      EXPECT_EQ(s.groups[s.rows[r].group].tokens[s.rows[r].index], static_cast<int32_t>(r));
    EXPECT_EQ(rows, b.tokens.size());
    // Groups of about equal rows: none more than one sequence's rows (40)
    // apart.
    size_t most = 0, least = b.tokens.size();
    for (const auto& g : s.groups) {
      most = std::max(most, g.tokens.size());
      least = std::min(least, g.tokens.size());
    }
    EXPECT_LE(most - least, 40u);

    // Results whose every value names the step's row it came from: the
    // merge gives them back in the step's order.
    std::vector<forward_result> results;
    for (const auto& g : s.groups) {
      forward_result r;
      r.n_vocab = 2;
      r.n_embd = 1;
      for (int32_t row : g.logit_rows) {
        r.logits.push_back(static_cast<float>(g.tokens[row]));
        r.logits.push_back(-static_cast<float>(g.tokens[row]));
      }
      for (int32_t row : g.hidden_rows) r.hidden.push_back(static_cast<float>(g.tokens[row]));
      for (const auto& p : g.presample) r.drawn.push_back(g.tokens[g.logit_rows[p.logit_index]]);
      r.device_ms = 1;
      results.push_back(std::move(r));
    }
    const auto m = merge_micro_results(s, results);
    ASSERT_EQ(m.logits.size(), 2 * b.logit_rows.size());
    for (size_t i = 0; i < b.logit_rows.size(); ++i) {
      EXPECT_EQ(m.logits[2 * i], static_cast<float>(b.logit_rows[i]));
      EXPECT_EQ(m.logits[2 * i + 1], -static_cast<float>(b.logit_rows[i]));
    }
    ASSERT_EQ(m.hidden.size(), b.hidden_rows.size());
    for (size_t i = 0; i < b.hidden_rows.size(); ++i)
      EXPECT_EQ(m.hidden[i], static_cast<float>(b.hidden_rows[i]));
    ASSERT_EQ(m.drawn.size(), b.presample.size());
    for (size_t i = 0; i < b.presample.size(); ++i)
      EXPECT_EQ(m.drawn[i], b.logit_rows[b.presample[i].logit_index]);
    EXPECT_EQ(m.device_ms, static_cast<double>(s.groups.size()));
  }
}

// Sequences with a preference stay in their group (so the pipeline's next
// micro-batch waits for one of the step before); the rest balance the rows;
// groups left empty are dropped, the numbers closing up in order.
TEST(MicroBatch, PreferredGroupsAreKept) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int seqs = std::uniform_int_distribution<int>(1, 12)(rng);
    const int n = std::uniform_int_distribution<int>(2, 6)(rng);
    const auto b = random_step(rng, seqs);
    std::vector<int32_t> preferred(static_cast<size_t>(seqs), -1);
    for (auto& p : preferred)
      if (rng() % 2 == 0) p = static_cast<int32_t>(rng() % n);
    const auto s = split_micro_batches(b, n, preferred);
    // Where two sequences prefer groups a < b, a's group comes first; two
    // preferring the same group share one.
    for (int x = 0; x < seqs; ++x)
      for (int y = 0; y < seqs; ++y) {
        if (preferred[x] < 0 || preferred[y] < 0) continue;
        const auto gx = s.rows[b.seqs[x].first_row].group, gy = s.rows[b.seqs[y].first_row].group;
        if (preferred[x] == preferred[y]) {
          EXPECT_EQ(gx, gy);
        } else if (preferred[x] < preferred[y]) {
          EXPECT_LT(gx, gy);
        }
      }
    for (const auto& g : s.groups) EXPECT_FALSE(g.seqs.empty());
  }
  // Every sequence preferring group 1 of 2: one group.
  std::mt19937 r2(3);
  const auto b = random_step(r2, 4);
  EXPECT_EQ(split_micro_batches(b, 2, {1, 1, 1, 1}).groups.size(), 1u);
  EXPECT_EQ(split_micro_batches(b, 2, {1, 1, 1, -1}).groups.size(), 2u);
}

TEST(MicroBatch, MalformedStepsAreRefused) {
  std::mt19937 rng(1);
  auto b = random_step(rng, 3);
  auto with = [&](auto change) {
    auto c = b;
    change(c);
    return c;
  };
  EXPECT_NO_THROW(split_micro_batches(b, 2));
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) { c.seqs[1] = c.seqs[0]; }), 2),
               std::invalid_argument);
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) { c.seqs.pop_back(); }), 2),
               std::invalid_argument);
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) { c.seqs[0].n_rows += 1000; }), 2),
               std::invalid_argument);
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) { c.logit_rows.push_back(-1); }), 2),
               std::invalid_argument);
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) {
                                     c.presample.push_back({99999, {}, 0});
                                   }),
                                   2),
               std::invalid_argument);
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) { c.stage_input.pop_back(); }), 2),
               std::invalid_argument);
  EXPECT_THROW(split_micro_batches(with([](forward_batch& c) { c.positions.pop_back(); }), 2),
               std::invalid_argument);
  // A result short of its group's logits is refused, not read past.
  auto s = split_micro_batches(b, 2);
  std::vector<forward_result> results(s.groups.size());
  for (auto& r : results) r.n_vocab = 2;
  EXPECT_THROW(merge_micro_results(s, results), std::invalid_argument);
  results.pop_back();
  EXPECT_THROW(merge_micro_results(s, results), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
