#include "runtime/text/regex_dfa.hpp"

#include <algorithm>
#include <bitset>
#include <deque>
#include <memory>
#include <utility>

#include "runtime/text/unicode.hpp"

namespace troupe {

namespace {

// A byte range sequence: the UTF-8 forms of a run of code points.
using utf8_seq = std::vector<std::pair<uint8_t, uint8_t>>;

struct node {
  // utf8: a character class, its single bytes in set and its code points
  // beyond ASCII as UTF-8 sequences (seqs).
  enum kind_t { bytes, concat, alt, repeat, utf8 } kind = bytes;
  std::bitset<256> set;
  std::vector<utf8_seq> seqs;
  std::vector<std::unique_ptr<node>> kids;
  int min = 0, max = 0;  // repeat; max -1: unbounded
};
using node_ptr = std::unique_ptr<node>;

node_ptr make(node::kind_t k) {
  auto n = std::make_unique<node>();
  n->kind = k;
  return n;
}

// A set of characters: single bytes (ASCII, and \x80-\xff where the
// pattern writes them as such) and code points from U+0080 on, which match
// as their UTF-8 sequences.  Classes are of characters, not bytes, so that
// '.', [^...], \D, \W, \S and a range such as [一-鿿] match whole
// characters: byte by byte, [一-鿿] matched any byte of their encodings and
// "á" came out, a quantifier after a character repeated its last byte, and
// '.' could emit invalid UTF-8.
struct char_class {
  std::bitset<256> bytes;
  std::vector<std::pair<uint32_t, uint32_t>> cps;  // [lo, hi], lo >= 0x80

  void add_range(uint32_t lo, uint32_t hi) {
    for (; lo <= hi && lo < 0x80; ++lo) bytes.set(lo);
    if (lo <= hi) cps.emplace_back(lo, hi);
  }
  void add(const char_class& o) {
    bytes |= o.bytes;
    cps.insert(cps.end(), o.cps.begin(), o.cps.end());
  }
  // Every code point from U+0080 on (no surrogates: normalize drops them).
  void add_all_non_ascii() { cps.emplace_back(0x80, 0x10FFFF); }

  // Sorted, merged, without the surrogates U+D800-U+DFFF (no characters).
  void normalize() {
    std::vector<std::pair<uint32_t, uint32_t>> out;
    std::sort(cps.begin(), cps.end());
    for (auto [lo, hi] : cps) {
      if (!out.empty() && lo <= out.back().second + 1)
        out.back().second = std::max(out.back().second, hi);
      else
        out.emplace_back(lo, hi);
    }
    cps.clear();
    for (auto [lo, hi] : out) {
      if (lo < 0xD800 && hi >= 0xD800) {
        cps.emplace_back(lo, 0xD7FF);
        lo = 0xE000;
      } else if (lo >= 0xD800 && lo <= 0xDFFF) {
        lo = 0xE000;
      }
      if (lo <= hi) cps.emplace_back(lo, hi);
    }
  }
  // The characters not in the class: ASCII flipped, the code points from
  // U+0080 on complemented (bytes \x80-\xff have no complement among
  // characters: the caller refuses them).
  void negate() {
    for (size_t b = 0; b < 0x80; ++b) bytes.flip(b);
    normalize();
    std::vector<std::pair<uint32_t, uint32_t>> out;
    uint32_t next = 0x80;
    for (auto [lo, hi] : cps) {
      if (lo > next) out.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
    cps = std::move(out);
  }
};

// The code points [lo, hi] (no surrogates; lo >= 0x80) as sequences of
// byte ranges, each matching exactly the UTF-8 forms of a sub-range: split
// where the encoded length changes, then where a continuation byte's range
// would not be whole (the split of RE2 and Rust's utf8-ranges).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<utf8_seq>& out) {
  for (uint32_t top : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= top && hi > top) {
      utf8_sequences(lo, top, out);
      utf8_sequences(top + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = unicode::to_utf8(lo), b = unicode::to_utf8(hi);
  utf8_seq seq;
  for (size_t k = 0; k < a.size(); ++k)
    seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(seq));
}

// A class as a node: its single bytes, and its code points' UTF-8
// sequences (the builder shares their continuation-byte tails, so '.' is
// about ten NFA states, not seventy).
node_ptr class_node(char_class c) {
  c.normalize();
  auto n = make(c.cps.empty() ? node::bytes : node::utf8);
  n->set = c.bytes;
  for (auto [lo, hi] : c.cps) utf8_sequences(lo, hi, n->seqs);
  return n;
}

}  // namespace

struct regex_parser {
  const std::string& p;
  size_t i = 0;
  // Groups and quantifiers open around the parse position.  The parser,
  // the NFA builder and the tree's destructor recurse once per level, so an
  // unbounded depth ("((((...", "a****...") would end the process on a
  // stack overflow; no real pattern comes near the limit.
  int depth = 0;

