// runtime/common/user_text.hpp: what an error may say about a value a
// user gave, and reading a whole text as a number.
#include "runtime/common/user_text.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "runtime/config/settings.hpp"

namespace troupe {
namespace {

TEST(UserText, ShortValuesAreQuotedAsTheyAre) {
  EXPECT_EQ(quoted_value("tcp://x"), "'tcp://x'");
  EXPECT_EQ(quoted_value(""), "''");
}

TEST(UserText, LongValuesAreClippedWithTheirSize) {
  const std::string big(50u << 20, 'a');  // the 50 MB setting of the probe
  const std::string q = quoted_value(big);
  EXPECT_LT(q.size(), 200u);
  EXPECT_EQ(q.substr(0, 81), "'" + std::string(80, 'a'));
  EXPECT_NE(q.find("... (52428800 bytes)"), std::string::npos) << q;
}

// A cut inside a multi-byte character would leave bytes no JSON dump
// takes (the admin endpoint's reply carries such errors).
TEST(UserText, ClippingKeepsUtf8Whole) {
  std::string v = "a";
  for (int i = 0; i < 41; ++i) v += "\xc3\xa9";  // é
  const std::string q = quoted_value(v);
  EXPECT_NO_THROW((void)nlohmann::json(q).dump()) << q;
  EXPECT_NE(q.find("... (83 bytes)"), std::string::npos) << q;
}

TEST(UserText, ControlBytesAreShownNotSent) {
  EXPECT_EQ(quoted_value(std::string("a\x1b[2Jb\n\x7f", 8)), "'a\\x1b[2Jb\\x0a\\x7f'");
  EXPECT_EQ(quoted_value(std::string("\0", 1)), "'\\x00'");
}

TEST(UserText, WholeTextsAreNumbersAndNothingElseIs) {
  long v = 7;
  EXPECT_TRUE(whole_text_as("8080", v));
  EXPECT_EQ(v, 8080);
  for (const char* bad : {"", " 1", "1 ", "12abc", "+1", "0x10", "1e3", "99999999999999999999"}) {
    long w = 7;
    EXPECT_FALSE(whole_text_as(bad, w)) << bad;
    EXPECT_EQ(w, 7) << bad;
  }
  uint64_t u = 0;
  EXPECT_FALSE(whole_text_as("-1", u));
  EXPECT_EQ(port_number("0"), 0);
  EXPECT_EQ(port_number("65535"), 65535);
  EXPECT_EQ(port_number("65536"), -1);
  EXPECT_EQ(port_number("-1"), -1);
  EXPECT_EQ(port_number("80x"), -1);
}

// The settings' errors go through it: a huge value is not echoed whole.
TEST(UserText, SettingErrorsDoNotEchoAHugeValue) {
  const std::string big = "tcp://" + std::string(1u << 20, 'h') + ":x";
  const std::string why = check_endpoint(big);
  ASSERT_FALSE(why.empty());
  EXPECT_LT(why.size(), 300u) << why.substr(0, 300);
  EXPECT_NE(why.find("bytes)"), std::string::npos) << why.substr(0, 300);
  settings s;
  const setting_key* k = find_setting("engine.instance_cores");
  ASSERT_NE(k, nullptr);
  const std::string why_int = k->set(s, std::string(1u << 20, '9'));
  ASSERT_FALSE(why_int.empty());
  EXPECT_LT(why_int.size(), 300u);
}

}  // namespace
}  // namespace troupe
