#pragma once
// The settings schema (runtime/config/settings.def) on the command line and
// in the TOML file: a subcommand takes the keys it picks as flags, and
// resolve() applies the layers in order, each value checked by its key:
//   the default < TROUPE_<KEY> (keys with the env trait) < the TOML file
//   (--config, troupe serve) < the command line.
// A refused value stops the command with the key's name and where the value
// came from.
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/config/settings.hpp"

namespace troupe::cli {

// One [[cluster.node]] table: a node, how many instances it runs for the
// service, and [engine] keys (those with the per_node trait) that differ
// there, checked when the file is read.
struct node_entry {
  std::string address;
  int instances = 1;
  std::vector<std::pair<const setting_key*, std::string>> overrides;
  // The service's [engine] settings with this node's overrides.
  engine_settings apply(const engine_settings& base) const;
};

class settings_flags {
 public:
  using pick_fn = std::function<bool(const setting_key&)>;

  // Adds a flag to `cmd` for every key `pick` takes (aliases of picked
  // keys too, out of --help).  `takes_file`: the command reads a TOML file
  // (troupe serve --config), which its messages then mention.
  settings_flags(CLI::App& cmd, pick_fn pick, bool takes_file = false);

  // The settings after every layer; `config_file` may be empty.  Only the
  // picked keys' TROUPE_* variables are read.  Throws
  // std::invalid_argument.
  settings resolve(const std::string& config_file = {});

  // The [[cluster.node]] tables of the last resolve's file.
  const std::vector<node_entry>& node_entries() const { return nodes_; }

  // Keys the one-process commands take (generate, perplexity, bench).
  static bool local_keys(const setting_key& k) { return k.has(trait::local); }

 private:
  struct bound {
    const setting_key* key = nullptr;
    CLI::Option* opt = nullptr;
    std::string value;                // a scalar's, as given
    std::vector<std::string> values;  // a list's
  };
  void load_file(const std::string& path, settings& s);
  // `prefix` starts any error: where the value came from, and the key.
  void set_from(settings& s, const setting_key& k, const std::vector<std::string>& values,
                const std::string& prefix);
  bool picked(const setting_key& k) const;     // an alias as the key it names
  std::vector<std::unique_ptr<bound>> bound_;  // CLI11 keeps pointers into these
  std::vector<node_entry> nodes_;
  pick_fn pick_;
  bool takes_file_ = false;
};

// `troupe settings`: every key of the schema, as text or a markdown table.
void add_settings(CLI::App& app);

}  // namespace troupe::cli
