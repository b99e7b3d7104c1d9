#include "runtime/text/jinja.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

namespace troupe::jinja {

namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw std::runtime_error("jinja: line " + std::to_string(line) + ": " + what);
}

// ------------------------------------------------------------ segments

struct segment {
  enum kind_t { text, expr, stmt } kind;
  std::string body;
  int line;
};

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Line numbers of increasing positions, counted once (a cursor).
struct line_counter {
  const std::string& s;
  size_t at = 0;
  int line = 1;
  int operator()(size_t pos) {
    for (; at < pos && at < s.size(); ++at)
      if (s[at] == '\n') ++line;
    return line;
  }
};

// Cuts the source into text, {{ }} and {% %} segments (comments dropped),
// applying whitespace control and Hugging Face's trim_blocks and
// lstrip_blocks.
std::vector<segment> split_segments(const std::string& src) {
  std::vector<segment> out;
  line_counter line_at{src};
  bool trim_next = false;   // a "-" closer: strip all blanks from the next text
  bool block_next = false;  // trim_blocks: drop one newline after a block tag
  size_t pos = 0;
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (trim_next) {
      size_t b = 0;
      while (b < text.size() && is_blank(text[b])) ++b;
      text.erase(0, b);
    } else if (block_next) {
      if (text.rfind("\r\n", 0) == 0)
        text.erase(0, 2);
      else if (!text.empty() && text[0] == '\n')
        text.erase(0, 1);
    }
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({segment::text, text, line_at(pos)});
      break;
    }
    const char kind = src[open + 1];
    const bool strip_before = open + 2 < src.size() && src[open + 2] == '-';
    const bool keep_before = open + 2 < src.size() && src[open + 2] == '+';
    if (strip_before) {
      while (!text.empty() && is_blank(text.back())) text.pop_back();
    } else if ((kind == '%' || kind == '#') && !keep_before) {
      // lstrip_blocks: the blanks from the start of the source line up to a
      // block tag (a newline trim_blocks removed still starts the line).
      size_t i = open;
      while (i > 0 && (src[i - 1] == ' ' || src[i - 1] == '\t')) --i;
      if (i == 0 || src[i - 1] == '\n') {
        size_t n = 0;
        while (n < text.size() && n < open - i &&
               (text[text.size() - 1 - n] == ' ' || text[text.size() - 1 - n] == '\t'))
          ++n;
        text.erase(text.size() - n);
      }
    }
    if (!text.empty()) out.push_back({segment::text, text, line_at(pos)});
    const std::string closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t body_at = open + 2 + ((strip_before || keep_before) ? 1 : 0);
    // The closer outside string literals ('}}' inside a quoted string is text).
    size_t close = std::string::npos;
    if (kind == '#') {
      close = src.find(closer, body_at);
    } else {
      // ... and outside a dict literal's braces ({{ {'a': {'b': 1}} }}).
      char quote = 0;
      int braces = 0;
      for (size_t i = body_at; i + 1 < src.size(); ++i) {
        if (quote) {
          if (src[i] == '\\')
            ++i;
          else if (src[i] == quote)
            quote = 0;
        } else if (src[i] == '\'' || src[i] == '"') {
          quote = src[i];
        } else if (braces == 0 && src.compare(i, 2, closer) == 0) {
          close = i;
          break;
        } else if (src[i] == '{') {
          ++braces;
        } else if (src[i] == '}' && braces > 0) {
          --braces;
        }
      }
    }
    const int line = line_at(open);
    if (close == std::string::npos) fail(line, "a tag opened here is never closed");
    size_t body_end = close;
    trim_next = close > body_at && src[close - 1] == '-';
    if (trim_next) --body_end;
    block_next = kind != '{';
    if (kind != '#')
      out.push_back({kind == '{' ? segment::expr : segment::stmt,
                     src.substr(body_at, body_end - body_at), line});
    pos = close + 2;
  }
  return out;
}

// ------------------------------------------------------------ tokens

struct token {
  enum kind_t { t_name, t_str, t_num, t_op, t_end } kind = t_end;
  std::string text;
  value num;
};

std::vector<token> tokenize(const std::string& s, int line) {
  std::vector<token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_blank(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({token::t_name, s.substr(i, j - i), {}});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !real && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        real = real || s[j] == '.';
        ++j;
      }
      const std::string t = s.substr(i, j - i);
      token tk{token::t_num, t, {}};
      try {
        tk.num = real ? value(std::stod(t)) : value(std::stoll(t));
      } catch (const std::exception&) {
        fail(line, "number '" + t + "' out of range");
      }
      out.push_back(tk);
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 == s.size()) {
          v += s[j];
          continue;
        }
        switch (s[++j]) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          default:
            v += s[j];
        }
      }
      if (j >= s.size()) fail(line, "a string is never closed");
      out.push_back({token::t_str, v, {}});
      i = j + 1;
      continue;
    }
    static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
    bool matched = false;
    for (const char* t : two) {
      if (s.compare(i, 2, t) == 0) {
        out.push_back({token::t_op, t, {}});
        i += 2;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (std::string("+-*/%~|.,:()[]{}=<>!").find(c) == std::string::npos)
      fail(line, std::string("unexpected character '") + c + "'");
    out.push_back({token::t_op, std::string(1, c), {}});
    ++i;
  }
  // Chains (a + b + ...) evaluate recursively: their length is bounded.
  if (out.size() > 4096) fail(line, "an expression of over 4096 tokens");
  out.push_back({token::t_end, "", {}});
  return out;
}

// ------------------------------------------------------------ expressions

struct expr;
using eptr = std::shared_ptr<const expr>;

struct expr {
  enum kind_t {
    e_literal,
    e_name,
    e_attr,
    e_index,
    e_slice,
    e_call,
    e_filter,
    e_test,
    e_unary,
    e_binary,
    e_cond,
    e_list,
    e_dict
  };
  kind_t kind;
  int line = 0;
  value lit;
  std::string name;  // name, attribute, operator, filter or test
  std::vector<eptr> kids;
  std::vector<std::pair<std::string, eptr>> kwargs;
  bool negate = false;  // "is not"
};

class expr_parser {
 public:
  expr_parser(const std::string& s, int line) : toks_(tokenize(s, line)), line_(line) {}

