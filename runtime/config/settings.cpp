#include "runtime/config/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "runtime/common/user_text.hpp"

namespace troupe {

namespace {

// The RULE column's words.
value_rule any_value() {
  return {};
}

value_rule non_empty() {
  value_rule r;
  r.what = value_rule::kind::non_empty;
  return r;
}

value_rule range(double lo, double hi) {
  value_rule r;
  r.what = value_rule::kind::range;
  r.lo = lo;
  r.hi = hi;
  return r;
}

value_rule one_of(std::vector<std::string> allowed) {
  value_rule r;
  r.what = value_rule::kind::one_of;
  r.allowed = std::move(allowed);
  return r;
}

value_rule checked(std::string (*fn)(const std::string&)) {
  value_rule r;
  r.what = value_rule::kind::checked;
  r.check = fn;
  return r;
}

std::string number_text(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  std::ostringstream os;
  os << x;
  return os.str();
}

std::string list_text(const std::vector<std::string>& items) {
  std::string all;
  for (const auto& a : items) {
    if (!all.empty()) all += ", ";
    all += a;
  }
  return all;
}

// A text as a value of type T, by `rule`; "" or why not.
std::string parse(const std::string& v, const value_rule& rule, int32_t& out) {
  long long x = 0;
  const bool whole = whole_text_as(v, x);
  const bool in_range = rule.what != value_rule::kind::range || (x >= rule.lo && x <= rule.hi);
  if (!whole || !in_range || x < std::numeric_limits<int32_t>::min() ||
      x > std::numeric_limits<int32_t>::max())
    return "must be an integer" +
           (rule.what == value_rule::kind::range ? " in " + rule.describe() : std::string()) +
           ", got " + quoted_value(v);
  out = static_cast<int32_t>(x);
  return {};
}

std::string parse(const std::string& v, const value_rule& rule, double& out) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  const bool in_range = rule.what != value_rule::kind::range || (x >= rule.lo && x <= rule.hi);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x) || !in_range)
    return "must be a number" +
           (rule.what == value_rule::kind::range ? " in " + rule.describe() : std::string()) +
           ", got " + quoted_value(v);
  out = x;
  return {};
}

std::string parse(const std::string& text, const value_rule&, bool& out) {
  std::string v = text;  // TRUE, True and true alike
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "true" || v == "1" || v == "yes" || v == "on")
    out = true;
  else if (v == "false" || v == "0" || v == "no" || v == "off")
    out = false;
  else
    return "must be true or false, got " + quoted_value(text);
  return {};
}

// A text value (or one item of a list) against its rule.
std::string check_text(const std::string& v, const value_rule& rule) {
  switch (rule.what) {
    case value_rule::kind::any:
      return {};
    case value_rule::kind::non_empty:
      return v.empty() ? "must not be empty" : "";
    case value_rule::kind::one_of:
      if (std::find(rule.allowed.begin(), rule.allowed.end(), v) == rule.allowed.end())
        return "must be one of " + list_text(rule.allowed) + ", got " + quoted_value(v);
      return {};
    case value_rule::kind::checked:
      return rule.check(v);
    case value_rule::kind::range:
      break;
  }
  return {};
}

std::string parse(const std::string& v, const value_rule& rule, std::string& out) {
  if (auto why = check_text(v, rule); !why.empty()) return why;
  out = v;
  return {};
}

// A list takes comma-separated items, each checked; appended.
std::string parse(const std::string& v, const value_rule& rule, string_list& out) {
  std::stringstream ss(v);
  std::string item;
  size_t added = 0;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (auto why = check_text(item, rule); !why.empty()) return why;
    out.push_back(item);
    ++added;
  }
  return added == 0 ? "must name at least one" : "";
}

template <class T>
constexpr value_type type_of() {
  if constexpr (std::is_same_v<T, int32_t>) return value_type::integer;
  if constexpr (std::is_same_v<T, double>) return value_type::real;
  if constexpr (std::is_same_v<T, bool>) return value_type::boolean;
  if constexpr (std::is_same_v<T, std::string>) return value_type::text;
  if constexpr (std::is_same_v<T, string_list>) return value_type::list;
}

