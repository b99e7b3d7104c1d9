#include "runtime/engine/page_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace troupe {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

std::string seq_name(uint64_t seq) {
  return "sequence " + std::to_string(seq);
}

[[noreturn]] void misuse(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

}  // namespace

const char* to_string(page_state s) {
  switch (s) {
    case page_state::free:
      return "free";
    case page_state::allocated:
      return "allocated";
    case page_state::mapped:
      return "mapped";
    case page_state::reusable:
      return "reusable";
  }
  return "?";
}

double pool_stats::hit_rate() const {
  return prefix_query_tokens == 0 ? 0.0 : double(prefix_hit_tokens) / double(prefix_query_tokens);
}

pool_stats& pool_stats::operator+=(const pool_stats& o) {
  page_size = o.page_size;
  total += o.total;
  free += o.free;
  allocated += o.allocated;
  mapped += o.mapped;
  reusable += o.reusable;
  sequences += o.sequences;
  cached_tokens += o.cached_tokens;
  prefix_queries += o.prefix_queries;
  prefix_query_tokens += o.prefix_query_tokens;
  prefix_hit_tokens += o.prefix_hit_tokens;
  evictions += o.evictions;
  alloc_failures += o.alloc_failures;
  return *this;
}

double pool_stats::utilization() const {
  return used() == 0 ? 0.0 : double(cached_tokens) / (double(used()) * page_size);
}

uint64_t page_hash(uint64_t prev, const int32_t* tokens, int n, uint64_t salt) {
  uint64_t h = mix(salt ^ 0x9e3779b97f4a7c15ull) ^ mix(prev + 0x632be59bd9b4e019ull);
  for (int i = 0; i < n; ++i) h = mix(h ^ (uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull));
  return mix(h ^ uint64_t(n));
}

uint64_t fingerprint_salt(std::string_view fingerprint) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : fingerprint) h = (h ^ c) * 0x100000001b3ull;
  return mix(h);
}

page_pool::page_pool(int n_pages, int page_size, uint64_t model_salt)
    : page_size_(page_size), salt_(model_salt) {
  if (n_pages < 0) misuse("page_pool", "n_pages " + std::to_string(n_pages) + " is negative");
  if (page_size <= 0) misuse("page_pool", "page_size " + std::to_string(page_size) + " is not > 0");
  pages_.resize(n_pages);
  page_tokens_.assign(size_t(n_pages) * size_t(page_size), 0);
  free_list_.reserve(n_pages);
  for (int p = n_pages - 1; p >= 0; --p) free_list_.push_back(p);  // page 0 is handed out first
  count_[int(page_state::free)] = n_pages;
  counters_.page_size = page_size;
}

int32_t page_pool::pages_for(int64_t tokens) const {
  return static_cast<int32_t>((tokens + page_size_ - 1) / page_size_);
}

int32_t page_pool::available() const {
  return static_cast<int32_t>(free_list_.size() + lru_.size());
}

const page_pool::sequence& page_pool::find(uint64_t seq, const char* op) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) misuse(op, "unknown " + seq_name(seq));
  return it->second;
}

page_pool::sequence& page_pool::find(uint64_t seq, const char* op) {
  return const_cast<sequence&>(static_cast<const page_pool*>(this)->find(seq, op));
}

void page_pool::check_page(int32_t page, const char* op) const {
  if (page < 0 || page >= n_pages())
    misuse(op,
           "page " + std::to_string(page) + " outside the arena of " + std::to_string(n_pages()));
}

const std::vector<int32_t>& page_pool::table(uint64_t seq) const {
  return find(seq, "table").pages;
}

page_state page_pool::state(int32_t page) const {
  check_page(page, "state");
  return pages_[page].state;
}

int32_t page_pool::refcount(int32_t page) const {
  check_page(page, "refcount");
  return pages_[page].refcount;
}

void page_pool::set_state(int32_t page, page_state s) {
  --count_[int(pages_[page].state)];
  ++count_[int(s)];
  pages_[page].state = s;
}

int32_t page_pool::take_page(page_state s) {
  int32_t p;
  if (!free_list_.empty()) {
    p = free_list_.back();
    free_list_.pop_back();
  } else {
    // Evict: the page leaves the prefix index; prompts that would have hit
    // it (and the pages chained after it) now compute it again.
    p = lru_.front();
    lru_.pop_front();
    auto& m = pages_[p];
    if (record_evictions_) {
      const auto first = page_tokens_.begin() + size_t(p) * page_size_;
      evicted_.push_back(
          {p, m.hash, m.parent_hash, m.depth, std::vector<int32_t>(first, first + page_size_)});
    }
    index_.erase(m.hash);
    m.hashed = false;
    ++counters_.evictions;
  }
  set_state(p, s);
  pages_[p].refcount = s == page_state::mapped ? 1 : 0;
  return p;
}

