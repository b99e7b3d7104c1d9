// A cluster's membership through the registry (issue 37): the node record
// a node keeps in etcd, the diff a service turns it into, the registry URL,
// and the etcd key range of a prefix.
#include <gtest/gtest.h>

#include "net/etcd_client.hpp"
#include "runtime/config/settings.hpp"
#include "runtime/service/membership.hpp"

namespace troupe {
namespace {

node_record rec(const std::string& address, int32_t instances = 1) {
  node_record r;
  r.address = address;
  r.instances = instances;
  return r;
}

TEST(Membership, ARecordRoundTripsAndBrokenOnesAreNamed) {
  node_record r = rec("10.0.0.2:7001", 3);
  r.cores = 16;
  r.mem_total = int64_t(64) << 30;
  r.devices = {"0/0: pthread"};
  std::string why;
  auto back = parse_registry_value(to_registry_value(r), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->address, r.address);
  EXPECT_EQ(back->instances, 3);
  EXPECT_EQ(back->cores, 16);
  EXPECT_EQ(back->mem_total, r.mem_total);
  EXPECT_EQ(back->devices, r.devices);

  const std::pair<const char*, const char*> broken[] = {
      {"", "not a JSON object"},
      {"[1]", "not a JSON object"},
      {R"({"instances":1})", "no address"},
      {R"({"address":7})", "no address"},
      {R"({"address":"host"})", "address 'host' has no port"},
      {R"({"address":"h:1","instances":0})", "instances is not 1 to 64"},
      {R"({"address":"h:1","instances":"2"})", "instances is not 1 to 64"},
      {R"({"address":"h:1","instances":65})", "instances is not 1 to 64"},
      // A log line forged through the address, a space: refused.
      {R"({"address":"h:1\n[info] FAKE"})", "the address holds a space or a control character"},
      {R"({"address":"h :1"})", "the address holds a space or a control character"},
  };
  for (const auto& [text, want] : broken) {
    why.clear();
    EXPECT_FALSE(parse_registry_value(text, &why)) << text;
    EXPECT_EQ(why, want) << text;
  }
  // Unknown fields and odd resources are ignored: a newer node's record.
  auto odd = parse_registry_value(R"({"address":"h:1","cores":"x","zone":"b"})", &why);
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->instances, 1);
  EXPECT_EQ(odd->cores, 0);
}

TEST(Membership, TheDiffJoinsNewNodesAndDropsOnlyThoseTheRegistryBrought) {
  // a joined through the registry and still there; b joined, now gone;
  // c new; s was given at start (never dropped, never joined twice).
  auto change = diff_membership({"a:1", "b:1"}, {"s:1"}, {rec("a:1"), rec("c:1", 2), rec("s:1")});
  ASSERT_EQ(change.join.size(), 1u);
  EXPECT_EQ(change.join[0].address, "c:1");
  EXPECT_EQ(change.join[0].instances, 2);
  EXPECT_EQ(change.leave, std::vector<std::string>{"b:1"});
  // A started node missing from the registry stays; one address twice joins once.
  change = diff_membership({}, {"s:1"}, {rec("d:1"), rec("d:1", 4)});
  ASSERT_EQ(change.join.size(), 1u);
  EXPECT_EQ(change.join[0].instances, 1);
  EXPECT_TRUE(change.leave.empty());
  // An empty registry drops every node it brought.
  change = diff_membership({"a:1", "b:1"}, {}, {});
  EXPECT_EQ(change.leave, (std::vector<std::string>{"a:1", "b:1"}));
}

TEST(Membership, RegistryUrlsAreCheckedWhereTheyEnter) {
  EXPECT_EQ(registry_endpoints("etcd://127.0.0.1:2379"),
            std::vector<std::string>{"127.0.0.1:2379"});
  EXPECT_EQ(registry_endpoints("etcd://a:1,b:2"), (std::vector<std::string>{"a:1", "b:2"}));
  for (const char* bad : {"", "http://a:1", "etcd://", "etcd://a", "etcd://a:1,", "etcd://:1",
                          "etcd://a:99999", "etcd://a:x", "etcd://a:1,,b:2"}) {
    EXPECT_THROW(registry_endpoints(bad), std::invalid_argument) << bad;
    EXPECT_FALSE(check_registry(bad).empty()) << bad;
  }
  EXPECT_TRUE(check_registry("etcd://h:2379").empty());
}

TEST(Membership, ADialledAddressHasOneSpelling) {
  EXPECT_TRUE(check_dial_address("127.0.0.1:7001").empty());
  EXPECT_TRUE(check_dial_address("node-3.example:65535").empty());
  for (const char* bad :
       {"127.0.0.1:0", "127.0.0.1:07001", ":7001", "host", "h ost:1", "h\n:1", "127.0.0.1:65536"})
    EXPECT_FALSE(check_dial_address(bad).empty()) << bad;
  EXPECT_FALSE(check_dial_address(std::string(256, 'a') + ":1").empty());
}

TEST(Membership, APrefixRangeEndsAfterItsLastKey) {
  EXPECT_EQ(prefix_end("/troupe/x/nodes/"), "/troupe/x/nodes0");
  EXPECT_EQ(prefix_end("a\xff"), "b");
  EXPECT_EQ(prefix_end(std::string("\xff\xff")), std::string(1, '\0'));
}

}  // namespace
}  // namespace troupe