  [[noreturn]] void fail(const std::string& what) const {
    // A pattern may be megabytes long: the error quotes its start only.
    const size_t shown = 80;
    const std::string quoted = p.size() <= shown ? p : p.substr(0, shown) + "...";
    throw regex_error("regex: " + what + " at offset " + std::to_string(i) + " of '" + quoted +
                      "'");
  }
  void deeper() {
    if (++depth > k_regex_max_depth)
      fail("groups and quantifiers nested deeper than " + std::to_string(k_regex_max_depth) +
           " levels");
  }
  bool more() const { return i < p.size(); }
  char peek() const { return p[i]; }

  node_ptr alternation() {
    auto first = sequence();
    if (!more() || peek() != '|') return first;
    auto a = make(node::alt);
    a->kids.push_back(std::move(first));
    while (more() && peek() == '|') {
      ++i;
      a->kids.push_back(sequence());
    }
    return a;
  }

  node_ptr sequence() {
    auto c = make(node::concat);
    while (more() && peek() != '|' && peek() != ')') c->kids.push_back(repeated());
    return c;
  }

  int number() {
    if (!more() || !std::isdigit(static_cast<unsigned char>(peek()))) fail("a number expected");
    int n = 0;
    while (more() && std::isdigit(static_cast<unsigned char>(peek()))) {
      n = n * 10 + (p[i++] - '0');
      if (n > k_regex_max_repeat)
        fail("a repeat count above " + std::to_string(k_regex_max_repeat));
    }
    return n;
  }

  node_ptr repeated() {
    const int outer = depth;
    auto a = atom();
    while (more()) {
      int lo = 0, hi = 0;
      const char q = peek();
      if (q == '*')
        lo = 0, hi = -1;
      else if (q == '+')
        lo = 1, hi = -1;
      else if (q == '?')
        lo = 0, hi = 1;
      else if (q == '{') {
        ++i;
        lo = number();
        hi = lo;
        if (more() && peek() == ',') {
          ++i;
          hi = more() && peek() == '}' ? -1 : number();
        }
        if (!more() || peek() != '}') fail("'}' expected");
        if (hi != -1 && hi < lo) fail("{m,n} with n < m");
      } else {
        break;
      }
      ++i;
      deeper();  // each quantifier wraps what came before in one more level
      auto r = make(node::repeat);
      r->min = lo;
      r->max = hi;
      r->kids.push_back(std::move(a));
      a = std::move(r);
    }
    depth = outer;
    return a;
  }