  eptr parse() { return ternary(); }
  // A filter block's filters ({% filter f(args) | g %}) over `base`.
  eptr filter_chain(eptr base) {
    do base = filter_of(base);
    while (accept_op("|"));
    return base;
  }
  bool done() const { return toks_[pos_].kind == token::t_end; }
  const token& peek(size_t ahead = 0) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  bool is_name(const std::string& n, size_t ahead = 0) const {
    return peek(ahead).kind == token::t_name && peek(ahead).text == n;
  }
  bool is_op(const std::string& o) const { return peek().kind == token::t_op && peek().text == o; }
  std::string take_name() {
    if (peek().kind != token::t_name) fail(line_, "expected a name, found '" + peek().text + "'");
    return toks_[pos_++].text;
  }
  void expect(const std::string& o) {
    if (!is_op(o)) fail(line_, "expected '" + o + "', found '" + peek().text + "'");
    ++pos_;
  }
  bool accept_op(const std::string& o) {
    if (!is_op(o)) return false;
    ++pos_;
    return true;
  }
  bool accept_name(const std::string& n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  void expect_end() {
    if (!done()) fail(line_, "unexpected '" + peek().text + "'");
  }
  // An "or"-level expression without the ternary (for targets of `for`).
  eptr no_ternary() { return or_expr(); }

 private:
  std::shared_ptr<expr> make(expr::kind_t k) {
    auto e = std::make_shared<expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  eptr binary(const std::string& op, eptr a, eptr b) {
    auto e = make(expr::e_binary);
    e->name = op;
    e->kids = {std::move(a), std::move(b)};
    return e;
  }

  eptr ternary() {
    // Nesting is bounded, so a hostile template cannot exhaust the stack.
    if (++depth_ > 200) fail(line_, "expressions nested deeper than 200");
    eptr a = or_expr();
    --depth_;
    if (!accept_name("if")) return a;
    auto e = make(expr::e_cond);
    eptr c = or_expr();
    eptr b = accept_name("else") ? ternary() : nullptr;
    e->kids = {a, c, b};
    return e;
  }
  eptr or_expr() {
    eptr a = and_expr();
    while (accept_name("or")) a = binary("or", a, and_expr());
    return a;
  }
  eptr and_expr() {
    eptr a = not_expr();
    while (accept_name("and")) a = binary("and", a, not_expr());
    return a;
  }
  eptr not_expr() {
    if (is_name("not") && ++depth_ > 200) fail(line_, "expressions nested deeper than 200");
    if (accept_name("not")) {
      auto e = make(expr::e_unary);
      e->name = "not";
      e->kids = {not_expr()};
      --depth_;
      return e;
    }
    return compare();
  }
  eptr compare() {
    eptr a = additive();
    for (;;) {
      if (peek().kind == token::t_op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        const std::string op = toks_[pos_++].text;
        a = binary(op, a, additive());
      } else if (accept_name("in")) {
        a = binary("in", a, additive());
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        a = binary("not in", a, additive());
      } else if (accept_name("is")) {
        auto e = make(expr::e_test);
        e->negate = accept_name("not");
        e->name = peek().kind == token::t_op ? toks_[pos_++].text : take_name();
        e->kids = {a};
        if (accept_op("(")) {
          args(*e);
        } else if (!done() && (peek().kind == token::t_str || peek().kind == token::t_num ||
                               (peek().kind == token::t_name && !is_name("and") && !is_name("or") &&
                                !is_name("else") && !is_name("if")))) {
          e->kids.push_back(additive());  // "is divisibleby 3", "is equalto x"
        }
        a = e;
      } else {
        return a;
      }
    }
  }
  // Jinja2's order: + and - over ~ over * / // %.
  eptr additive() {
    eptr a = concat();
    for (;;) {
      if (accept_op("+")) {
        a = binary("+", a, concat());
      } else if (accept_op("-")) {
        a = binary("-", a, concat());
      } else {
        return a;
      }
    }
  }
  eptr concat() {
    eptr a = multiplicative();
    while (accept_op("~")) a = binary("~", a, multiplicative());
    return a;
  }
  eptr multiplicative() {
    eptr a = power();
    for (;;) {
      if (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
        const std::string op = toks_[pos_++].text;
        a = binary(op, a, power());
      } else {
        return a;
      }
    }
  }
  eptr power() {
    eptr a = unary();
    while (accept_op("**")) a = binary("**", a, unary());
    return a;
  }
  eptr unary() {
    if ((is_op("-") || is_op("+")) && ++depth_ > 200)
      fail(line_, "expressions nested deeper than 200");
    if (is_op("-") || is_op("+")) {
      auto e = make(expr::e_unary);
      e->name = toks_[pos_++].text;
      e->kids = {unary()};
      --depth_;
      return e;
    }
    return postfix(primary());
  }
  // Positional and keyword arguments up to ")".
  void args(expr& e) {
    while (!accept_op(")")) {
      if (peek().kind == token::t_name && peek(1).kind == token::t_op && peek(1).text == "=") {
        const std::string k = take_name();
        ++pos_;
        e.kwargs.emplace_back(k, ternary());
      } else {
        e.kids.push_back(ternary());
      }
      if (!is_op(")")) expect(",");
    }
  }
  eptr postfix(eptr a) {
    for (;;) {
      if (accept_op(".")) {
        auto e = make(expr::e_attr);
        e->name = peek().kind == token::t_num ? toks_[pos_++].text : take_name();
        e->kids = {a};
        a = e;
      } else if (accept_op("[")) {
        eptr parts[3];
        int n = 0;
        bool is_slice = false;
        for (;;) {
          if (is_op(":")) {
            is_slice = true;
            ++pos_;
            if (++n > 2) fail(line_, "a slice has at most three parts");
            continue;
          }
          if (is_op("]")) break;
          parts[n] = ternary();
        }
        expect("]");
        auto e = make(is_slice ? expr::e_slice : expr::e_index);
        e->kids = {a, parts[0], parts[1], parts[2]};
        a = e;
      } else if (accept_op("(")) {
        auto e = make(expr::e_call);
        e->kids = {a};
        args(*e);
        a = e;
      } else if (accept_op("|")) {
        a = filter_of(a);
      } else {
        return a;
      }
    }
  }
  // The filter named next (with its arguments) over `base`; the parser
  // stands after a '|'.
  eptr filter_of(eptr base) {
    auto e = make(expr::e_filter);
    e->name = take_name();
    e->kids = {base};
    if (accept_op("(")) args(*e);
    return e;
  }
  eptr primary() {
    const token t = peek();
    if (t.kind == token::t_str) {
      ++pos_;
      auto e = make(expr::e_literal);
      e->lit = t.text;
      // Adjacent string literals concatenate.
      while (peek().kind == token::t_str) e->lit = e->lit.get<std::string>() + toks_[pos_++].text;
      return e;
    }
    if (t.kind == token::t_num) {
      ++pos_;
      auto e = make(expr::e_literal);
      e->lit = t.num;
      return e;
    }
    if (t.kind == token::t_name) {
      ++pos_;
      auto e = make(expr::e_literal);
      if (t.text == "true" || t.text == "True") {
        e->lit = true;
      } else if (t.text == "false" || t.text == "False") {
        e->lit = false;
      } else if (t.text == "none" || t.text == "None") {
        e->lit = nullptr;
      } else {
        e->kind = expr::e_name;
        e->name = t.text;
      }
      return e;
    }
    if (accept_op("(")) {
      eptr first = ternary();
      if (accept_op(")")) return first;
      auto e = make(expr::e_list);  // a tuple
      e->kids = {first};
      while (accept_op(",")) {
        if (is_op(")")) break;
        e->kids.push_back(ternary());
      }
      expect(")");
      return e;
    }
    if (accept_op("[")) {
      auto e = make(expr::e_list);
      while (!accept_op("]")) {
        e->kids.push_back(ternary());
        if (!is_op("]")) expect(",");
      }
      return e;
    }
    if (accept_op("{")) {
      auto e = make(expr::e_dict);
      while (!accept_op("}")) {
        e->kids.push_back(ternary());
        expect(":");
        e->kids.push_back(ternary());
        if (!is_op("}")) expect(",");
      }
      return e;
    }
    fail(line_, "unexpected '" + t.text + "' in an expression");
  }

  std::vector<token> toks_;
  size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

// The variable a filter block's body text is bound to for its filters: a
// name no template can write (a blank in it).
constexpr const char* k_filter_body = "filter body";

}  // namespace

// ------------------------------------------------------------ statements

struct node {
  enum kind_t {
    n_seq,
    n_text,
    n_output,
    n_if,
    n_for,
    n_set,
    n_set_block,
    n_filter_block,
    n_macro,
    n_break,
    n_continue
  };
  kind_t kind = n_seq;
  int line = 0;
  std::string text;                                              // text; macro name
  eptr e;                                                        // output; set value; for items
  std::vector<std::pair<eptr, std::shared_ptr<node>>> branches;  // if: (cond or null, body)
  std::vector<std::string> targets;  // for / set names; set ns.attr: {ns, attr}
  bool attr_target = false;
  eptr cond;  // for ... if cond
  std::shared_ptr<node> body, else_body;
  std::vector<std::shared_ptr<node>> children;       // seq
  std::vector<std::pair<std::string, eptr>> params;  // macro (default or null)
};

namespace {

using nptr = std::shared_ptr<node>;

class stmt_parser {
 public:
  explicit stmt_parser(std::vector<segment> segs) : segs_(std::move(segs)) {}

  nptr parse_all() {
    std::string end;
    nptr body = block({}, end);
    if (!end.empty()) fail(line_, "unexpected '" + end + "'");
    return body;
  }

 private:
  // Parses nodes until one of `ends` (a statement keyword) or the end;
  // `hit` receives the keyword and the parser stands after it.
  nptr block(const std::vector<std::string>& ends, std::string& hit) {
    if (ends.size() && ++depth_ > 200) fail(line_, "blocks nested deeper than 200");
    struct leave {
      int& d;
      bool on;
      ~leave() {
        if (on) --d;
      }
    } guard{depth_, !ends.empty()};
    auto seq = std::make_shared<node>();
    hit.clear();
    while (at_ < segs_.size()) {
      const segment& s = segs_[at_++];
      line_ = s.line;
      if (s.kind == segment::text) {
        auto n = std::make_shared<node>();
        n->kind = node::n_text;
        n->line = s.line;
        n->text = s.body;
        seq->children.push_back(n);
        continue;
      }
      if (s.kind == segment::expr) {
        auto n = std::make_shared<node>();
        n->kind = node::n_output;
        n->line = s.line;
        expr_parser p(s.body, s.line);
        n->e = p.parse();
        p.expect_end();
        seq->children.push_back(n);
        continue;
      }
      expr_parser p(s.body, s.line);
      const std::string kw = p.take_name();
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        hit = kw;
        stmt_ = std::make_unique<expr_parser>(std::move(p));
        return seq;
      }
      seq->children.push_back(statement(kw, p, s.line));
    }
    if (!ends.empty()) fail(line_, "missing '" + ends.back() + "'");
    return seq;
  }

  nptr statement(const std::string& kw, expr_parser& p, int line) {
    auto n = std::make_shared<node>();
    n->line = line;
    std::string hit;
    if (kw == "if") {
      n->kind = node::n_if;
      eptr c = p.parse();
      p.expect_end();
      for (;;) {
        nptr body = block({"elif", "else", "endif"}, hit);
        n->branches.emplace_back(c, body);
        if (hit == "endif") break;
        if (hit == "else") {
          stmt_->expect_end();
          n->branches.emplace_back(nullptr, block({"endif"}, hit));
          break;
        }
        c = stmt_->parse();
        stmt_->expect_end();
      }
      return n;
    }
    if (kw == "for") {
      n->kind = node::n_for;
      n->targets.push_back(p.take_name());
      while (p.accept_op(",")) n->targets.push_back(p.take_name());
      if (!p.accept_name("in")) fail(line, "expected 'in' in a for loop");
      n->e = p.no_ternary();
      if (p.accept_name("if")) n->cond = p.no_ternary();
      p.accept_name("recursive");
      p.expect_end();
      n->body = block({"else", "endfor"}, hit);
      if (hit == "else") n->else_body = block({"endfor"}, hit);
      return n;
    }
    if (kw == "set") {
      n->targets.push_back(p.take_name());
      if (p.accept_op(".")) {
        n->attr_target = true;
        n->targets.push_back(p.take_name());
      }
      while (p.accept_op(",")) n->targets.push_back(p.take_name());
      if (p.done()) {  // {% set x %}...{% endset %}
        n->kind = node::n_set_block;
        n->body = block({"endset"}, hit);
        return n;
      }
      n->kind = node::n_set;
      p.expect("=");
      n->e = p.parse();
      if (p.accept_op(",")) {  // a tuple on the right
        auto list = std::make_shared<expr>();
        list->kind = expr::e_list;
        list->line = line;
        list->kids = {n->e};
        do list->kids.push_back(p.parse());
        while (p.accept_op(","));
        n->e = list;
      }
      p.expect_end();
      return n;
    }
    if (kw == "macro") {
      n->kind = node::n_macro;
      n->text = p.take_name();
      p.expect("(");
      while (!p.accept_op(")")) {
        const std::string name = p.take_name();
        eptr def = p.accept_op("=") ? p.parse() : nullptr;
        n->params.emplace_back(name, def);
        if (!p.is_op(")")) p.expect(",");
      }
      p.expect_end();
      n->body = block({"endmacro"}, hit);
      return n;
    }
    if (kw == "filter") {  // {% filter f %}...{% endfilter %}: f of the body's text
      auto body = std::make_shared<expr>();
      body->kind = expr::e_name;
      body->line = line;
      body->name = k_filter_body;
      n->kind = node::n_filter_block;
      n->e = p.filter_chain(body);
      p.expect_end();
      n->body = block({"endfilter"}, hit);
      return n;
    }
    if (kw == "generation") {  // Hugging Face's assistant-mask marker
      p.expect_end();
      return block({"endgeneration"}, hit);
    }
    if (kw == "break" || kw == "continue") {
      p.expect_end();
      n->kind = kw == "break" ? node::n_break : node::n_continue;
      return n;
    }
    fail(line, "unsupported statement '" + kw + "'");
  }

  std::vector<segment> segs_;
  size_t at_ = 0;
  int line_ = 1;
  int depth_ = 0;
  std::unique_ptr<expr_parser> stmt_;  // the parser of the last end keyword's tag
};

// ------------------------------------------------------------ values

value undefined() {
  return value(value::value_t::discarded);
}
bool is_undefined(const value& v) {
  return v.is_discarded();
}

bool truthy(const value& v) {
  if (v.is_discarded() || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

std::string number_text(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e16) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", d);
    return buf;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  // The shortest form that reads back the same, as Python prints floats.
  for (int prec = 1; prec <= 17; ++prec) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.*g", prec, d);
    if (std::strtod(b2, nullptr) == d) return b2;
  }
  return buf;
}

std::string repr(const value& v);

std::string to_text(const value& v) {
  if (v.is_discarded()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return number_text(v.get<double>());
  return repr(v);
}

// Dictionary keys.  A JSON object keys by strings, Python's dicts (and so
// Jinja's) by any hashable value: ByteDance Seed-OSS's template builds
// {0: 0, 512: 128, ...} and looks up [16384].  An integer key is held as
// its decimal text behind a control byte (0x1F) and read back as the
// integer wherever keys come out: loops, keys(), items(), dictsort, repr,
// tojson.  A string key of that form would come back as an integer too;
// the context chat_template gives holds no client-named keys, so only a
// template's own literal could spell one.
constexpr char integer_key_mark = '\x1f';

// What a dictionary lookup (d[k], d.get(k), k in d) accepts as a key.
bool is_dict_key(const value& k) {
  return k.is_string() || k.is_number_integer();
}

std::string key_of(const value& k) {
  if (k.is_number_integer()) return integer_key_mark + std::to_string(k.get<int64_t>());
  return to_text(k);
}

value key_value(const std::string& key) {
  if (key.size() < 2 || key[0] != integer_key_mark) return key;
  int64_t n = 0;
  const char* end = key.data() + key.size();
  const auto [at, ec] = std::from_chars(key.data() + 1, end, n);
  if (ec != std::errc() || at != end) return key;
  return n;
}

// Python's repr of lists and dicts (what {{ a_list }} prints).
std::string repr(const value& v) {
  if (v.is_string()) {
    std::string out = "'";
    for (char c : v.get_ref<const std::string&>()) {
      if (c == '\'' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out + "'";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += (first ? "" : ", ") + repr(key_value(it.key())) + ": " + repr(it.value());
      first = false;
    }
    return out + "}";
  }
  return to_text(v);
}

// Python's json.dumps(v, ensure_ascii=False) (", " and ": " separators),
// or with an indent.
void dump_json(const value& v, int indent, int depth, std::string& out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  if (v.is_array() || v.is_object()) {
    const bool obj = v.is_object();
    if (v.empty()) {
      out += obj ? "{}" : "[]";
      return;
    }
    out += obj ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += indent < 0 ? ", " : ",";
      first = false;
      newline(depth + 1);
      if (obj)  // json.dumps writes an integer key as its text
        out += value(to_text(key_value(it.key())))
                   .dump(-1, ' ', false, value::error_handler_t::replace) +
               ": ";
      dump_json(it.value(), indent, depth + 1, out);
    }
    newline(depth);
    out += obj ? '}' : ']';
    return;
  }
  if (v.is_number_float()) {
    out += number_text(v.get<double>());
    return;
  }
  if (v.is_discarded()) {
    out += "null";
    return;
  }
  out += v.dump(-1, ' ', false, value::error_handler_t::replace);
}

double as_double(const value& v, int line) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  fail(line, "expected a number, got " + repr(v));
}

// ------------------------------------------------------------ renderer

struct break_signal {};
struct continue_signal {};

class renderer {
 public:
  explicit renderer(const value& context) {
    scopes_.emplace_back();
    if (context.is_object())
      for (auto it = context.begin(); it != context.end(); ++it) scopes_[0][it.key()] = it.value();
  }

  // Bounds on what one rendering may do (a model file's template is the
  // operator's, but must not hang or exhaust the process either).
  static constexpr size_t k_max_output = 16u << 20;
  static constexpr int64_t k_max_items = 1000000;

  // One per run()/eval() frame: bounds the recursion (macros calling
  // macros, filters on filters) and the total work of a rendering.
  struct frame {
    renderer& r;
    frame(renderer& owner, int line) : r(owner) {
      if (++r.depth_ > 256) fail(line, "the rendering nested deeper than 256");
      if (++r.steps_ > 2000000) fail(line, "the rendering took over 2 million steps");
    }
    ~frame() { --r.depth_; }
  };
  // A scope pushed for a loop or a macro, popped however it ends.
  struct scope {
    renderer& r;
    explicit scope(renderer& owner) : r(owner) { r.scopes_.emplace_back(); }
    ~scope() { r.scopes_.pop_back(); }
  };

  // Values a template builds (list and dict literals, append, list +):
  // nested at most 64 deep, a million elements in all per rendering.
  void admit(const value& v, int line, int depth = 0) {
    if (depth > 64) fail(line, "values nested deeper than 64");
    if (++built_ > 1000000) fail(line, "the rendering built over a million values");
    if (v.is_structured())
      for (const auto& x : v) admit(x, line, depth + 1);
  }

  void run(const node& n, std::string& out) {
    const frame f(*this, n.line);
    if (out.size() > k_max_output) fail(n.line, "the rendering passed 16 MiB");
    switch (n.kind) {
      case node::n_seq:
        for (const auto& c : n.children) run(*c, out);
        return;
      case node::n_text:
        out += n.text;
        return;
      case node::n_output:
        out += to_text(eval(*n.e));
        return;
      case node::n_if:
        for (const auto& [c, body] : n.branches) {
          if (!c || truthy(eval(*c))) {
            run(*body, out);
            return;
          }
        }
        return;
      case node::n_for:
        run_for(n, out);
        return;
      case node::n_set:
        assign(n, eval(*n.e));
        return;
      case node::n_set_block: {
        std::string captured;
        run(*n.body, captured);
        assign(n, captured);
        return;
      }
      case node::n_filter_block: {  // the body in a scope of its own, as Jinja2's
        std::string captured;
        {
          const scope body(*this);
          run(*n.body, captured);
        }
        const scope sc(*this);
        scopes_.back()[k_filter_body] = captured;
        out += to_text(eval(*n.e));
        return;
      }
      case node::n_macro:
        macros_[n.text] = &n;
        return;
      case node::n_break:
        throw break_signal{};
      case node::n_continue:
        throw continue_signal{};
    }
  }

 private:
  value* find(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  void assign(const node& n, value v) {
    if (n.attr_target) {
      value* ns = find(n.targets[0]);
      if (!ns || !ns->is_object()) fail(n.line, "'" + n.targets[0] + "' is not a namespace");
      (*ns)[n.targets[1]] = std::move(v);
      return;
    }
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return;
    }
    if (!v.is_array() || v.size() != n.targets.size())
      fail(n.line, "cannot unpack " + repr(v) + " into " + std::to_string(n.targets.size()));
    for (size_t i = 0; i < n.targets.size(); ++i) scopes_.back()[n.targets[i]] = v[i];
  }

  void run_for(const node& n, std::string& out) {
    value items = eval(*n.e);
    value list = value::array();
    if (items.is_object()) {
      for (auto it = items.begin(); it != items.end(); ++it) list.push_back(key_value(it.key()));
    } else if (items.is_string()) {
      for (char c : items.get<std::string>()) list.push_back(std::string(1, c));
    } else if (items.is_array()) {
      list = items;
    } else if (!is_undefined(items) && !items.is_null()) {
      fail(n.line, repr(items) + " is not iterable");
    }
    const scope loop_scope(*this);
    auto bind = [&](const value& item) {
      scopes_.back().clear();  // each pass starts from the outer values, as in Jinja
      if (n.targets.size() == 1) {
        scopes_.back()[n.targets[0]] = item;
        return;
      }
      if (!item.is_array() || item.size() != n.targets.size())
        fail(n.line, "cannot unpack " + repr(item));
      for (size_t i = 0; i < n.targets.size(); ++i) scopes_.back()[n.targets[i]] = item[i];
    };
    if (n.cond) {  // the inline filter runs before the loop: loop.length counts what passes
      value kept = value::array();
      for (const auto& item : list) {
        bind(item);
        if (truthy(eval(*n.cond))) kept.push_back(item);
      }
      list = kept;
    }
    const auto len = static_cast<int64_t>(list.size());
    try {
      for (int64_t i = 0; i < len; ++i) {
        bind(list[static_cast<size_t>(i)]);
        value loop = value::object();
        loop["index"] = i + 1;
        loop["index0"] = i;
        loop["first"] = i == 0;
        loop["last"] = i + 1 == len;
        loop["length"] = len;
        loop["revindex"] = len - i;
        loop["revindex0"] = len - i - 1;
        loop["previtem"] = i > 0 ? list[static_cast<size_t>(i - 1)] : undefined();
        loop["nextitem"] = i + 1 < len ? list[static_cast<size_t>(i + 1)] : undefined();
        scopes_.back()["loop"] = loop;
        try {
          run(*n.body, out);
        } catch (const continue_signal&) {
        }
      }
    } catch (const break_signal&) {
    }
    if (len == 0 && n.else_body) run(*n.else_body, out);
  }

  value eval(const expr& e) {
    const frame f(*this, e.line);
    switch (e.kind) {
      case expr::e_literal:
        return e.lit;
      case expr::e_name: {
        if (const value* v = find(e.name)) return *v;
        return undefined();
      }
      case expr::e_attr: {
        const value obj = eval(*e.kids[0]);
        return member(obj, value(e.name));
      }
      case expr::e_index: {
        const value obj = eval(*e.kids[0]);
        if (!e.kids[1]) fail(e.line, "an empty subscript");
        return member(obj, eval(*e.kids[1]));
      }
      case expr::e_slice:
        return slice(e);
      case expr::e_call:
        return call(e);
      case expr::e_filter:
        return filter(e);
      case expr::e_test:
        return test(e) != e.negate;
      case expr::e_unary: {
        const value v = eval(*e.kids[0]);
        if (e.name == "not") return !truthy(v);
        if (v.is_number_integer()) {
          const int64_t i = v.get<int64_t>();
          if (e.name == "-" && i == std::numeric_limits<int64_t>::min())
            fail(e.line, "integer overflow");
          return e.name == "-" ? -i : i;
        }
        const double d = as_double(v, e.line);
        return e.name == "-" ? -d : d;
      }
      case expr::e_binary:
        return binary(e);
      case expr::e_cond:
        if (truthy(eval(*e.kids[1]))) return eval(*e.kids[0]);
        return e.kids[2] ? eval(*e.kids[2]) : undefined();
      case expr::e_list: {
        value out = value::array();
        for (const auto& k : e.kids) out.push_back(eval(*k));
        admit(out, e.line);
        return out;
      }
      case expr::e_dict: {
        value out = value::object();
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2)
          out[key_of(eval(*e.kids[i]))] = eval(*e.kids[i + 1]);
        admit(out, e.line);
        return out;
      }
    }
    fail(e.line, "unknown expression");
  }

  static value member(const value& obj, const value& key) {
    if (obj.is_object() && is_dict_key(key)) {
      const auto it = obj.find(key_of(key));
      return it == obj.end() ? undefined() : *it;
    }
    if ((obj.is_array() || obj.is_string()) && key.is_number_integer()) {
      const auto n = static_cast<int64_t>(
          obj.is_array() ? obj.size() : obj.get_ref<const std::string&>().size());
      int64_t i = key.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return undefined();
      if (obj.is_array()) return obj[static_cast<size_t>(i)];
      return std::string(1, obj.get_ref<const std::string&>()[static_cast<size_t>(i)]);
    }
    return undefined();
  }

  value slice(const expr& e) {
    const value obj = eval(*e.kids[0]);
    auto part = [&](int k, int64_t def) {
      if (!e.kids[static_cast<size_t>(k)]) return def;
      const value v = eval(*e.kids[static_cast<size_t>(k)]);
      if (v.is_null()) return def;
      if (!v.is_number_integer()) fail(e.line, "a slice index must be an integer");
      return v.get<int64_t>();
    };
    const bool str = obj.is_string();
    if (!str && !obj.is_array()) fail(e.line, "cannot slice " + repr(obj));
    const auto n =
        static_cast<int64_t>(str ? obj.get_ref<const std::string&>().size() : obj.size());
    const int64_t step = part(3, 1);
    if (step == 0) fail(e.line, "a slice step cannot be zero");
    auto clamp = [&](int64_t i, int64_t lo, int64_t hi) {
      if (i < 0) i += n;
      return std::clamp(i, lo, hi);
    };
    int64_t start = step > 0 ? clamp(part(1, 0), 0, n) : clamp(part(1, n - 1), -1, n - 1);
    int64_t stop =
        step > 0 ? clamp(part(2, n), 0, n) : (e.kids[2] ? clamp(part(2, -1), -1, n - 1) : -1);
    value out = str ? value(std::string()) : value::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (str)
        out.get_ref<std::string&>() += obj.get_ref<const std::string&>()[static_cast<size_t>(i)];
      else
        out.push_back(obj[static_cast<size_t>(i)]);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return out;
  }

  value binary(const expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      const value a = eval(*e.kids[0]);
      return truthy(a) ? eval(*e.kids[1]) : a;
    }
    if (op == "or") {
      const value a = eval(*e.kids[0]);
      return truthy(a) ? a : eval(*e.kids[1]);
    }
    const value a = eval(*e.kids[0]);
    const value b = eval(*e.kids[1]);
    auto sized = [&](std::string v) {
      if (v.size() > k_max_output) fail(e.line, "a string of over 16 MiB");
      return v;
    };
    if (op == "~") return sized(to_text(a) + to_text(b));
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in" || op == "not in") return contains(b, a, e.line) == (op == "in");
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      bool lt, gt;
      if (a.is_string() && b.is_string()) {
        lt = a.get<std::string>() < b.get<std::string>();
        gt = b.get<std::string>() < a.get<std::string>();
      } else {
        const double x = as_double(a, e.line), y = as_double(b, e.line);
        lt = x < y;
        gt = x > y;
      }
      if (op == "<") return lt;
      if (op == ">") return gt;
      if (op == "<=") return !gt;
      return !lt;
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return sized(a.get<std::string>() + b.get<std::string>());
      if (a.is_array() && b.is_array()) {
        admit(b, e.line);
        value out = a;
        for (const auto& x : b) out.push_back(x);
        return out;
      }
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      const size_t len = a.get_ref<const std::string&>().size();
      const int64_t times = std::max<int64_t>(0, b.get<int64_t>());
      if (len == 0) return std::string();
      if (static_cast<uint64_t>(times) > k_max_output / len)
        fail(e.line, "a repeated string of over 16 MiB");
      std::string out;
      for (int64_t i = 0; i < b.get<int64_t>(); ++i) out += a.get<std::string>();
      return out;
    }
    if ((a.is_number() || a.is_boolean()) && (b.is_number() || b.is_boolean())) {
      const bool ints = !a.is_number_float() && !b.is_number_float();
      const double x = as_double(a, e.line), y = as_double(b, e.line);
      // Integer results as Python's, refused where they leave int64.
      auto whole = [&](double r) {
        if (!(r >= -9.2e18 && r <= 9.2e18)) fail(e.line, "integer overflow");
        return value(static_cast<int64_t>(r));
      };
      if (ints && (op == "+" || op == "-" || op == "*")) {
        const int64_t i = a.is_boolean() ? a.get<bool>() : a.get<int64_t>();
        const int64_t j = b.is_boolean() ? b.get<bool>() : b.get<int64_t>();
        int64_t r = 0;
        const bool over = op == "+"   ? __builtin_add_overflow(i, j, &r)
                          : op == "-" ? __builtin_sub_overflow(i, j, &r)
                                      : __builtin_mul_overflow(i, j, &r);
        if (over) fail(e.line, "integer overflow");
        return r;
      }
      if (op == "+") return x + y;
      if (op == "-") return x - y;
      if (op == "*") return x * y;
      if (op == "**") return ints && y >= 0 ? whole(std::pow(x, y)) : value(std::pow(x, y));
      if (y == 0.0) fail(e.line, "division by zero");
      if (op == "/") return x / y;
      if (op == "//") return ints ? whole(std::floor(x / y)) : value(std::floor(x / y));
      if (op == "%") {
        const double r = x - y * std::floor(x / y);
        return ints ? whole(r) : value(r);
      }
    }
    fail(e.line, "cannot apply '" + op + "' to " + repr(a) + " and " + repr(b));
  }

  static bool equal(const value& a, const value& b) {
    if (is_undefined(a) || is_undefined(b)) return is_undefined(a) && is_undefined(b);
    return a == b;
  }

  static bool contains(const value& hay, const value& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) fail(line, "'in <string>' needs a string on the left");
      return hay.get_ref<const std::string&>().find(needle.get<std::string>()) != std::string::npos;
    }
    if (hay.is_array())
      return std::any_of(hay.begin(), hay.end(), [&](const value& x) { return x == needle; });
    if (hay.is_object()) return is_dict_key(needle) && hay.contains(key_of(needle));
    if (is_undefined(hay) || hay.is_null()) return false;
    fail(line, "'in' needs a string, list or dict, got " + repr(hay));
  }

  // Positional arguments, then keyword ones by name (or position).
  struct arguments {
    std::vector<value> pos;
    std::map<std::string, value> kw;
    value get(size_t i, const std::string& name, value def = undefined()) const {
      const auto it = kw.find(name);
      if (it != kw.end()) return it->second;
      return i < pos.size() ? pos[i] : def;
    }
  };
  arguments args_of(const expr& e, size_t first) {
    arguments a;
    for (size_t i = first; i < e.kids.size(); ++i) a.pos.push_back(eval(*e.kids[i]));
    for (const auto& [k, v] : e.kwargs) a.kw[k] = eval(*v);
    return a;
  }

  value call(const expr& e) {
    const expr& callee = *e.kids[0];
    arguments a = args_of(e, 1);
    if (callee.kind == expr::e_name) {
      const std::string& f = callee.name;
      if (const auto m = macros_.find(f); m != macros_.end()) return call_macro(*m->second, a);
      if (f == "raise_exception")
        throw std::runtime_error("chat template: " + to_text(a.get(0, "message")));
      if (f == "namespace" || f == "dict") {
        value ns = value::object();
        for (const auto& [k, v] : a.kw) ns[k] = v;
        return ns;
      }
      if (f == "range") {
        int64_t start = 0, stop = 0, step = 1;
        auto num = [&](size_t i) {
          const double d = as_double(a.pos.at(i), e.line);
          if (!(d >= -1e15 && d <= 1e15)) fail(e.line, "range bound out of range");
          return static_cast<int64_t>(d);
        };
        if (a.pos.size() == 1) stop = num(0);
        if (a.pos.size() >= 2) start = num(0), stop = num(1);
        if (a.pos.size() == 3) step = num(2);
        if (a.pos.empty() || step == 0) fail(e.line, "range needs 1 to 3 arguments, step not 0");
        if ((stop - start) / step > k_max_items) fail(e.line, "range of over a million items");
        steps_ += (stop - start) / step;  // a range's items count as steps
        if (steps_ > 2000000) fail(e.line, "the rendering took over 2 million steps");
        value out = value::array();
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
        return out;
      }
      if (f == "strftime_now") {
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        gmtime_r(&now, &tm);
        char buf[128];
        const size_t n = std::strftime(buf, sizeof buf, to_text(a.get(0, "format")).c_str(), &tm);
        return std::string(buf, n);
      }
      fail(e.line, "unknown function '" + f + "'");
    }
    if (callee.kind == expr::e_attr)
      return method(eval(*callee.kids[0]), callee.name, a, callee, e.line);
    fail(e.line, "this expression cannot be called");
  }

  value call_macro(const node& m, const arguments& a) {
    const scope macro_scope(*this);
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      value v = a.get(i, name);
      if (is_undefined(v) && def) v = eval(*def);
      scopes_.back()[name] = v;
    }
    std::string out;
    run(*m.body, out);
    return out;
  }

  // Python's str.format with plain fields: {} (the next positional
  // argument), {0}, {name}, and {{ }} for braces; a format spec or a
  // conversion (a ':' or '!' in a field) is refused, not approximated.
  std::string format(const std::string& s, const arguments& a, int line) {
    std::string out;
    size_t next = 0;
    bool numbered = false, automatic = false;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
        out += c;
        ++i;
        continue;
      }
      if (c == '}') fail(line, "format: single '}' in the format string");
      if (c != '{') {
        out += c;
        continue;
      }
      const size_t close = s.find('}', i);
      if (close == std::string::npos) fail(line, "format: unclosed '{' in the format string");
      const std::string field = s.substr(i + 1, close - i - 1);
      i = close;
      if (field.find_first_of(":!{[.") != std::string::npos)
        fail(line, "format: field '{" + field + "}' (only {}, {N} and {name} are supported)");
      value v;
      auto positional = [&](size_t k) {
        if (k >= a.pos.size()) fail(line, "format: too few arguments for '{" + field + "}'");
        return a.pos[k];
      };
      if (field.empty()) {
        automatic = true;
        v = positional(next++);
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return d >= '0' && d <= '9'; })) {
        numbered = true;
        v = positional(field.size() > 9 ? a.pos.size() : std::stoul(field));
      } else {
        const auto it = a.kw.find(field);
        if (it == a.kw.end()) fail(line, "format: no argument named '" + field + "'");
        v = it->second;
      }
      if (automatic && numbered)
        fail(line, "format: automatic and numbered fields mixed ('{}' and '{N}')");
      out += to_text(v);  // an undefined argument: "", as Jinja2's Undefined
      if (out.size() > k_max_output) fail(line, "the rendering passed 16 MiB");
    }
    return out;
  }

  value method(value obj, const std::string& name, const arguments& a, const expr& callee,
               int line) {
    if (obj.is_string()) {
      const std::string s = obj.get<std::string>();
      const std::string arg0 =
          a.pos.empty() || !a.pos[0].is_string() ? "" : a.pos[0].get<std::string>();
      auto strip_set = [&](bool left, bool right) {
        const std::string chars = a.pos.empty() || a.pos[0].is_null() ? " \t\n\r\f\v" : arg0;
        size_t b = 0, en = s.size();
        if (left)
          b = s.find_first_not_of(chars) == std::string::npos ? s.size()
                                                              : s.find_first_not_of(chars);
        if (right) {
          const size_t l = s.find_last_not_of(chars);
          en = l == std::string::npos ? b : l + 1;
        }
        return en > b ? s.substr(b, en - b) : std::string();
      };
      if (name == "strip") return strip_set(true, true);
      if (name == "lstrip") return strip_set(true, false);
      if (name == "rstrip") return strip_set(false, true);
      if (name == "upper" || name == "lower") {
        std::string out = s;
        for (auto& c : out)
          c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                : std::tolower(static_cast<unsigned char>(c)));
        return out;
      }
      if (name == "startswith") return s.rfind(arg0, 0) == 0;
      if (name == "endswith")
        return s.size() >= arg0.size() && s.compare(s.size() - arg0.size(), arg0.size(), arg0) == 0;
      if (name == "find") {
        const size_t at = s.find(arg0);
        return at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at);
      }
      if (name == "replace") return replace_all(s, arg0, to_text(a.get(1, "new")));
      if (name == "split") {
        value out = value::array();
        if (a.pos.empty() || a.pos[0].is_null()) {  // on runs of blanks
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && is_blank(s[i])) ++i;
            size_t j = i;
            while (j < s.size() && !is_blank(s[j])) ++j;
            if (j > i) out.push_back(s.substr(i, j - i));
            i = j;
          }
          return out;
        }
        if (arg0.empty()) fail(line, "empty separator");
        size_t i = 0;
        for (size_t at; (at = s.find(arg0, i)) != std::string::npos; i = at + arg0.size())
          out.push_back(s.substr(i, at - i));
        out.push_back(s.substr(i));
        return out;
      }
      if (name == "title" || name == "capitalize") return string_filter(name, s);
      if (name == "format") return format(s, a, line);
    }
    if (obj.is_object()) {
      if (name == "get") {
        const value v = member(obj, a.get(0, "key"));
        return is_undefined(v) ? a.get(1, "default", nullptr) : v;
      }
      if (name == "items") return items_of(obj);
      if (name == "keys" || name == "values") {
        value out = value::array();
        for (auto it = obj.begin(); it != obj.end(); ++it)
          out.push_back(name == "keys" ? key_value(it.key()) : it.value());
        return out;
      }
    }
    if (obj.is_array() && name == "append" && callee.kids[0]->kind == expr::e_name) {
      // list.append(x) mutates the named list, as Python's does.
      value* target = find(callee.kids[0]->name);
      if (target && target->is_array()) {
        const value item = a.get(0, "item");
        admit(item, line);
        target->push_back(item);
      }
      return nullptr;
    }
    fail(line, "unknown method '" + name + "' of " + repr(obj));
  }

  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    if (from.empty()) return s;
    for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size())
      s.replace(at, from.size(), to);
    return s;
  }

  static value items_of(const value& obj) {
    value out = value::array();
    for (auto it = obj.begin(); it != obj.end(); ++it)
      out.push_back(value::array({key_value(it.key()), it.value()}));
    return out;
  }

  static std::string string_filter(const std::string& name, const std::string& s) {
    std::string out = s;
    bool start = true;
    for (auto& c : out) {
      const auto u = static_cast<unsigned char>(c);
      if (name == "capitalize") {
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      } else {  // title
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      }
      start = name == "title" ? !std::isalnum(u) : false;
    }
    return out;
  }

  value filter(const expr& e) {
    value v = eval(*e.kids[0]);
    const arguments a = args_of(e, 1);
    const std::string& f = e.name;
    if (f == "trim") {
      const std::string s = to_text(v);
      const size_t b = s.find_first_not_of(" \t\n\r\f\v");
      if (b == std::string::npos) return std::string();
      return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return static_cast<int64_t>(v.get_ref<const std::string&>().size());
      if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
      if (is_undefined(v)) return int64_t{0};
      fail(e.line, repr(v) + " has no length");
    }
    if (f == "upper" || f == "lower") return method(to_text(v), f, {}, e, e.line);
    if (f == "capitalize" || f == "title") return string_filter(f, to_text(v));
    if (f == "string") return to_text(v);
    if (f == "safe" || f == "escape" || f == "e") return v;
    if (f == "tojson") {
      std::string out;
      const value ind = a.get(0, "indent");
      if (ind.is_number_integer() && (ind.get<int64_t>() < 0 || ind.get<int64_t>() > 64))
        fail(e.line, "tojson indent outside 0..64");
      dump_json(v, ind.is_number_integer() ? static_cast<int>(ind.get<int64_t>()) : -1, 0, out);
      return out;
    }
    if (f == "int") {
      if (v.is_string()) {
        try {
          return static_cast<int64_t>(std::stoll(v.get<std::string>()));
        } catch (const std::exception&) {
          return int64_t{0};
        }
      }
      if (v.is_number_integer()) return v;
      const double d = v.is_number() || v.is_boolean() ? as_double(v, e.line) : 0.0;
      if (!(d >= -9.2e18 && d <= 9.2e18)) fail(e.line, "integer overflow");
      return static_cast<int64_t>(d);
    }
    if (f == "float") return v.is_number() ? as_double(v, e.line) : 0.0;
    if (f == "abs") {
      if (v.is_number_integer() && v.get<int64_t>() != std::numeric_limits<int64_t>::min())
        return std::llabs(v.get<int64_t>());
      return std::fabs(as_double(v, e.line));
    }
    if (f == "round") {
      const double p = std::pow(10.0, as_double(a.get(0, "precision", 0), e.line));
      return std::round(as_double(v, e.line) * p) / p;
    }
    if (f == "first" || f == "last") {
      if (v.is_string() && !v.get_ref<const std::string&>().empty()) {
        const auto& s = v.get_ref<const std::string&>();
        return std::string(1, f == "first" ? s.front() : s.back());
      }
      if (v.is_array() && !v.empty()) return f == "first" ? v.front() : v.back();
      return undefined();
    }
    if (f == "join") {
      const std::string sep = to_text(a.get(0, "d", std::string()));
      const value attr = a.get(1, "attribute");
      std::string out;
      if (!v.is_array()) fail(e.line, "join needs a list");
      for (size_t i = 0; i < v.size(); ++i)
        out += (i ? sep : "") + to_text(is_undefined(attr) ? v[i] : member(v[i], attr));
      return out;
    }
    if (f == "default" || f == "d") {
      const bool boolean = truthy(a.get(1, "boolean", false));
      if (is_undefined(v) || (boolean && !truthy(v)))
        return a.get(0, "default_value", std::string());
      return v;
    }
    if (f == "items" || f == "dictsort") {
      if (!v.is_object()) return value::array();
      value out = items_of(v);
      if (f == "dictsort")
        std::stable_sort(out.begin(), out.end(),
                         [](const value& x, const value& y) { return x[0] < y[0]; });
      return out;
    }
    if (f == "list") {
      if (v.is_array()) return v;
      value out = value::array();
      if (v.is_string())
        for (char c : v.get<std::string>()) out.push_back(std::string(1, c));
      if (v.is_object())
        for (auto it = v.begin(); it != v.end(); ++it) out.push_back(key_value(it.key()));
      return out;
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::string s = v.get<std::string>();
        std::reverse(s.begin(), s.end());
        return s;
      }
      if (!v.is_array()) fail(e.line, "reverse needs a list or string");
      value out = value::array();
      for (auto it = v.rbegin(); it != v.rend(); ++it) out.push_back(*it);
      return out;
    }
    if (f == "replace")
      return replace_all(to_text(v), to_text(a.get(0, "old")), to_text(a.get(1, "new")));
    if (f == "unique") {
      value out = value::array();
      for (const auto& x : v)
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
      return out;
    }
    if (f == "sort") {
      if (!v.is_array()) fail(e.line, "sort needs a list");
      std::vector<value> items(v.begin(), v.end());
      const value attr = a.get(2, "attribute");
      std::stable_sort(items.begin(), items.end(), [&](const value& x, const value& y) {
        return is_undefined(attr) ? x < y : member(x, attr) < member(y, attr);
      });
      if (truthy(a.get(0, "reverse", false))) std::reverse(items.begin(), items.end());
      return value(items);
    }
    if (f == "indent") {
      const double w = as_double(a.get(0, "width", 4), e.line);
      if (!(w >= 0 && w <= 1000)) fail(e.line, "indent width outside 0..1000");
      const auto width = static_cast<size_t>(w);
      const bool first = truthy(a.get(1, "first", false));
      const std::string pad(width, ' ');
      std::string s = to_text(v), out = first ? pad : "";
      for (size_t i = 0; i < s.size(); ++i) {
        out += s[i];
        if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') out += pad;
      }
      return out;
    }
    if (f == "map") {
      const value attr = a.get(99, "attribute");
      value out = value::array();
      if (!v.is_array()) fail(e.line, "map needs a list");
      for (const auto& x : v) {
        if (!is_undefined(attr)) {
          out.push_back(member(x, attr));
        } else if (!a.pos.empty() && a.pos[0].is_string()) {
          expr fe;
          fe.kind = expr::e_filter;
          fe.name = a.pos[0].get<std::string>();
          fe.line = e.line;
          auto lit = std::make_shared<expr>();
          lit->kind = expr::e_literal;
          lit->lit = x;
          fe.kids = {lit};
          out.push_back(filter(fe));
        } else {
          fail(e.line, "map needs attribute= or a filter name");
        }
      }
      return out;
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      if (is_undefined(v) || v.is_null()) return value::array();
      if (!v.is_array()) fail(e.line, f + " needs a list");
      const bool attr = f == "selectattr" || f == "rejectattr";
      const bool keep = f == "selectattr" || f == "select";
      value out = value::array();
      for (const auto& x : v) {
        if (attr && a.pos.empty()) fail(e.line, f + " needs an attribute name");
        const value subject = attr ? member(x, a.pos[0]) : x;
        const size_t t = attr ? 1 : 0;
        bool pass;
        if (a.pos.size() <= t) {
          pass = truthy(subject);
        } else {
          std::vector<value> targs(a.pos.begin() + static_cast<long>(t) + 1, a.pos.end());
          pass = run_test(to_text(a.pos[t]), subject, targs, e.line);
        }
        if (pass == keep) out.push_back(x);
      }
      return out;
    }
    fail(e.line, "unsupported filter '" + f + "'");
  }

  bool test(const expr& e) {
    if (e.name == "defined" || e.name == "undefined") {
      const bool defined = !is_undefined(eval(*e.kids[0]));
      return e.name == "defined" ? defined : !defined;
    }
    const value v = eval(*e.kids[0]);
    std::vector<value> targs;
    for (size_t i = 1; i < e.kids.size(); ++i) targs.push_back(eval(*e.kids[i]));
    return run_test(e.name, v, targs, e.line);
  }

  bool run_test(const std::string& t, const value& v, const std::vector<value>& args, int line) {
    if (t == "defined") return !is_undefined(v);
    if (t == "undefined") return is_undefined(v);
    if (t == "none") return v.is_null();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number_integer();
    if (t == "float") return v.is_number_float();
    if (t == "boolean") return v.is_boolean();
    if (t == "true") return v.is_boolean() && v.get<bool>();
    if (t == "false") return v.is_boolean() && !v.get<bool>();
    if (t == "mapping") return v.is_object();
    if (t == "sequence") return v.is_array() || v.is_string();
    if (t == "iterable") return v.is_array() || v.is_string() || v.is_object();
    if (t == "odd" || t == "even") {
      if (!v.is_number_integer()) return false;
      return (v.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas")
      return !args.empty() && equal(v, args[0]);
    if (t == "ne" || t == "!=") return args.empty() || !equal(v, args[0]);
    if (t == "in") return !args.empty() && contains(args[0], v, line);
    fail(line, "unsupported test '" + t + "'");
  }

  std::vector<std::map<std::string, value>> scopes_;
  std::map<std::string, const node*> macros_;
  int depth_ = 0;
  int64_t steps_ = 0, built_ = 0;
};

}  // namespace

program::program(const std::string& source)
    : body_(stmt_parser(split_segments(source)).parse_all()) {}

std::string program::render(const value& context) const {
  renderer r(context);
  std::string out;
  try {
    r.run(*body_, out);
  } catch (const break_signal&) {
    throw std::runtime_error("jinja: 'break' outside a loop");
  } catch (const continue_signal&) {
    throw std::runtime_error("jinja: 'continue' outside a loop");
  }
  return out;
}

}  // namespace troupe::jinja
