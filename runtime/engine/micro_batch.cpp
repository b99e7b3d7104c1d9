#include "runtime/engine/micro_batch.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

micro_split split_micro_batches(const forward_batch& b, int n,
                                const std::vector<int32_t>& preferred) {
  const size_t rows = b.tokens.size();
  if (b.positions.size() != rows)
    throw std::invalid_argument("micro-batches: " + std::to_string(b.positions.size()) +
                                " positions for " + std::to_string(rows) + " rows");
  // Each row's sequence, checked: every row in exactly one.
  std::vector<int32_t> owner(rows, -1);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const auto& q = b.seqs[s];
    if (q.first_row < 0 || q.n_rows < 0 || static_cast<size_t>(q.first_row) + q.n_rows > rows)
      throw std::invalid_argument("micro-batches: sequence " + std::to_string(s) +
                                  " has rows outside the batch");
    for (int32_t r = q.first_row; r < q.first_row + q.n_rows; ++r) {
      if (owner[r] != -1)
        throw std::invalid_argument("micro-batches: row " + std::to_string(r) +
                                    " is in two sequences");
      owner[r] = static_cast<int32_t>(s);
    }
  }
  for (size_t r = 0; r < rows; ++r)
    if (owner[r] == -1)
      throw std::invalid_argument("micro-batches: row " + std::to_string(r) + " has no sequence");
  const bool stage_input = !b.stage_input.empty();
  const size_t width = stage_input && rows > 0 ? b.stage_input.size() / rows : 0;
  if (stage_input && width * rows != b.stage_input.size())
    throw std::invalid_argument("micro-batches: stage input is not rows x width");

  // Sequences to groups: those with a preference to theirs, then each of
  // the others, in order, to the group with the fewest rows so far; empty
  // groups are dropped.
  int groups = std::max(1, n);
  std::vector<int32_t> group_of(b.seqs.size(), -1);
  {
    std::vector<size_t> load(static_cast<size_t>(groups), 0);
    for (size_t s = 0; s < b.seqs.size(); ++s)
      if (s < preferred.size() && preferred[s] >= 0) {
        group_of[s] = preferred[s] % groups;
        load[group_of[s]] += static_cast<size_t>(b.seqs[s].n_rows);
      }
    for (size_t s = 0; s < b.seqs.size(); ++s)
      if (group_of[s] < 0) {
        group_of[s] =
            static_cast<int32_t>(std::min_element(load.begin(), load.end()) - load.begin());
        load[group_of[s]] += static_cast<size_t>(b.seqs[s].n_rows);
      }
    // Numbers close up in order: group g of the step before is followed by
    // the group that prefers it, and the groups enter the pipeline in order.
    std::vector<int32_t> renumber(static_cast<size_t>(groups), -1);
    int used = 0;
    for (int g = 0; g < groups; ++g)
      if (load[g] > 0 || std::find(group_of.begin(), group_of.end(), g) != group_of.end())
        renumber[g] = used++;
    for (auto& g : group_of) g = renumber[g];
    groups = std::max(used, 1);
  }

  micro_split out;
  out.groups.resize(static_cast<size_t>(groups));
  std::vector<int32_t> new_row(rows, -1);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    auto& g = out.groups[static_cast<size_t>(group_of[s])];
    const auto& q = b.seqs[s];
    forward_seq nq{static_cast<int32_t>(g.tokens.size()), q.n_rows, q.pages};
    for (int32_t r = q.first_row; r < q.first_row + q.n_rows; ++r) {
      new_row[r] = static_cast<int32_t>(g.tokens.size());
      g.tokens.push_back(b.tokens[r]);
      g.positions.push_back(b.positions[r]);
      if (stage_input)
        g.stage_input.insert(g.stage_input.end(), b.stage_input.begin() + r * width,
                             b.stage_input.begin() + (r + 1) * width);
    }
    g.seqs.push_back(std::move(nq));
  }
  for (auto& g : out.groups) {
    g.step = b.step;
    g.after = b.after;
  }
  for (size_t r = 0; r < rows; ++r) out.rows.push_back({group_of[owner[r]], new_row[r]});
  auto place = [&](int32_t r, const char* what) {
    if (r < 0 || static_cast<size_t>(r) >= rows)
      throw std::invalid_argument(std::string("micro-batches: ") + what + " row " +
                                  std::to_string(r) + " out of range");
    return micro_index{group_of[owner[r]], new_row[r]};
  };
  for (int32_t r : b.logit_rows) {
    micro_index at = place(r, "logit");
    auto& g = out.groups[at.group];
    at.index = static_cast<int32_t>(g.logit_rows.size());
    g.logit_rows.push_back(new_row[r]);
    out.logits.push_back(at);
  }
  for (int32_t r : b.hidden_rows) {
    micro_index at = place(r, "hidden");
    auto& g = out.groups[at.group];
    at.index = static_cast<int32_t>(g.hidden_rows.size());
    g.hidden_rows.push_back(new_row[r]);
    out.hidden.push_back(at);
  }
  // Embedding rows (images) go with their rows; each group's first stage takes them.
  if (b.embed_rows.empty() ? !b.embed_input.empty()
                           : b.embed_input.size() % b.embed_rows.size() != 0)
    throw std::invalid_argument("micro-batches: embedding input is not rows x width");
  const size_t embed_width = b.embed_rows.empty() ? 0 : b.embed_input.size() / b.embed_rows.size();
  for (size_t i = 0; i < b.embed_rows.size(); ++i) {
    const micro_index at = place(b.embed_rows[i], "embedding");
    auto& g = out.groups[at.group];
    g.embed_rows.push_back(at.index);
    g.embed_input.insert(g.embed_input.end(), b.embed_input.begin() + i * embed_width,
                         b.embed_input.begin() + (i + 1) * embed_width);
  }
  for (const auto& p : b.presample) {
    if (p.logit_index < 0 || static_cast<size_t>(p.logit_index) >= out.logits.size())
      throw std::invalid_argument("micro-batches: presample of logit row " +
                                  std::to_string(p.logit_index) + " of " +
                                  std::to_string(out.logits.size()));
    const micro_index l = out.logits[p.logit_index];
    auto& g = out.groups[l.group];
    presample_row q = p;
    q.logit_index = l.index;
    out.drawn.push_back({l.group, static_cast<int32_t>(g.presample.size())});
    g.presample.push_back(std::move(q));
  }
  return out;
}