  // \d \w \s (ASCII) and their complements among all characters.
  static char_class class_of(char c) {
    char_class cc;
    auto& s = cc.bytes;
    auto range = [&](int lo, int hi) {
      for (int b = lo; b <= hi; ++b) s.set(size_t(b));
    };
    switch (c) {
      case 'd':
      case 'D':
        range('0', '9');
        break;
      case 'w':
      case 'W':
        range('0', '9'), range('a', 'z'), range('A', 'Z'), s.set('_');
        break;
      case 's':
      case 'S':
        for (char x : {' ', '\t', '\n', '\r', '\f', '\v'}) s.set(size_t(uint8_t(x)));
        break;
      default:
        break;
    }
    if (c == 'D' || c == 'W' || c == 'S') cc.negate();
    return cc;
  }

  // The character at the parse position (a literal: an ASCII byte or a
  // whole UTF-8 sequence), as its code point.
  uint32_t literal() {
    const int n = unicode::valid_sequence_length(p, i);
    if (n <= 0) fail("invalid UTF-8 in the pattern");
    size_t at = i;
    const uint32_t cp = unicode::decode_next(p, at);
    i += static_cast<size_t>(n);
    return cp;
  }

  // After a backslash: a class, one character, or (\x80-\xff) one byte.
  char_class escape() {
    if (!more()) fail("a pattern ending in '\\'");
    const char c = p[i++];
    if (std::string("dDwWsS").find(c) != std::string::npos) return class_of(c);
    char_class cc;
    auto& s = cc.bytes;
    if (c == 'n')
      s.set('\n');
    else if (c == 't')
      s.set('\t');
    else if (c == 'r')
      s.set('\r');
    else if (c == 'f')
      s.set('\f');
    else if (c == 'v')
      s.set('\v');
    else if (c == 'x') {
      auto hex = [&](char h) -> int {
        if (h >= '0' && h <= '9') return h - '0';
        if (h >= 'a' && h <= 'f') return h - 'a' + 10;
        if (h >= 'A' && h <= 'F') return h - 'A' + 10;
        fail("\\x needs two hex digits");
      };
      if (i + 2 > p.size()) fail("\\x needs two hex digits");
      const int v = hex(p[i]) * 16 + hex(p[i + 1]);
      i += 2;
      s.set(size_t(v));
    } else if (std::isalnum(static_cast<unsigned char>(c))) {
      fail(std::string("the escape \\") + c + " is not supported");
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      --i;  // a backslash before a character beyond ASCII: that character
      const uint32_t cp = literal();
      cc.add_range(cp, cp);
    } else {
      s.set(size_t(uint8_t(c)));
    }
    return cc;
  }

  // The one character (code point) or \x byte a class item names, if it
  // names one; *is_byte for \x80-\xff.
  static bool single_of(const char_class& c, uint32_t& v, bool& is_byte) {
    if (c.bytes.count() + c.cps.size() != 1) return false;
    if (!c.cps.empty()) {
      if (c.cps[0].first != c.cps[0].second) return false;
      v = c.cps[0].first;
      is_byte = false;
      return true;
    }
    for (uint32_t b = 0; b < 256; ++b)
      if (c.bytes[b]) v = b;
    is_byte = v >= 0x80;
    return true;
  }

  // One class item: an escape or a literal character.
  char_class class_item() {
    if (peek() == '\\') {
      ++i;
      return escape();
    }
    char_class c;
    const uint32_t cp = literal();
    c.add_range(cp, cp);
    return c;
  }

  char_class bracket() {
    char_class s;
    bool negate = false;
    if (more() && peek() == '^') negate = true, ++i;
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      char_class item = class_item();
      uint32_t lo = 0;
      bool lo_byte = false;
      const bool single = single_of(item, lo, lo_byte);
      if (single && i + 1 < p.size() && peek() == '-' && p[i + 1] != ']') {
        ++i;
        const char_class end = class_item();
        uint32_t hi = 0;
        bool hi_byte = false;
        if (!single_of(end, hi, hi_byte)) fail("a class as a range's end");
        if (hi < lo) fail("a range whose end is below its start");
        if (hi_byte ? !lo_byte && lo >= 0x80 : lo_byte)
          fail("a range between a \\x80-\\xff byte and a character");
        item = char_class{};
        if (hi_byte) {  // \x bytes up to \xff (from ASCII or a byte): bytes
          for (uint32_t b = lo; b <= hi; ++b) item.bytes.set(b);
        } else {
          item.add_range(lo, hi);
        }
      }
      s.add(item);
    }
    if (!more()) fail("']' expected");
    ++i;
    if (negate) {
      for (size_t b = 0x80; b < 256; ++b)
        if (s.bytes[b]) fail("a negated class with \\x80-\\xff bytes (write characters)");
      s.negate();
    }
    return s;
  }

