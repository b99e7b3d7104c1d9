// The settings schema (runtime/config/settings.def): every key is whole, its
// default passes its own rule, values are checked once by their key, and the
// [engine] settings cross processes intact.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <cstdlib>
#include <set>

#include "messages/actors.hpp"
#include "messages/node.hpp"
#include "runtime/config/settings.hpp"
#include "runtime/engine/ngram_draft.hpp"

namespace troupe {
namespace {

TEST(Settings, EveryKeyIsWholeAndItsDefaultPassesItsRule) {
  std::set<std::string> names, flags;
  for (const auto& k : setting_keys()) {
    EXPECT_TRUE(names.insert(k.name()).second) << "twice: " << k.name();
    EXPECT_TRUE(flags.insert(k.flag_names).second) << "flag twice: " << k.flag_names;
    EXPECT_FALSE(k.help.empty()) << k.name();
    ASSERT_TRUE(k.set && k.get && k.clear) << k.name();
    if (k.alias()) {
      ASSERT_NE(find_setting(k.deprecated_for), nullptr) << k.name();
      continue;
    }
    // The default, written back through the key, is taken unchanged
    // (required keys and empty lists have no default to write).
    const std::string def = k.default_text();
    if (def.empty()) continue;
    settings s;
    k.clear(s);
    EXPECT_EQ(k.set(s, def), "") << k.name() << " refuses its default " << def;
    EXPECT_EQ(k.get(s), k.get(settings{})) << k.name();
  }
  EXPECT_GT(names.size(), 80u);
}

TEST(Settings, ValuesAreCheckedByTheirKey) {
  settings s;
  const auto* max_seqs = find_setting("max_seqs");
  ASSERT_NE(max_seqs, nullptr);
  EXPECT_EQ(max_seqs->name(), "engine.max_seqs");
  EXPECT_EQ(find_setting("engine.max_seqs"), max_seqs);
  EXPECT_EQ(max_seqs->set(s, "12"), "");
  EXPECT_EQ(s.engine.max_seqs, 12);
  EXPECT_NE(max_seqs->set(s, "0").find("must be an integer in [1, 65536]"), std::string::npos);
  EXPECT_NE(max_seqs->set(s, "12x").find("must be an integer"), std::string::npos);
  EXPECT_EQ(s.engine.max_seqs, 12) << "a refused value changes nothing";

  const auto* preemption = find_setting("preemption");
  EXPECT_NE(preemption->set(s, "drop").find("one of recompute, swap"), std::string::npos);
  EXPECT_EQ(preemption->set(s, "swap"), "");
  EXPECT_EQ(s.engine.preemption, "swap");

  const auto* graph = find_setting("graph");
  EXPECT_EQ(graph->set(s, "1"), "");
  EXPECT_TRUE(s.engine.graph);
  EXPECT_EQ(graph->set(s, "FALSE"), "");
  EXPECT_FALSE(s.engine.graph);
  EXPECT_NE(graph->set(s, "maybe").find("true or false"), std::string::npos);

  // A list takes comma-separated items, each checked; clear() starts over.
  const auto* roles = find_setting("service.roles");
  EXPECT_EQ(roles->set(s, "prefill,decode"), "");
  EXPECT_EQ(roles->set(s, "decode"), "");
  EXPECT_EQ(s.service.roles, (string_list{"prefill", "decode", "decode"}));
  EXPECT_NE(roles->set(s, "both").find("not a role"), std::string::npos);
  roles->clear(s);
  EXPECT_TRUE(s.service.roles.empty());
  EXPECT_NE(find_setting("nodes")->set(s, "nohost").find("HOST:PORT"), std::string::npos);
  EXPECT_NE(find_setting("listen")->set(s, "http://x").find("tcp://"), std::string::npos);

  EXPECT_EQ(find_setting("no_such_key"), nullptr);
}

TEST(Settings, TheOldNameOfQueueStepsSetsTheNewOne) {
  const auto* old = find_setting("engine.pipeline");
  ASSERT_NE(old, nullptr);
  EXPECT_TRUE(old->alias());
  EXPECT_EQ(old->deprecated_for, "engine.queue_steps");
  settings s;
  EXPECT_EQ(old->set(s, "false"), "");
  EXPECT_FALSE(s.engine.queue_steps);
}

// The rules a number may have: a range (the parsers bound-check ranges
// only), and the draft limit is the engine's.
TEST(Settings, NumbersHaveRangesAndTheDraftLimitIsTheEngines) {
  for (const auto& k : setting_keys()) {
    if (k.type == value_type::integer || k.type == value_type::real) {
      EXPECT_EQ(k.rule.what, value_rule::kind::range) << k.name();
    }
  }
  EXPECT_EQ(find_setting("engine.draft_tokens")->rule.hi, k_max_draft_tokens);
}

TEST(Settings, LiveKeysAreTheOnesSomethingAppliesLive) {
  // The router applies service.router; the engine applies these three
  // (engine::set_limit).  A key marked live that nothing applies would be
  // accepted by `set` and do nothing.
  EXPECT_EQ(keys_with(trait::live), "max_batch_tokens, max_seqs, chunk_size, router");
}

TEST(Settings, EnvironmentVariablesOnlyWhereTheSchemaSays) {
  ::setenv("TROUPE_GRAPH", "1", 1);
  ::setenv("TROUPE_MAX_SEQS", "3", 1);  // max_seqs has no env trait: ignored
  settings s;
  apply_env(s);
  EXPECT_TRUE(s.engine.graph);
  EXPECT_EQ(s.engine.max_seqs, 64);
  // A command that does not take a key does not read its variable.
  ::setenv("TROUPE_TOKEN_TILE", "99", 1);
  apply_env(s, [](const setting_key& k) { return k.section == "cluster"; });
  try {
    apply_env(s);
    ADD_FAILURE() << "a bad value in the environment must stop the start";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("TROUPE_TOKEN_TILE (engine.token_tile)"),
              std::string::npos)
        << e.what();
  }
  for (const char* v : {"TROUPE_GRAPH", "TROUPE_MAX_SEQS", "TROUPE_TOKEN_TILE"}) ::unsetenv(v);
}

TEST(Settings, AdminConfigShowsValuesButNoSecrets) {
  settings s;
  find_setting("api_key")->set(s, "sk-one,sk-two");
  const auto j = to_json(s);
  EXPECT_EQ(j["engine"]["max_seqs"], 64);
  EXPECT_EQ(j["service"]["router"], "least-load");
  EXPECT_EQ(j["service"]["api_key"], "2 keys (not shown)");
  EXPECT_EQ(j.dump().find("sk-one"), std::string::npos);
  EXPECT_FALSE(j["engine"].contains("pipeline"));
}

// instance_spec carries the [engine] settings to a node: every field of the
// schema crosses (the inspect is generated from settings.def).
TEST(Settings, EngineSettingsCrossProcessesIntact) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  instance_spec a;
  settings s;
  for (const auto& [key, value] : {std::pair{"model", "smollm2-135m-instruct"},
                                   {"kv_mb", "77"},
                                   {"graph", "true"},
                                   {"preemption", "swap"},
                                   {"token_tile", "4"},
                                   {"step_overlap", "false"}})
    ASSERT_EQ(find_setting(std::string("engine.") + key)->set(s, value), "") << key;
  a.engine = s.engine;
  a.role = "decode";
  a.tpot_target_ms = 40;
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(a));
  instance_spec b;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(b));
  EXPECT_EQ(caf::deep_to_string(a), caf::deep_to_string(b));
  EXPECT_EQ(b.engine.kv_mb, 77);
  EXPECT_EQ(b.engine.token_tile, 4);
  EXPECT_FALSE(b.engine.step_overlap);
  EXPECT_EQ(b.role, "decode");
}

}  // namespace
}  // namespace troupe