forward_result merge_micro_results(const micro_split& s, std::vector<forward_result>& results) {
  if (results.size() != s.groups.size())
    throw std::invalid_argument("micro-batches: " + std::to_string(results.size()) +
                                " results for " + std::to_string(s.groups.size()) + " groups");
  forward_result out;
  for (size_t g = 0; g < results.size(); ++g) {
    const auto& r = results[g];
    const auto& b = s.groups[g];
    if ((!b.logit_rows.empty() && r.n_vocab <= 0) || (!b.hidden_rows.empty() && r.n_embd <= 0) ||
        r.logits.size() != b.logit_rows.size() * static_cast<size_t>(std::max(r.n_vocab, 0)) ||
        r.hidden.size() != b.hidden_rows.size() * static_cast<size_t>(std::max(r.n_embd, 0)) ||
        r.drawn.size() != b.presample.size())
      throw std::invalid_argument("micro-batches: group " + std::to_string(g) +
                                  "'s result does not match its batch");
    if (out.n_vocab == 0) out.n_vocab = r.n_vocab;
    if (out.n_embd == 0) out.n_embd = r.n_embd;
    if ((r.n_vocab != out.n_vocab && !b.logit_rows.empty()) ||
        (r.n_embd != out.n_embd && !b.hidden_rows.empty()))
      throw std::invalid_argument("micro-batches: groups disagree on the vocabulary or width");
    out.device_ms += r.device_ms;
  }
  const size_t V = static_cast<size_t>(out.n_vocab), D = static_cast<size_t>(out.n_embd);
  out.logits.resize(s.logits.size() * V);
  for (size_t i = 0; i < s.logits.size(); ++i) {
    const auto& at = s.logits[i];
    const auto& src = results[at.group].logits;
    std::copy_n(src.begin() + at.index * V, V, out.logits.begin() + i * V);
  }
  out.hidden.resize(s.hidden.size() * D);
  for (size_t i = 0; i < s.hidden.size(); ++i) {
    const auto& at = s.hidden[i];
    const auto& src = results[at.group].hidden;
    std::copy_n(src.begin() + at.index * D, D, out.hidden.begin() + i * D);
  }
  for (const auto& at : s.drawn) out.drawn.push_back(results[at.group].drawn[at.index]);
  return out;
}

}  // namespace troupe