void page_pool::map_page(int32_t page) {
  auto& m = pages_[page];
  if (m.state == page_state::reusable) lru_.erase(m.lru_pos);
  if (m.state != page_state::mapped) set_state(page, page_state::mapped);
  ++m.refcount;
}

void page_pool::unmap_page(int32_t page) {
  auto& m = pages_[page];
  if (--m.refcount > 0) return;
  if (m.hashed) {
    set_state(page, page_state::reusable);
    m.lru_pos = lru_.insert(lru_.end(), page);
  } else {
    set_state(page, page_state::free);
    free_list_.push_back(page);
  }
}

// The last page is partially filled and the step writes into it: it must be
// this sequence's alone (refcount 1, after the copies already planned in
// this step released `shared_released` references) and not indexed (an
// indexed page's content must keep matching its hash).
bool page_pool::needs_copy(const sequence& s, int32_t shared_released) const {
  if (s.n_tokens % page_size_ == 0) return false;
  const auto& m = pages_[s.pages.back()];
  return m.refcount - shared_released > 1 || m.hashed;
}

step_allocation page_pool::allocate_step(const std::vector<alloc_request>& reqs) {
  static const sequence empty;
  std::unordered_set<uint64_t> seen;
  for (const auto& r : reqs) {
    if (r.tokens_needed < 0)
      misuse("allocate_step",
             seq_name(r.seq) + " asks for " + std::to_string(r.tokens_needed) + " tokens");
    if (!seen.insert(r.seq).second)
      misuse("allocate_step", seq_name(r.seq) + " appears twice in one step");
  }

  // Count first, so a refused step changes nothing.
  std::unordered_map<int32_t, int32_t> released;  // page -> references dropped by copies
  auto released_from = [&](const sequence& s) {
    if (s.pages.empty()) return 0;
    auto it = released.find(s.pages.back());
    return it == released.end() ? 0 : it->second;
  };
  int64_t need = 0;
  for (const auto& r : reqs) {
    auto it = seqs_.find(r.seq);
    const sequence& s = it == seqs_.end() ? empty : it->second;
    if (r.tokens_needed <= s.n_tokens) continue;
    need += pages_for(r.tokens_needed) - int64_t(s.pages.size());
    if (needs_copy(s, released_from(s))) {
      ++need;
      ++released[s.pages.back()];
    }
  }
  step_allocation out;
  if (need > available()) {
    out.pages_short = static_cast<int32_t>(need - available());
    ++counters_.alloc_failures;
    return out;
  }

  // Apply.  Pages replaced by a copy are released only after every page of
  // the step is taken, so none of them is handed out (and overwritten by
  // this step's forward pass) before its copy ran.
  released.clear();
  std::vector<int32_t> replaced;
  out.ok = true;
  out.tables.reserve(reqs.size());
  for (const auto& r : reqs) {
    sequence& s = seqs_[r.seq];
    if (r.tokens_needed > s.n_tokens) {
      if (needs_copy(s, released_from(s))) {
        int32_t src = s.pages.back();
        int32_t dst = take_page(page_state::mapped);
        out.copies.push_back({r.seq, src, dst, s.n_tokens % page_size_});
        s.pages.back() = dst;
        ++released[src];
        replaced.push_back(src);
      }
      while (int32_t(s.pages.size()) < pages_for(r.tokens_needed))
        s.pages.push_back(take_page(page_state::mapped));
      s.n_tokens = r.tokens_needed;
    }
    out.tables.push_back({r.seq, s.n_tokens, s.pages});
  }
  for (int32_t p : replaced) unmap_page(p);
  return out;
}

prefix_match page_pool::match_prefix(uint64_t seq, const std::vector<int32_t>& prompt) {
  auto it = seqs_.find(seq);
  if (it != seqs_.end() && !it->second.pages.empty())
    misuse("match_prefix",
           seq_name(seq) + " already holds " + std::to_string(it->second.pages.size()) + " pages");
  sequence& s = seqs_[seq];
  s.chain.clear();
  ++counters_.prefix_queries;
  counters_.prefix_query_tokens += prompt.size();

  // Full pages only, and not the prompt's last token.
  const size_t max_pages = prompt.empty() ? 0 : (prompt.size() - 1) / size_t(page_size_);
  uint64_t prev = 0;
  for (size_t i = 0; i < max_pages; ++i) {
    const int32_t* tokens = prompt.data() + i * page_size_;
    uint64_t h = page_hash(prev, tokens, page_size_, salt_);
    auto hit = index_.find(h);
    if (hit == index_.end()) break;
    int32_t p = hit->second;
    const int32_t* cached = page_tokens_.data() + size_t(p) * page_size_;
    // A 64-bit hash can collide: only a page with the same parent and the
    // same tokens is the same prefix.
    if (pages_[p].parent_hash != prev || !std::equal(tokens, tokens + page_size_, cached)) break;
    map_page(p);
    s.pages.push_back(p);
    s.chain.push_back(h);
    prev = h;
  }
  s.n_tokens = static_cast<int32_t>(s.pages.size()) * page_size_;
  counters_.prefix_hit_tokens += s.n_tokens;
  return {s.n_tokens, s.pages};
}