  node_ptr atom() {
    if (!more()) fail("an atom expected");
    const char c = p[i++];
    auto b = make(node::bytes);
    switch (c) {
      case '(': {
        if (i + 1 < p.size() && peek() == '?' && p[i + 1] == ':') i += 2;
        deeper();
        auto inner = alternation();
        --depth;
        if (!more() || peek() != ')') fail("')' expected");
        ++i;
        return inner;
      }
      case '[':
        return class_node(bracket());
      case '.': {  // any character but a line break
        char_class any;
        any.add_range(0, 0x7F);
        any.bytes.reset('\n');
        any.add_all_non_ascii();
        return class_node(std::move(any));
      }
      case '\\':
        return class_node(escape());
      case '*':
      case '+':
      case '?':
      case '{':
        fail(std::string("a quantifier '") + c + "' with nothing to repeat");
      case '^':
      case '$':
        fail("anchors are not supported (the whole output always matches)");
      default:
        if (static_cast<unsigned char>(c) < 0x80) {
          b->set.set(size_t(uint8_t(c)));
          return b;
        }
        // A character beyond ASCII: its whole UTF-8 sequence, one atom (a
        // quantifier after it repeats all of it).
        --i;
        char_class one;
        const uint32_t cp = literal();
        one.add_range(cp, cp);
        return class_node(std::move(one));
    }
  }
};

namespace {

struct builder {
  std::vector<std::vector<std::array<int, 3>>>& edges;
  std::vector<std::vector<int>>& eps;
  size_t max;

  int state() {
    if (edges.size() >= max) throw regex_error("regex: the pattern is too large");
    edges.emplace_back();
    eps.emplace_back();
    return int(edges.size() - 1);
  }

  // Edges s -> e for the bytes of `set`, a range each.
  void byte_edges(int s, const std::bitset<256>& set, int e) {
    for (int b = 0; b < 256;) {
      if (!set[size_t(b)]) {
        ++b;
        continue;
      }
      int hi = b;
      while (hi + 1 < 256 && set[size_t(hi + 1)]) ++hi;
      edges[size_t(s)].push_back({b, hi, e});
      b = hi + 1;
    }
  }

