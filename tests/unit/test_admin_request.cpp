// The admin endpoint's request parser (net/admin_request): every field
// of every type gets an answer, never an exception.  Issue 31: a
// `"secret": null` threw out of the endpoint's loop and the admin port was
// gone for the life of the process.
#include <gtest/gtest.h>

#include <string>

#include "net/admin_request.hpp"

namespace troupe {
namespace {

// "refused: MESSAGE", "arguments: ERROR", or "ok".
std::string outcome(const std::string& body) {
  auto r = parse_admin_request(body);
  if (auto* no = std::get_if<admin_refusal>(&r)) return "refused: " + no->message;
  const auto& req = std::get<admin_request>(r);
  return req.argument_error.empty() ? "ok" : "arguments: " + req.argument_error;
}

TEST(AdminRequest, EnvelopeFieldsOfTheWrongTypeAreRefused) {
  EXPECT_EQ(outcome(R"({"secret":null,"command":"kv"})"), "refused: \"secret\" must be a string");
  EXPECT_EQ(outcome(R"({"secret":5,"command":"kv"})"), "refused: \"secret\" must be a string");
  EXPECT_EQ(outcome(R"({"secret":"s","command":7})"), "refused: \"command\" must be a string");
  EXPECT_EQ(outcome(R"({"secret":"s","command":["kv"]})"), "refused: \"command\" must be a string");
  for (const char* not_an_object : {"", "null", "[]", "\"kv\"", "{", "{\"secret\":", "7"})
    EXPECT_EQ(outcome(not_an_object), "refused: the request is not a JSON object") << not_an_object;
  EXPECT_EQ(outcome(R"({"secret":"s","command":"kv"})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"kv"})"), "ok");  // no secret: refused by authentication
}

TEST(AdminRequest, ArgumentsAreTypeAndRangeChecked) {
  EXPECT_EQ(outcome(R"({"command":"trace","id":3})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"trace","id":-3})"),
            "arguments: trace needs \"id\": a request id (unsigned)");
  EXPECT_EQ(outcome(R"({"command":"trace","id":"3"})"),
            "arguments: trace needs \"id\": a request id (unsigned)");
  EXPECT_EQ(outcome(R"({"command":"migrate","id":3,"instance":null})"),
            "arguments: migrate needs \"instance\": an instance id (unsigned)");
  EXPECT_EQ(outcome(R"({"command":"set","key":"max_seqs","value":"4"})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"set","key":7,"value":"4"})"),
            "arguments: set needs \"key\" and \"value\" (strings)");
  EXPECT_EQ(outcome(R"({"command":"set","key":"k","value":null})"),
            "arguments: set needs \"key\" and \"value\" (strings)");
  EXPECT_EQ(outcome(R"({"command":"role","instance":1,"role":{}})"),
            "arguments: role needs \"role\": prefill, decode, mixed or encode");
  EXPECT_EQ(outcome(R"({"command":"spawn","node":"127.0.0.1:7001","count":2})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"spawn","node":1,"count":2})"),
            "arguments: spawn needs \"node\" (HOST:PORT) and \"count\"");
  // A count that once wrapped through int32 (2^32 + 1 -> 1); the range
  // itself (1 to 64) is the node link's to check.
  for (const char* count : {"4294967297", "-4294967297", "18446744073709551615"})
    EXPECT_NE(outcome(std::string(R"({"command":"spawn","node":"h:1","count":)") + count + "}")
                  .find("give 1 to 64 instances"),
              std::string::npos)
        << count;
  EXPECT_EQ(outcome(R"({"command":"spawn","node":"h:1","count":0})"), "ok");
  // heads: the same, with a count of KV heads (0: home again).
  EXPECT_EQ(outcome(R"({"command":"heads","instance":1,"from":1,"to":0,"heads":0})"), "ok");
  EXPECT_NE(outcome(R"({"command":"heads","instance":1,"from":1,"to":0})").find("heads needs"),
            std::string::npos);
  // layers: an instance, two stages and a count, each a small integer.
  EXPECT_EQ(outcome(R"({"command":"layers","instance":1,"from":0,"to":1,"layers":2})"), "ok");
  for (const char* bad : {R"("from":-1,"to":1,"layers":2)", R"("from":0,"to":"1","layers":2)",
                          R"("from":0,"to":1,"layers":65536)", R"("from":0,"to":1)",
                          R"("from":0,"to":1,"layers":4294967298)"})
    EXPECT_NE(outcome(std::string(R"({"command":"layers","instance":1,)") + bad + "}")
                  .find("layers needs \"from\" and \"to\""),
              std::string::npos)
        << bad;
  // node_add takes a count or not (1); node_remove an address alone.
  EXPECT_EQ(outcome(R"({"command":"node_add","node":"h:1"})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"node_add","node":"h:1","count":3})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"node_add","node":"h:1","count":"3"})"),
            "arguments: node_add needs \"node\" (HOST:PORT) and \"count\"");
  EXPECT_EQ(outcome(R"({"command":"node_add"})"), "arguments: node_add needs \"node\" (HOST:PORT)");
  EXPECT_EQ(outcome(R"({"command":"node_remove","node":"h:1"})"), "ok");
  EXPECT_EQ(outcome(R"({"command":"node_remove","node":null})"),
            "arguments: node_remove needs \"node\" (HOST:PORT)");
  auto added =
      std::get<admin_request>(parse_admin_request(R"({"command":"node_add","node":"h:1"})"));
  EXPECT_EQ(added.count, 1);
}

TEST(AdminRequest, TheParsedFieldsAreThoseSent) {
  auto r = parse_admin_request(
      R"({"secret":"abc","command":"migrate","id":12,"instance":3,"extra":[1,2]})");
  ASSERT_TRUE(std::holds_alternative<admin_request>(r));
  const auto& req = std::get<admin_request>(r);
  EXPECT_EQ(req.secret, "abc");
  EXPECT_EQ(req.command, "migrate");
  EXPECT_EQ(req.id, 12u);
  EXPECT_EQ(req.instance, 3u);
  EXPECT_TRUE(admin_command_is_read_only("kv"));
  EXPECT_FALSE(admin_command_is_read_only("cancel"));
}

// Deep nesting costs the parser heap, not stack (64 KiB frames at most).
TEST(AdminRequest, DeeplyNestedBodiesAreAnswered) {
  const std::string deep =
      R"({"command":"kv","x":)" + std::string(30000, '[') + std::string(30000, ']') + "}";
  EXPECT_EQ(outcome(deep), "ok");
  EXPECT_EQ(outcome(std::string(100000, '[')), "refused: the request is not a JSON object");
}

}  // namespace
}  // namespace troupe
