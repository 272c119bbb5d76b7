// Error messages repeat a value whole when it is short, and clipped when it is long: a 50 MB
// configuration string or file name must not flood the terminal (core/error.hpp).
#include "core/error.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <string_view>

namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const pf::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ErrorMessages, ShortValuesAreRepeatedWhole) {
  const std::string v(pf::kMaxQuoted, 'x');
  EXPECT_EQ(pf::clip_for_message(v), v);
  EXPECT_EQ(message_of([&] { pf::usage_error("model.arch", "'{}' is not one of {}", v, "bert, gpt"); }),
            "model.arch: '" + v + "' is not one of bert, gpt");
}

TEST(ErrorMessages, LongValuesAreClippedWithTheirLength) {
  const std::string v = "head" + std::string(50'000'000, 'x') + "tail";
  const std::string clipped = pf::clip_for_message(v);
  EXPECT_EQ(clipped, "head" + std::string(56, 'x') + "..." + std::string(16, 'x') + "tail (50000008 bytes)");
  // Every text argument of usage_error and its `what`: std::string, string_view, C strings.
  const std::string m = message_of([&] {
    pf::usage_error(v, "'{}' and '{}' and '{}' at {}", v, std::string_view(v), v.c_str(), 7);
  });
  EXPECT_EQ(m, clipped + ": '" + clipped + "' and '" + clipped + "' and '" + clipped + "' at 7");
}

// The cut never splits a UTF-8 character: 3-byte characters around both cut points.
TEST(ErrorMessages, ClippingKeepsUtf8Whole) {
  std::string v;
  while (v.size() < 300) v += "\xe2\x82\xac";  // U+20AC, 3 bytes
  const std::string clipped = pf::clip_for_message(v);
  const std::string head = clipped.substr(0, clipped.find("..."));
  const std::string tail = clipped.substr(clipped.find("...") + 3, clipped.find(" (") - clipped.find("...") - 3);
  EXPECT_EQ(head.size() % 3, 0u) << head.size();
  EXPECT_EQ(tail.size() % 3, 0u) << tail.size();
  EXPECT_EQ(head, v.substr(0, head.size()));
  EXPECT_EQ(tail, v.substr(v.size() - tail.size()));
  EXPECT_NE(clipped.find("(300 bytes)"), std::string::npos);
}

}  // namespace