std::string flag_for(const std::string& key) {
  std::string f = "--" + key;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

// A later layer replaces a list (the file's, the command line's).
void clear_list(string_list& l) {
  l.clear();
}
template <class T>
void clear_list(T&) {}

// One TROUPE_SETTING row as a setting_key: set/get/clear are functions of
// the row's field, made from a captureless lambda per row.
#define TROUPE_KEY_ACCESS(section_, key_)                         \
  k.set = [](settings& s, const std::string& v) -> std::string {  \
    static const value_rule rule = rule_of_##section_##_##key_(); \
    return parse(v, rule, s.section_.key_);                       \
  };                                                              \
  k.clear = [](settings& s) { clear_list(s.section_.key_); };     \
  k.get = [](const settings& s) { return nlohmann::json(s.section_.key_); };

// Each row's rule as a function, so the setter above can hold it in a
// static (a captureless lambda cannot capture it).
#define TROUPE_SETTING(section_, key_, type_, def, rule_, ...) \
  value_rule rule_of_##section_##_##key_() {                   \
    return rule_;                                              \
  }
#include "runtime/config/settings.def"

std::vector<setting_key> make_keys() {
  std::vector<setting_key> keys;
#define TROUPE_SETTING(section_, key_, type_, def, rule_, applies_, traits_, flag_, help_) \
  {                                                                                        \
    using namespace trait;                                                                 \
    setting_key k;                                                                         \
    k.section = #section_;                                                                 \
    k.key = #key_;                                                                         \
    k.type = type_of<type_>();                                                             \
    k.rule = rule_of_##section_##_##key_();                                                \
    k.where = applies::applies_;                                                           \
    k.traits = (traits_);                                                                  \
    k.flag_names = std::string(flag_).empty() ? flag_for(#key_) : std::string(flag_);      \
    k.help = help_;                                                                        \
    TROUPE_KEY_ACCESS(section_, key_)                                                      \
    keys.push_back(std::move(k));                                                          \
  }
#define TROUPE_SETTING_ALIAS(section_, old_key, new_key)                         \
  {                                                                              \
    auto now = std::find_if(keys.begin(), keys.end(), [](const setting_key& x) { \
      return x.section == #section_ && x.key == #new_key;                        \
    });                                                                          \
    setting_key k = *now;                                                        \
    k.key = #old_key;                                                            \
    k.flag_names = flag_for(#old_key);                                           \
    k.help = "deprecated: " + now->flag_names;                                   \
    k.deprecated_for = now->name();                                              \
    keys.push_back(std::move(k));                                                \
  }
#include "runtime/config/settings.def"
  return keys;
}

#undef TROUPE_KEY_ACCESS

}  // namespace

const char* to_string(applies a) {
  switch (a) {
    case applies::engine:
      return "engine";
    case applies::router:
      return "router";
    case applies::service:
      return "service";
    case applies::cluster:
      return "cluster";
  }
  return "?";
}

const char* to_string(value_type t) {
  switch (t) {
    case value_type::integer:
      return "integer";
    case value_type::real:
      return "number";
    case value_type::boolean:
      return "true/false";
    case value_type::text:
      return "text";
    case value_type::list:
      return "list";
  }
  return "?";
}

std::string value_rule::describe() const {
  switch (what) {
    case kind::range:
      return "[" + number_text(lo) + ", " + number_text(hi) + "]";
    case kind::one_of:
      return "one of " + list_text(allowed);
    case kind::non_empty:
      return "not empty";
    case kind::any:
    case kind::checked:
      break;
  }
  return {};
}

std::string setting_key::env_name() const {
  std::string e = "TROUPE_" + key;
  for (auto& c : e) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

std::string setting_key::default_text() const {
  const auto j = get(settings{});
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array()) {
    std::string all;
    for (const auto& x : j) {
      if (!all.empty()) all += ',';
      all += x.get<std::string>();
    }
    return all;
  }
  return j.dump();
}

const std::vector<setting_key>& setting_keys() {
  static const std::vector<setting_key> keys = make_keys();
  return keys;
}

const setting_key* find_setting(const std::string& name) {
  const setting_key* bare = nullptr;
  int bare_matches = 0;
  for (const auto& k : setting_keys()) {
    if (k.name() == name) return &k;
    if (k.key == name) {
      bare = &k;
      ++bare_matches;
    }
  }
  return bare_matches == 1 ? bare : nullptr;
}

std::string keys_with(unsigned t) {
  std::string all;
  for (const auto& k : setting_keys())
    if (k.has(t) && !k.alias()) {
      if (!all.empty()) all += ", ";
      all += k.key;
    }
  return all;
}

void apply_env(settings& s, const std::function<bool(const setting_key&)>& pick) {
  for (const auto& k : setting_keys()) {
    if (!k.has(trait::env) || (pick && !pick(k))) continue;
    const std::string var = k.env_name();
    const char* v = std::getenv(var.c_str());
    if (!v) continue;
    if (k.alias())
      std::fprintf(stderr, "troupe: %s is deprecated; use %s\n", var.c_str(),
                   find_setting(k.deprecated_for)->env_name().c_str());
    if (k.clear) k.clear(s);
    if (auto why = k.set(s, v); !why.empty())
      throw std::invalid_argument(var + " (" + k.name() + "): " + why);
  }
}

nlohmann::json to_json(const settings& s) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& k : setting_keys()) {
    if (k.alias()) continue;
    auto v = k.get(s);
    if (k.has(trait::secret))
      v = std::to_string(v.is_array() ? v.size() : size_t(!v.get<std::string>().empty())) +
          " keys (not shown)";
    out[k.section][k.key] = std::move(v);
  }
  return out;
}

