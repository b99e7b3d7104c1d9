// The cluster's global state in etcd (issue 37 item 4): records of nodes'
// load and of services, read back strictly, and services ranked by load.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/service/cluster_state.hpp"
#include "runtime/service/membership.hpp"

namespace troupe {
namespace {

TEST(ClusterState, NodeLoadTravelsInTheNodeRecord) {
  node_record r;
  r.address = "127.0.0.1:7000";
  r.load.instances = 2;
  r.load.running = 5;
  r.load.waiting = 1;
  r.load.used_pages = 40;
  r.load.total_pages = 512;
  r.load.kv_host_pages = 17;
  r.load.kv_hits = 9;
  r.load.kv_misses = 3;
  std::string why;
  auto back = parse_registry_value(to_registry_value(r), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(to_json(back->load), to_json(r.load));
  // An older record without load reads as no load; a broken one as zeros.
  auto old = parse_registry_value(R"({"address":"h:1"})", &why);
  ASSERT_TRUE(old);
  EXPECT_EQ(old->load.running, 0);
  auto odd = parse_registry_value(R"({"address":"h:1","load":{"running":"x","waiting":-3}})", &why);
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->load.running, 0);
  EXPECT_EQ(odd->load.waiting, -3);
  EXPECT_FALSE(parse_registry_value(std::string(70000, ' '), &why));
  EXPECT_EQ(why, "larger than 64 KiB");
}

TEST(ClusterState, ServiceRecordsAreReadStrictly) {
  service_record s;
  s.id = "abc";
  s.endpoints = {"tcp://127.0.0.1:5555"};
  s.model = "stories15m";
  s.instances = 2;
  s.serving = 2;
  s.in_flight = 4;
  std::string why;
  auto back = parse_service_record(to_registry_value(s), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->endpoints, s.endpoints);
  EXPECT_EQ(back->in_flight, 4);
  for (const char* bad :
       {"", "[]", "{}", R"({"id":"a"})", R"({"id":"a","endpoints":[]})",
        R"({"id":"a","endpoints":[7]})", R"({"id":"a\n","endpoints":["tcp://h:1"]})",
        R"({"id":"a","endpoints":["tcp://h:1\u0001"]})"}) {
    EXPECT_FALSE(parse_service_record(bad, &why)) << bad;
    EXPECT_FALSE(why.empty());
  }
  EXPECT_FALSE(parse_service_record(std::string(70000, ' '), &why));
  // Numbers out of range are clamped, never wrapped; a model that would
  // steer a terminal is dropped.
  auto big = parse_service_record(
      R"({"id":"a","endpoints":["tcp://h:1"],"serving":99999999999,"running":18446744073709551615,)"
      R"("waiting":-5,"model":"x\u001b[2J"})",
      &why);
  ASSERT_TRUE(big) << why;
  EXPECT_EQ(big->serving, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(big->running, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(big->waiting, -5);
  EXPECT_EQ(big->model, "");
}

TEST(ClusterState, WildcardEndpointsNameTheMachine) {
  EXPECT_EQ(dialable_endpoint("tcp://0.0.0.0:5555", "gpu7"), "tcp://gpu7:5555");
  EXPECT_EQ(dialable_endpoint("tcp://*:5555", "gpu7"), "tcp://gpu7:5555");
  EXPECT_EQ(dialable_endpoint("tcp://[::]:5555", "gpu7"), "tcp://gpu7:5555");
  EXPECT_EQ(dialable_endpoint("tcp://127.0.0.1:5555", "gpu7"), "tcp://127.0.0.1:5555");
  EXPECT_EQ(dialable_endpoint("ipc:///tmp/x", "gpu7"), "ipc:///tmp/x");
  EXPECT_EQ(dialable_endpoint("tcp://0.0.0.0:5555", ""), "tcp://0.0.0.0:5555");
}

TEST(ClusterState, ServicesAreRankedByLoadPerServingInstance) {
  auto svc = [](std::string id, std::string ep, int serving, int64_t in_flight) {
    service_record s;
    s.id = std::move(id);
    s.endpoints = {std::move(ep)};
    s.serving = serving;
    s.in_flight = in_flight;
    return s;
  };
  auto ranked = rank_service_endpoints({svc("a", "tcp://a:1", 2, 8), svc("b", "tcp://b:1", 4, 8),
                                        svc("c", "tcp://c:1", 0, 0), svc("d", "tcp://b:1", 1, 0)});
  // d (0 per instance) first, b (2), a (4); c serves nothing: last; b's
  // endpoint once.
  EXPECT_EQ(ranked, (std::vector<std::string>{"tcp://b:1", "tcp://a:1", "tcp://c:1"}));
  EXPECT_TRUE(rank_service_endpoints({}).empty());
}

}  // namespace
}  // namespace troupe
