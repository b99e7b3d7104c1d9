// Every type registered for messages (messages/actors.hpp) survives CAF's
// binary serializer: a default value and its copy read back print the
// same, and the registered name makes a value of the type.  A type whose
// inspect overload is missing or wrong fails here, not in a cluster.
#include <gtest/gtest.h>

#include "messages/actors.hpp"

namespace troupe {
namespace {

TEST(MessageTypes, EveryRegisteredTypeRoundTripsByName) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  int n = 0;
  for_each_message_type([&]<class T>(const char* name) {
    ++n;
    SCOPED_TRACE(name);
    auto made = sys.types().make_value(name);
    ASSERT_TRUE(made) << "no type registered as " << name;
    T value{};
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    ASSERT_FALSE(sink(value));
    T back{};
    caf::binary_deserializer source{sys, buf};
    ASSERT_FALSE(source(back));
    EXPECT_EQ(caf::deep_to_string(back), caf::deep_to_string(value));
    EXPECT_EQ(source.remaining(), 0u);
  });
  EXPECT_GT(n, 30);
}

// The load snapshot carries what placement needs across processes (the
// prefix hashes were once left out of its inspect overload).
TEST(MessageTypes, InstanceStatsKeepEveryFieldAcrossTheWire) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  instance_stats s;
  s.waiting = 3;
  s.running = 4;
  s.queued_prefill_tokens = 99;
  s.step_ms = 1.5;
  s.prefix_hashes = {7, 8, 9};
  s.kv.total = 12;
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(s));
  instance_stats back;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(back));
  EXPECT_EQ(back.waiting, 3);
  EXPECT_EQ(back.running, 4);
  EXPECT_EQ(back.queued_prefill_tokens, 99);
  EXPECT_EQ(back.step_ms, 1.5);
  EXPECT_EQ(back.prefix_hashes, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_EQ(back.kv.total, 12);
}

}  // namespace
}  // namespace troupe