  // Builds `n` between two new states; returns them.
  std::pair<int, int> build(const node& n) {
    const int s = state(), e = state();
    switch (n.kind) {
      case node::bytes:
        byte_edges(s, n.set, e);
        break;
      case node::utf8: {
        byte_edges(s, n.set, e);
        // tail[k]: k continuation bytes (0x80-0xBF) still to come, then e.
        int tail[4] = {e, -1, -1, -1};
        auto tail_of = [&](size_t k) {
          for (size_t j = 1; j <= k; ++j)
            if (tail[j] < 0) {
              const int t = state();
              edges[size_t(t)].push_back({0x80, 0xBF, tail[j - 1]});
              tail[j] = t;
            }
          return tail[k];
        };
        for (const auto& seq : n.seqs) {
          int cur = s;
          for (size_t k = 0; k < seq.size(); ++k) {
            bool rest_full = true;
            for (size_t j = k + 1; j < seq.size(); ++j)
              rest_full = rest_full && seq[j].first == 0x80 && seq[j].second == 0xBF;
            const int to = rest_full ? tail_of(seq.size() - 1 - k) : state();
            edges[size_t(cur)].push_back({seq[k].first, seq[k].second, to});
            if (rest_full) break;
            cur = to;
          }
        }
        break;
      }
      case node::concat: {
        int at = s;
        for (const auto& k : n.kids) {
          auto [ks, ke] = build(*k);
          eps[size_t(at)].push_back(ks);
          at = ke;
        }
        eps[size_t(at)].push_back(e);
        break;
      }
      case node::alt:
        for (const auto& k : n.kids) {
          auto [ks, ke] = build(*k);
          eps[size_t(s)].push_back(ks);
          eps[size_t(ke)].push_back(e);
        }
        break;
      case node::repeat: {
        int at = s;
        for (int r = 0; r < n.min; ++r) {
          auto [ks, ke] = build(*n.kids[0]);
          eps[size_t(at)].push_back(ks);
          at = ke;
        }
        if (n.max == -1) {
          auto [ks, ke] = build(*n.kids[0]);
          eps[size_t(at)].push_back(ks);
          eps[size_t(ke)].push_back(ks);
          eps[size_t(ke)].push_back(e);
          eps[size_t(at)].push_back(e);
        } else {
          for (int r = n.min; r < n.max; ++r) {
            auto [ks, ke] = build(*n.kids[0]);
            eps[size_t(at)].push_back(ks);
            eps[size_t(at)].push_back(e);
            at = ke;
          }
          eps[size_t(at)].push_back(e);
        }
        break;
      }
    }
    return {s, e};
  }
};

}  // namespace

regex_dfa::regex_dfa(const std::string& pattern, size_t max_nfa_states, uint64_t max_work)
    : max_states_(max_nfa_states), max_work_(max_work) {
  regex_parser parser{pattern};
  auto root = parser.alternation();
  if (parser.more()) parser.fail("unbalanced ')'");
  std::vector<std::vector<std::array<int, 3>>> edges;
  std::vector<std::vector<int>> eps;
  builder b{edges, eps, max_nfa_states};
  auto [s, e] = b.build(*root);
  nfa_.resize(edges.size());
  for (size_t k = 0; k < edges.size(); ++k) {
    nfa_[k].edges = std::move(edges[k]);
    nfa_[k].eps = std::move(eps[k]);
  }
  nfa_start_ = s;
  nfa_accept_ = e;
  if (!accept_reachable())
    throw regex_error("regex: the pattern matches no text (a class or range with no byte in it)");
  measure_to_end();
  dfa_state({nfa_start_});
}

// Shortest paths to the accept state over the reversed NFA, a byte edge
// costing 1 and an epsilon edge 0 (a 0-1 breadth-first search).
void regex_dfa::measure_to_end() {
  std::vector<std::vector<std::pair<int, int>>> into(nfa_.size());  // (from, cost)
  for (size_t x = 0; x < nfa_.size(); ++x) {
    for (const auto& edge : nfa_[x].edges) into[size_t(edge[2])].push_back({int(x), 1});
    for (int y : nfa_[x].eps) into[size_t(y)].push_back({int(x), 0});
  }
  nfa_to_end_.assign(nfa_.size(), k_unreachable);
  std::deque<int> queue{nfa_accept_};
  nfa_to_end_[size_t(nfa_accept_)] = 0;
  while (!queue.empty()) {
    const int y = queue.front();
    queue.pop_front();
    for (auto [x, cost] : into[size_t(y)]) {
      const int32_t d = nfa_to_end_[size_t(y)] + cost;
      if (d >= nfa_to_end_[size_t(x)]) continue;
      nfa_to_end_[size_t(x)] = d;
      if (cost == 0)
        queue.push_front(x);
      else
        queue.push_back(x);
    }
  }
  for (int32_t d : nfa_to_end_)
    if (d != k_unreachable) longest_ = std::max(longest_, d);
}

int32_t regex_dfa::bytes_to_end(int state) const {
  return state < 0 ? k_unreachable : to_end_[size_t(state)];
}

bool regex_dfa::accept_reachable() const {
  std::vector<char> seen(nfa_.size(), 0);
  std::vector<int> stack{nfa_start_};
  seen[size_t(nfa_start_)] = 1;
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    if (x == nfa_accept_) return true;
    auto visit = [&](int y) {
      if (!seen[size_t(y)]) seen[size_t(y)] = 1, stack.push_back(y);
    };
    for (const auto& edge : nfa_[size_t(x)].edges) visit(edge[2]);
    for (int y : nfa_[size_t(x)].eps) visit(y);
  }
  return false;
}