const std::vector<uint64_t>& page_pool::chain(uint64_t seq) const {
  return find(seq, "chain").chain;
}

int32_t page_pool::commit_full_pages(uint64_t seq, const std::vector<int32_t>& tokens) {
  sequence& s = find(seq, "commit_full_pages");
  const size_t full = std::min(tokens.size(), size_t(s.n_tokens)) / size_t(page_size_);
  int32_t indexed = 0;
  for (size_t i = s.chain.size(); i < full; ++i) {
    const int32_t* t = tokens.data() + i * page_size_;
    uint64_t prev = i == 0 ? 0 : s.chain[i - 1];
    uint64_t h = page_hash(prev, t, page_size_, salt_);
    int32_t p = s.pages[i];
    auto& m = pages_[p];
    if (m.hashed) {
      // Shared with a sequence that committed it first (after a fork).
      if (m.hash != h)
        misuse("commit_full_pages", seq_name(seq) + " page " + std::to_string(i) + " (arena page " +
                                        std::to_string(p) +
                                        ") is indexed for other tokens than the ones committed");
    } else if (!index_.count(h)) {
      // (When another page already holds this prefix, computed by a
      // sequence that started at the same time, this one stays unindexed.)
      m.hashed = true;
      m.hash = h;
      m.parent_hash = prev;
      m.depth = static_cast<int32_t>(i);
      std::copy(t, t + page_size_, page_tokens_.begin() + size_t(p) * page_size_);
      index_.emplace(h, p);
      ++indexed;
    }
    s.chain.push_back(h);
  }
  return indexed;
}

int32_t page_pool::fork(uint64_t parent, uint64_t child) {
  const sequence& s = find(parent, "fork");
  if (seqs_.count(child)) misuse("fork", "child " + seq_name(child) + " exists already");
  sequence copy = s;
  for (int32_t p : copy.pages) map_page(p);
  int32_t n = static_cast<int32_t>(copy.pages.size());
  seqs_.emplace(child, std::move(copy));
  return n;
}

int32_t page_pool::free_sequence(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  const auto& pages = it->second.pages;
  // Release the tail first: LRU then evicts a prefix's last pages before
  // its first ones, which more prompts share.
  for (auto p = pages.rbegin(); p != pages.rend(); ++p) unmap_page(*p);
  int32_t n = static_cast<int32_t>(pages.size());
  seqs_.erase(it);
  return n;
}

int32_t page_pool::truncate(uint64_t seq, int32_t n_tokens) {
  sequence& s = find(seq, "truncate");
  if (n_tokens < 0) misuse("truncate", seq_name(seq) + " to " + std::to_string(n_tokens));
  if (n_tokens >= s.n_tokens) return 0;
  const size_t keep = size_t(pages_for(n_tokens));
  int32_t dropped = static_cast<int32_t>(s.pages.size() - keep);
  while (s.pages.size() > keep) {
    unmap_page(s.pages.back());
    s.pages.pop_back();
  }
  s.chain.resize(std::min(s.chain.size(), size_t(n_tokens / page_size_)));
  s.n_tokens = n_tokens;
  return dropped;
}

seq_pages page_pool::export_pages(uint64_t seq) const {
  const sequence& s = find(seq, "export_pages");
  return {seq, s.n_tokens, s.pages};
}

std::vector<int32_t> page_pool::reserve(int32_t n) {
  if (n < 0) misuse("reserve", std::to_string(n) + " pages");
  std::vector<int32_t> out;
  if (n > available()) {
    ++counters_.alloc_failures;
    return out;
  }
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) out.push_back(take_page(page_state::allocated));
  return out;
}

