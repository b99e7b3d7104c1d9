#include "tools/troupe/settings_flags.hpp"

#include <toml++/toml.h>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "runtime/common/user_text.hpp"

namespace troupe::cli {

namespace {

// A TOML value as the text the keys read.
std::optional<std::string> scalar_text(const toml::node& n) {
  if (auto v = n.value_exact<std::string>()) return *v;
  if (auto v = n.value_exact<int64_t>()) return std::to_string(*v);
  if (auto v = n.value_exact<bool>()) return std::string(*v ? "true" : "false");
  if (auto v = n.value_exact<double>()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", *v);
    return std::string(buf);
  }
  return std::nullopt;
}

// The file's values of one key: a TOML array for a list, else one value.
std::vector<std::string> file_values(const std::string& path, const setting_key& k,
                                     const toml::node& value) {
  std::vector<std::string> out;
  if (const auto* arr = value.as_array(); arr && k.type == value_type::list) {
    for (const auto& el : *arr) {
      auto v = scalar_text(el);
      if (!v)
        throw std::invalid_argument("config " + path + ": " + k.name() + ": not a list of values");
      out.push_back(*v);
    }
  } else if (auto v = scalar_text(value)) {
    out.push_back(*v);
  } else {
    throw std::invalid_argument("config " + path + ": " + k.name() + ": not a value");
  }
  return out;
}

// [[cluster.node]] tables: address = "HOST:PORT", instances = N, and the
// [engine] keys a node may give its own value (trait per_node).
std::vector<node_entry> parse_node_entries(const std::string& path, const toml::node& value) {
  const auto* arr = value.as_array();
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("config " + path + ": cluster.node: " + why);
  };
  if (!arr) throw bad("must be [[cluster.node]] tables");
  std::vector<node_entry> out;
  for (const auto& el : *arr) {
    const auto* t = el.as_table();
    if (!t) throw bad("must be [[cluster.node]] tables");
    node_entry e;
    settings scratch;  // each override is checked here, when the file is read
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (key == "address") {
        auto a = v.value_exact<std::string>();
        if (!a) throw bad("address must be a string HOST:PORT");
        if (auto why = check_node_address(*a); !why.empty()) throw bad("address: " + why);
        e.address = *a;
        continue;
      }
      if (key == "instances") {
        auto n = v.value_exact<int64_t>();
        if (!n || *n < 1 || *n > 64) throw bad("instances must be an integer in [1, 64]");
        e.instances = static_cast<int>(*n);
        continue;
      }
      const setting_key* sk = find_setting("engine." + key);
      if (!sk || !sk->has(trait::per_node))
        throw bad("unknown key " + quoted_value(key) + " (known: address, instances, " +
                  keys_with(trait::per_node) + ")");
      if (sk->alias())
        std::fprintf(stderr, "troupe: config %s: cluster.node: %s is deprecated; use %s\n",
                     path.c_str(), key.c_str(), sk->deprecated_for.c_str());
      // A list key takes a TOML array (its items joined as the flag's
      // comma-separated form) or one value.
      std::string text;
      for (const auto& item : file_values(path, *sk, v)) text += (text.empty() ? "" : ",") + item;
      if (auto why = sk->set(scratch, text); !why.empty()) throw bad(key + ": " + why);
      e.overrides.emplace_back(sk, text);
    }
    if (e.address.empty()) throw bad("a [[cluster.node]] needs an address");
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

engine_settings node_entry::apply(const engine_settings& base) const {
  settings s;
  s.engine = base;
  for (const auto& [key, text] : overrides) key->set(s, text);  // checked when read
  return s.engine;
}

// CLI11's names' long one: "-m,--model" -> "--model".
static std::string long_flag(const setting_key& k) {
  return k.flag_names.substr(k.flag_names.rfind(',') + 1);
}

settings_flags::settings_flags(CLI::App& cmd, pick_fn pick, bool takes_file)
    : pick_(std::move(pick)), takes_file_(takes_file) {
  for (const auto& k : setting_keys()) {
    if (!picked(k)) continue;
    auto b = std::make_unique<bound>();
    b->key = &k;
    std::string help = k.help;
    if (!k.alias()) {
      const std::string rule = k.rule.describe();
      const std::string def = k.default_text();
      if (!rule.empty() || !def.empty())
        help += " (" + (rule.empty() ? "" : rule + (def.empty() ? "" : "; ")) +
                (def.empty() ? "" : "default " + def) + ")";
      help += " [" + k.name() + "]";
      if (k.has(trait::env)) help += " [env " + k.env_name() + "]";
    }
    b->opt = k.type == value_type::list ? cmd.add_option(k.flag_names, b->values, help)
                                        : cmd.add_option(k.flag_names, b->value, help);
    // A true/false key may be given bare (--pd means --pd true).
    if (k.type == value_type::boolean) b->opt->expected(0, 1);
    b->opt->type_name(k.type == value_type::integer   ? "INT"
                      : k.type == value_type::real    ? "FLOAT"
                      : k.type == value_type::boolean ? "BOOL"
                                                      : "TEXT");
    if (k.alias()) b->opt->group("");  // not in --help
    bound_.push_back(std::move(b));
  }
}

bool settings_flags::picked(const setting_key& k) const {
  return pick_(k.alias() ? *find_setting(k.deprecated_for) : k);
}

void settings_flags::set_from(settings& s, const setting_key& k,
                              const std::vector<std::string>& values, const std::string& prefix) {
  if (k.clear) k.clear(s);  // a list given here replaces the earlier layer's
  for (const auto& v : values)
    if (auto why = k.set(s, v); !why.empty()) throw std::invalid_argument(prefix + why);
}

void settings_flags::load_file(const std::string& path, settings& s) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "config " << path << ": " << e.description() << " (line " << e.source().begin.line << ")";
    throw std::invalid_argument(os.str());
  }
  for (const auto& [section, node] : tbl) {
    const std::string sec(section.str());
    const auto* t = node.as_table();
    const bool known = sec == "engine" || sec == "service" || sec == "cluster";
    if (known && !t)
      throw std::invalid_argument("config " + path + ": " + quoted_value(sec) +
                                  " must be a section ([" + sec + "]), not a value");
    if (!known)
      throw std::invalid_argument("config " + path + ": unknown section " + quoted_value(sec) +
                                  " (known: [engine], [service], [cluster])");
    for (const auto& [key, value] : *t) {
      const std::string name = sec + "." + std::string(key.str());
      if (name == "cluster.node") {
        nodes_ = parse_node_entries(path, value);
        continue;
      }
      const setting_key* k = find_setting(name);  // "section.key": its exact key
      if (!k) throw std::invalid_argument("config " + path + ": unknown key " + quoted_value(name));
      if (k->alias())
        std::fprintf(stderr, "troupe: config %s: %s is deprecated; use %s\n", path.c_str(),
                     name.c_str(), k->deprecated_for.c_str());
      set_from(s, *k, file_values(path, *k, value), "config " + path + ": " + name + ": ");
    }
  }
}