void regex_dfa::too_complex() {
  exhausted_ = true;
  sets_ = {};
  next_ = {};
  ids_ = {};
  seen_ = {};
  entries_ = 0;
  throw regex_error("regex: the pattern is too complex to follow (its automaton passed " +
                    std::to_string(k_regex_max_entries) + " NFA states held or " +
                    std::to_string(max_work_) + " steps)");
}

void regex_dfa::closure(std::vector<int>& set) {
  // The seen marks are stamps, so a closure costs its own states, not a
  // clearing of the whole NFA's table each time.
  if (seen_.size() != nfa_.size()) seen_.assign(nfa_.size(), 0);
  if (++stamp_ == 0) {
    std::fill(seen_.begin(), seen_.end(), 0u);
    stamp_ = 1;
  }
  std::vector<int> stack = set;
  for (int x : set) seen_[size_t(x)] = stamp_;
  work_ += set.size();
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    work_ += nfa_[size_t(x)].eps.size() + 1;
    for (int y : nfa_[size_t(x)].eps)
      if (seen_[size_t(y)] != stamp_) {
        seen_[size_t(y)] = stamp_;
        set.push_back(y);
        stack.push_back(y);
      }
  }
  std::sort(set.begin(), set.end());
}

int regex_dfa::dfa_state(std::vector<int> set) {
  closure(set);
  if (work_ > max_work_) too_complex();
  if (auto it = ids_.find(set); it != ids_.end()) return it->second;
  if (sets_.size() >= 100000) throw regex_error("regex: the pattern needs too many states");
  entries_ += set.size();
  if (entries_ > k_regex_max_entries) too_complex();
  const int id = int(sets_.size());
  accept_.push_back(std::binary_search(set.begin(), set.end(), nfa_accept_));
  int32_t to_end = k_unreachable;
  for (int x : set) to_end = std::min(to_end, nfa_to_end_[size_t(x)]);
  to_end_.push_back(to_end);
  std::array<int, 256> unknown;
  unknown.fill(-2);
  next_.push_back(unknown);
  ids_.emplace(set, id);
  sets_.push_back(std::move(set));
  return id;
}

int regex_dfa::step(int state, uint8_t byte) {
  if (state < 0) return -1;
  if (exhausted_) too_complex();
  int& cached = next_[size_t(state)][byte];
  if (cached != -2) return cached;
  std::vector<int> to;
  for (int x : sets_[size_t(state)]) {
    work_ += nfa_[size_t(x)].edges.size() + 1;
    for (const auto& [lo, hi, y] : nfa_[size_t(x)].edges)
      if (byte >= lo && byte <= hi) to.push_back(y);
  }
  const int next = to.empty() ? -1 : dfa_state(std::move(to));
  next_[size_t(state)][byte] = next;  // (dfa_state may have grown next_)
  return next;
}

int regex_dfa::step(int state, const std::string& bytes) {
  for (unsigned char c : bytes) {
    state = step(state, c);
    if (state < 0) return -1;
  }
  return state;
}

bool regex_dfa::final(int state) {
  for (int b = 0; b < 256; ++b)
    if (step(state, uint8_t(b)) >= 0) return false;
  return true;
}

std::string regex_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string("\\.^$|?*+()[]{}-/").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace troupe