void page_pool::attach(const seq_pages& t) {
  auto it = seqs_.find(t.seq);
  if (it != seqs_.end() && !it->second.pages.empty())
    misuse("attach", seq_name(t.seq) + " already holds pages");
  if (t.n_tokens < 0 || pages_for(t.n_tokens) != int32_t(t.pages.size()))
    misuse("attach", seq_name(t.seq) + ": " + std::to_string(t.pages.size()) + " pages for " +
                         std::to_string(t.n_tokens) + " tokens");
  std::unordered_set<int32_t> seen;
  for (int32_t p : t.pages) {
    check_page(p, "attach");
    if (pages_[p].state != page_state::allocated || !seen.insert(p).second)
      misuse("attach", seq_name(t.seq) + ": page " + std::to_string(p) +
                           " is not a reserved page (or appears twice)");
  }
  sequence& s = seqs_[t.seq];
  s.chain.clear();
  s.n_tokens = t.n_tokens;
  s.pages = t.pages;
  for (int32_t p : t.pages) map_page(p);
}

int32_t page_pool::unreserve(const std::vector<int32_t>& pages) {
  std::unordered_set<int32_t> seen;
  for (int32_t p : pages) {
    check_page(p, "unreserve");
    if (pages_[p].state != page_state::allocated || !seen.insert(p).second)
      misuse("unreserve",
             "page " + std::to_string(p) + " is not a reserved page (or appears twice)");
  }
  for (int32_t p : pages) {
    set_state(p, page_state::free);
    free_list_.push_back(p);
  }
  return static_cast<int32_t>(pages.size());
}

std::vector<uint64_t> page_pool::prompt_hashes(const std::vector<int32_t>& prompt) const {
  const size_t n = prompt.empty() ? 0 : (prompt.size() - 1) / size_t(page_size_);
  std::vector<uint64_t> out;
  out.reserve(n);
  uint64_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    prev = page_hash(prev, prompt.data() + i * page_size_, page_size_, salt_);
    out.push_back(prev);
  }
  return out;
}

int32_t page_pool::cached_pages(const std::vector<int32_t>& prompt) const {
  int32_t n = 0;
  uint64_t prev = 0;
  for (uint64_t h : prompt_hashes(prompt)) {
    auto hit = index_.find(h);
    if (hit == index_.end()) break;
    const int32_t p = hit->second;
    const int32_t* tokens = prompt.data() + size_t(n) * page_size_;
    if (pages_[p].parent_hash != prev ||
        !std::equal(tokens, tokens + page_size_, page_tokens_.begin() + size_t(p) * page_size_))
      break;
    prev = h;
    ++n;
  }
  return n;
}

void page_pool::append_loaded(uint64_t seq, int32_t page, uint64_t hash, uint64_t parent,
                              int32_t depth, const std::vector<int32_t>& tokens) {
  sequence& s = find(seq, "append_loaded");
  check_page(page, "append_loaded");
  if (pages_[page].state != page_state::allocated)
    misuse("append_loaded", "page " + std::to_string(page) + " is not a reserved page");
  if (int32_t(tokens.size()) != page_size_ || s.n_tokens != int32_t(s.pages.size()) * page_size_ ||
      depth != int32_t(s.pages.size()) || s.chain.size() != s.pages.size())
    misuse("append_loaded",
           seq_name(seq) + " does not end at a full, hashed page " + std::to_string(depth));
  map_page(page);
  s.pages.push_back(page);
  s.n_tokens += page_size_;
  s.chain.push_back(hash);
  auto& m = pages_[page];
  if (index_.count(hash)) return;
  m.hashed = true;
  m.hash = hash;
  m.parent_hash = parent;
  m.depth = depth;
  std::copy(tokens.begin(), tokens.end(), page_tokens_.begin() + size_t(page) * page_size_);
  index_.emplace(hash, page);
}

bool page_pool::indexes(int32_t page, uint64_t hash) const {
  check_page(page, "indexes");
  return pages_[page].hashed && pages_[page].hash == hash;
}

void page_pool::forget(int32_t page) {
  check_page(page, "forget");
  auto& m = pages_[page];
  if (!m.hashed) return;
  auto it = index_.find(m.hash);
  if (it != index_.end() && it->second == page) index_.erase(it);
  m.hashed = false;
  if (m.state == page_state::reusable) {
    lru_.erase(m.lru_pos);
    set_state(page, page_state::free);
    free_list_.push_back(page);
  }
}

std::vector<uint64_t> page_pool::indexed_hashes() const {
  std::vector<uint64_t> out;
  out.reserve(index_.size());
  for (const auto& [hash, page] : index_) out.push_back(hash);
  return out;
}