settings settings_flags::resolve(const std::string& config_file) {
  settings s;
  apply_env(s, [this](const setting_key& k) { return picked(k); });
  nodes_.clear();
  if (!config_file.empty()) load_file(config_file, s);
  for (const auto& b : bound_) {
    const setting_key& k = *b->key;
    if (b->opt->count() == 0) continue;
    if (k.alias()) {
      const setting_key* now = find_setting(k.deprecated_for);
      std::fprintf(stderr, "troupe: %s is deprecated; use %s (%s)\n", long_flag(k).c_str(),
                   long_flag(*now).c_str(), now->name().c_str());
    }
    std::vector<std::string> values =
        k.type == value_type::list ? b->values : std::vector{b->value};
    if (k.type == value_type::boolean && values[0].empty()) values[0] = "true";
    set_from(s, k, values, long_flag(k) + " (" + k.name() + "): ");
  }
  for (const auto& b : bound_) {
    const setting_key& k = *b->key;
    if (!k.has(trait::required)) continue;
    const auto v = k.get(s);
    if ((v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty()))
      throw std::invalid_argument(k.name() + ": required (" + long_flag(k) +
                                  (takes_file_ ? ", or " + k.key + " in [" + k.section + "]" : "") +
                                  ")");
  }
  return s;
}

void add_settings(CLI::App& app) {
  auto markdown = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "settings", "every setting: TOML key, flag, type, default, where it applies, live or not");
  cmd->add_flag("--markdown", *markdown, "a markdown table (docs/settings.md is made with it)");
  cmd->callback([markdown] {
    auto traits = [](const setting_key& k) {
      std::string t;
      for (auto [bit, word] : {std::pair{trait::live, "live"},
                               {trait::local, "local"},
                               {trait::per_node, "per-node"},
                               {trait::env, "env"},
                               {trait::secret, "secret"},
                               {trait::required, "required"}})
        if (k.has(bit)) t += (t.empty() ? "" : ", ") + std::string(word);
      return t;
    };
    if (*markdown)
      std::printf(
          "| key | flag | type | default | applies | traits | what it does |\n"
          "|---|---|---|---|---|---|---|\n");
    for (const auto& k : setting_keys()) {
      if (k.alias()) continue;
      std::string type = to_string(k.type);
      if (const auto r = k.rule.describe(); !r.empty()) type += " " + r;
      std::string help = k.help;
      if (k.has(trait::env)) help += " (env " + k.env_name() + ")";
      if (*markdown)
        std::printf("| `%s` | `%s` | %s | %s | %s | %s | %s |\n", k.name().c_str(),
                    k.flag_names.c_str(), type.c_str(), k.default_text().c_str(),
                    to_string(k.where), traits(k).c_str(), help.c_str());
      else
        std::printf("%s  %s  %s  default %s  applies %s%s\n    %s\n", k.name().c_str(),
                    k.flag_names.c_str(), type.c_str(),
                    k.default_text().empty() ? "(none)" : k.default_text().c_str(),
                    to_string(k.where), traits(k).empty() ? "" : ("  " + traits(k)).c_str(),
                    help.c_str());
    }
  });
}

}  // namespace troupe::cli
