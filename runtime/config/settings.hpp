#pragma once
// troupe's settings: the structs the schema (settings.def) declares, and its
// keys as data, for every place a setting enters or is shown: the command
// line and the TOML file (tools/troupe/settings_flags.cpp), TROUPE_*
// environment variables, node overrides, the live `set` command (the
// router), `admin config`, shell completion, `troupe settings`.  A value is
// checked once, by its key, where it enters; the code that uses a setting
// reads the struct field (docs/architecture.md §6.5).
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe {

using string_list = std::vector<std::string>;

#define TROUPE_FIELD_IN_engine_engine(type, key, def) type key = def;
#define TROUPE_FIELD_IN_engine_service(type, key, def)
#define TROUPE_FIELD_IN_engine_cluster(type, key, def)
#define TROUPE_FIELD_IN_service_engine(type, key, def)
#define TROUPE_FIELD_IN_service_service(type, key, def) type key = def;
#define TROUPE_FIELD_IN_service_cluster(type, key, def)
#define TROUPE_FIELD_IN_cluster_engine(type, key, def)
#define TROUPE_FIELD_IN_cluster_service(type, key, def)
#define TROUPE_FIELD_IN_cluster_cluster(type, key, def) type key = def;

// [engine]: what each engine instance runs with; travels to nodes inside
// instance_spec (messages/node.hpp).
struct engine_settings {
#define TROUPE_SETTING(section, key, type, def, ...) \
  TROUPE_FIELD_IN_engine_##section(type, key, def)
#include "runtime/config/settings.def"
};

// [service]: the serving process (endpoints, limits) and its router.
struct service_settings {
#define TROUPE_SETTING(section, key, type, def, ...) \
  TROUPE_FIELD_IN_service_##section(type, key, def)
#include "runtime/config/settings.def"
};

// [cluster]: how the processes of a cluster reach each other.
struct cluster_settings {
#define TROUPE_SETTING(section, key, type, def, ...) \
  TROUPE_FIELD_IN_cluster_##section(type, key, def)
#include "runtime/config/settings.def"
};

struct settings {
  engine_settings engine;
  service_settings service;
  cluster_settings cluster;
};

// Where a setting takes effect (settings.def's APPLIES).
enum class applies { engine, router, service, cluster };
const char* to_string(applies a);

// Settings.def's TRAITS.
namespace trait {
constexpr unsigned live = 1;       // the `set` command changes it while serving
constexpr unsigned local = 2;      // a flag of the one-process commands too
constexpr unsigned per_node = 4;   // a [[cluster.node]] table may give its own value
constexpr unsigned env = 8;        // TROUPE_<KEY> sets it before the file and the command line
constexpr unsigned secret = 16;    // admin config shows no value
constexpr unsigned required = 32;  // it must be given
}  // namespace trait

enum class value_type { integer, real, boolean, text, list };
const char* to_string(value_type t);

// What a value must be (settings.def's RULE).
struct value_rule {
  enum class kind { any, non_empty, range, one_of, checked } what = kind::any;
  double lo = 0, hi = 0;
  std::vector<std::string> allowed;
  std::string (*check)(const std::string&) = nullptr;  // "" or why not
  std::string describe() const;                        // for help: "[1, 65536]", "one of a, b"
};

// One key of the schema.
struct setting_key {
  std::string section, key;
  value_type type = value_type::text;
  value_rule rule;
  applies where = applies::engine;
  unsigned traits = 0;
  std::string flag_names;  // CLI11's names: "--max-seqs", "-m,--model"
  std::string help;
  std::string deprecated_for;  // an alias: the key it names ("engine.queue_steps")
  // Checks the text and stores it (a list appends each comma-separated
  // item); "" or why not.
  std::string (*set)(settings&, const std::string&) = nullptr;
  void (*clear)(settings&) = nullptr;  // a list: empty again (a later layer replaces it)
  nlohmann::json (*get)(const settings&) = nullptr;

  std::string name() const { return section + "." + key; }  // "engine.max_seqs"
  std::string env_name() const;                             // "TROUPE_MAX_SEQS"
  bool has(unsigned t) const { return (traits & t) != 0; }
  bool alias() const { return !deprecated_for.empty(); }
  std::string default_text() const;  // the value a default `settings` has, as text
};

// Every key, in settings.def's order (aliases after the key they name).
const std::vector<setting_key>& setting_keys();

// "engine.max_seqs", or a bare key that one section has ("max_seqs");
// nullptr when none.
const setting_key* find_setting(const std::string& name);

// The keys with trait `t`, bare names ("max_seqs, max_batch_tokens, ...").
std::string keys_with(unsigned t);

// TROUPE_<KEY> of every key with the env trait (that `pick` takes, when
// given), into `s`; throws std::invalid_argument naming the variable when
// its value is refused.
void apply_env(settings& s, const std::function<bool(const setting_key&)>& pick = nullptr);

// {section: {key: value}}: every key but aliases, secrets as a count.
nlohmann::json to_json(const settings& s);

// The checks for RULE checked(fn).
std::string check_endpoint(const std::string& v);      // tcp://, ipc://, inproc://
std::string check_node_address(const std::string& v);  // HOST:PORT
std::string check_stage_place(const std::string& v);   // local or HOST:PORT
// An address others dial, in one spelling: HOST:PORT with a printable host
// of at most 255 bytes and a port above 0 without leading zeros (a second
// spelling of a node would be taken for another node).
std::string check_dial_address(const std::string& v);
std::string check_role(const std::string& v);       // prefill, decode, mixed, encode
std::string check_epd(const std::string& v);        // EP-D, ED-P, E-P-D, EPD (any case)
std::string check_registry(const std::string& v);   // etcd://HOST:PORT[,HOST:PORT...]
std::string check_autoscale(const std::string& v);  // MIN:MAX, 1 <= MIN <= MAX

// A registry URL's endpoints (etcd://A:1,B:2 -> A:1, B:2); throws
// std::invalid_argument saying what is wrong.
std::vector<std::string> registry_endpoints(const std::string& url);

}  // namespace troupe