pool_stats page_pool::stats() const {
  pool_stats st = counters_;
  st.total = n_pages();
  st.free = count_[int(page_state::free)];
  st.allocated = count_[int(page_state::allocated)];
  st.mapped = count_[int(page_state::mapped)];
  st.reusable = count_[int(page_state::reusable)];
  st.sequences = static_cast<int32_t>(seqs_.size());
  // A page shared by several tables counts once, as full as its fullest use.
  std::vector<int32_t> filled(pages_.size(), 0);
  for (const auto& [id, s] : seqs_)
    for (size_t i = 0; i < s.pages.size(); ++i) {
      int32_t in_page = std::min<int32_t>(page_size_, s.n_tokens - int32_t(i) * page_size_);
      filled[s.pages[i]] = std::max(filled[s.pages[i]], in_page);
    }
  st.cached_tokens = 0;
  for (int32_t f : filled) st.cached_tokens += f;
  return st;
}

std::string page_pool::check_invariants() const {
  auto page = [](int32_t p) { return "page " + std::to_string(p) + " "; };
  const int n = n_pages();
  std::vector<int32_t> refs(n, 0);
  for (const auto& [id, s] : seqs_) {
    if (int32_t(s.pages.size()) != pages_for(s.n_tokens))
      return seq_name(id) + " holds " + std::to_string(s.pages.size()) + " pages for " +
             std::to_string(s.n_tokens) + " tokens";
    if (s.chain.size() > size_t(s.n_tokens / page_size_))
      return seq_name(id) + " has " + std::to_string(s.chain.size()) + " hashed pages for " +
             std::to_string(s.n_tokens) + " tokens";
    std::unordered_set<int32_t> in_table;
    for (size_t i = 0; i < s.pages.size(); ++i) {
      int32_t p = s.pages[i];
      if (p < 0 || p >= n) return seq_name(id) + " maps " + page(p) + "outside the arena";
      if (!in_table.insert(p).second) return seq_name(id) + " maps " + page(p) + "twice";
      if (i < s.chain.size() && pages_[p].hashed && pages_[p].hash != s.chain[i])
        return seq_name(id) + " chains " + page(p) + "under another hash than its index entry";
      ++refs[p];
    }
  }
  int counts[4] = {0, 0, 0, 0};
  for (int p = 0; p < n; ++p) {
    const auto& m = pages_[p];
    ++counts[int(m.state)];
    if (m.refcount != refs[p])
      return page(p) + "has refcount " + std::to_string(m.refcount) + " but " +
             std::to_string(refs[p]) + " tables hold it";
    if ((m.state == page_state::mapped) != (refs[p] > 0))
      return page(p) + "is " + to_string(m.state) + " while " + std::to_string(refs[p]) +
             " tables hold it";
    if (m.state == page_state::reusable && !m.hashed) return page(p) + "is reusable but unindexed";
    if ((m.state == page_state::free || m.state == page_state::allocated) && m.hashed)
      return page(p) + "is " + to_string(m.state) + " but still indexed";
    if (m.hashed) {
      auto it = index_.find(m.hash);
      if (it == index_.end() || it->second != p) return page(p) + "is missing from the index";
    }
  }
  for (int s = 0; s < 4; ++s)
    if (counts[s] != count_[s])
      return std::string("count of ") + to_string(page_state(s)) + " pages is " +
             std::to_string(count_[s]) + ", recounted " + std::to_string(counts[s]);
  if (counts[0] + counts[1] + counts[2] + counts[3] != n)
    return "states add up to " + std::to_string(counts[0] + counts[1] + counts[2] + counts[3]) +
           " pages of " + std::to_string(n);
  for (const auto& [h, p] : index_)
    if (p < 0 || p >= n || !pages_[p].hashed || pages_[p].hash != h)
      return "index entry for " + page(p) + "is stale";
  std::vector<char> listed(n, 0);
  for (int32_t p : free_list_) {
    if (p < 0 || p >= n || pages_[p].state != page_state::free || listed[p])
      return "free list holds " + page(p) + "wrongly";
    listed[p] = 1;
  }
  if (int(free_list_.size()) != counts[int(page_state::free)])
    return "free list holds " + std::to_string(free_list_.size()) + " of " +
           std::to_string(counts[int(page_state::free)]) + " free pages";
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    int32_t p = *it;
    if (p < 0 || p >= n || pages_[p].state != page_state::reusable || listed[p] ||
        pages_[p].lru_pos != it)
      return "LRU list holds " + page(p) + "wrongly";
    listed[p] = 1;
  }
  if (int(lru_.size()) != counts[int(page_state::reusable)])
    return "LRU list holds " + std::to_string(lru_.size()) + " of " +
           std::to_string(counts[int(page_state::reusable)]) + " reusable pages";
  return {};
}

}  // namespace troupe