std::string check_endpoint(const std::string& v) {
  if (v.rfind("tcp://", 0) != 0 && v.rfind("ipc://", 0) != 0 && v.rfind("inproc://", 0) != 0)
    return "must be tcp://host:port or ipc://path, got " + quoted_value(v);
  if (v.rfind("tcp://", 0) != 0) return {};
  // ZeroMQ takes a port past 65535 as a wildcard and binds a random one.
  const auto colon = v.rfind(':');
  const std::string port = colon == std::string::npos ? "" : v.substr(colon + 1);
  if (colon < 6 || (port != "*" && port_number(port) < 0))
    return quoted_value(v) + " has no port in [0, 65535] (or * for any)";
  return {};
}

std::string check_node_address(const std::string& v) {
  const auto colon = v.rfind(':');
  if (colon == std::string::npos) return quoted_value(v) + " is not HOST:PORT";
  if (port_number(std::string_view(v).substr(colon + 1)) < 0)
    return quoted_value(v) + " has no port in [0, 65535]";
  return {};
}

std::string check_stage_place(const std::string& v) {
  if (v == "local") return {};
  if (auto why = check_node_address(v); !why.empty()) return why + " (nor local)";
  return {};
}

std::string check_dial_address(const std::string& v) {
  if (auto why = check_node_address(v); !why.empty()) return why;
  const size_t colon = v.rfind(':');
  const std::string host = v.substr(0, colon), port = v.substr(colon + 1);
  if (host.empty() || host.size() > 255)
    return quoted_value(v) + " has no host, or one over 255 bytes";
  for (unsigned char c : host)
    if (c <= ' ' || c >= 0x7f)
      return quoted_value(v) + ": the host holds a space or a control character";
  if (port[0] == '0')
    return quoted_value(v) + ": give the port as a number above 0, no leading zeros";
  return {};
}

std::vector<std::string> registry_endpoints(const std::string& url) {
  const std::string scheme = "etcd://";
  if (url.rfind(scheme, 0) != 0)
    throw std::invalid_argument(quoted_value(url) + " is not etcd://HOST:PORT[,HOST:PORT...]");
  std::vector<std::string> out;
  const std::string rest = url.substr(scheme.size());
  size_t start = 0;
  for (;;) {
    const size_t comma = rest.find(',', start);
    std::string item =
        rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty() || item.rfind(':') == 0 || !check_node_address(item).empty())
      throw std::invalid_argument(quoted_value(url) + ": " + quoted_value(item) +
                                  " is not HOST:PORT");
    out.push_back(std::move(item));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string check_registry(const std::string& v) {
  try {
    registry_endpoints(v);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

std::string check_autoscale(const std::string& v) {
  const auto colon = v.find(':');
  auto number = [](const std::string& s) {  // at most 4 digits; -1 if not a number
    int n = -1;
    return s.size() <= 4 && whole_text_as(s, n) ? n : -1;
  };
  if (colon == std::string::npos) return "give MIN:MAX, e.g. 2:16, not " + quoted_value(v);
  const int lo = number(v.substr(0, colon)), hi = number(v.substr(colon + 1));
  if (lo < 1 || hi < lo) return "give MIN:MAX with 1 <= MIN <= MAX, not " + quoted_value(v);
  return {};
}

std::string check_epd(const std::string& v) {
  std::string up;
  for (char c : v) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (up != "EP-D" && up != "ED-P" && up != "E-P-D" && up != "EPD")
    return quoted_value(v) + " is not a hybrid EPD strategy (EP-D, ED-P, E-P-D, EPD)";
  return {};
}

std::string check_role(const std::string& v) {
  if (v != "prefill" && v != "decode" && v != "mixed" && v != "encode")
    return quoted_value(v) + " is not a role (prefill, decode, mixed, encode)";
  return {};
}

}  // namespace troupe
