#include "runtime/text/regex_dfa.hpp"

#include <algorithm>
#include <bitset>
#include <deque>
#include <memory>

namespace troupe {

namespace {

struct node {
  enum kind_t { bytes, concat, alt, repeat } kind = bytes;
  std::bitset<256> set;
  std::vector<std::unique_ptr<node>> kids;
  int min = 0, max = 0;  // repeat; max -1: unbounded
};
using node_ptr = std::unique_ptr<node>;

node_ptr make(node::kind_t k) {
  auto n = std::make_unique<node>();
  n->kind = k;
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

  static std::bitset<256> class_of(char c) {
    std::bitset<256> s;
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
    if (c == 'D' || c == 'W' || c == 'S') s.flip();
    return s;
  }

  // After a backslash: a class or one byte.
  std::bitset<256> escape() {
    if (!more()) fail("a pattern ending in '\\'");
    const char c = p[i++];
    if (std::string("dDwWsS").find(c) != std::string::npos) return class_of(c);
    std::bitset<256> s;
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
    } else if (std::isalnum(static_cast<unsigned char>(c)))
      fail(std::string("the escape \\") + c + " is not supported");
    else
      s.set(size_t(uint8_t(c)));
    return s;
  }

  std::bitset<256> bracket() {
    std::bitset<256> s;
    bool negate = false;
    if (more() && peek() == '^') negate = true, ++i;
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      std::bitset<256> item;
      int lo = -1;
      if (peek() == '\\') {
        ++i;
        item = escape();
        if (item.count() == 1)
          for (int b = 0; b < 256; ++b)
            if (item[size_t(b)]) lo = b;
      } else {
        lo = uint8_t(p[i++]);
        item.set(size_t(lo));
      }
      if (lo >= 0 && i + 1 < p.size() && peek() == '-' && p[i + 1] != ']') {
        ++i;
        int hi;
        if (peek() == '\\') {
          ++i;
          auto e = escape();
          if (e.count() != 1) fail("a class as a range's end");
          hi = 0;
          for (int b = 0; b < 256; ++b)
            if (e[size_t(b)]) hi = b;
        } else {
          hi = uint8_t(p[i++]);
        }
        if (hi < lo) fail("a range whose end is below its start");
        for (int b = lo; b <= hi; ++b) item.set(size_t(b));
      }
      s |= item;
    }
    if (!more()) fail("']' expected");
    ++i;
    if (negate) s.flip();
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
        b->set = bracket();
        return b;
      case '.':
        b->set.set();
        b->set.reset('\n');
        return b;
      case '\\':
        b->set = escape();
        return b;
      case '*':
      case '+':
      case '?':
      case '{':
        fail(std::string("a quantifier '") + c + "' with nothing to repeat");
      case '^':
      case '$':
        fail("anchors are not supported (the whole output always matches)");
      default:
        b->set.set(size_t(uint8_t(c)));
        return b;
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

  // Builds `n` between two new states; returns them.
  std::pair<int, int> build(const node& n) {
    const int s = state(), e = state();
    switch (n.kind) {
      case node::bytes: {
        for (int b = 0; b < 256;) {
          if (!n.set[size_t(b)]) {
            ++b;
            continue;
          }
          int hi = b;
          while (hi + 1 < 256 && n.set[size_t(hi + 1)]) ++hi;
          edges[size_t(s)].push_back({b, hi, e});
          b = hi + 1;
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
