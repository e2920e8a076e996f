#include <gtest/gtest.h>

#include "loom/core/strings.h"

namespace s = loom::strings;

TEST(Strings, EditDistance) {
  EXPECT_EQ(s::edit_distance("", ""), 0u);
  EXPECT_EQ(s::edit_distance("steps", "steps"), 0u);
  EXPECT_EQ(s::edit_distance("stpes", "steps"), 2u);
  EXPECT_EQ(s::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(s::edit_distance("abc", ""), 3u);
}

TEST(Strings, ClosestMatchSuggestsOnlyPlausibleTypos) {
  std::vector<std::string> keys = {"steps", "seq_len", "local_batch_size"};
  EXPECT_EQ(s::closest_match("stpes", keys), "steps");
  EXPECT_EQ(s::closest_match("local_bach_size", keys), "local_batch_size");
  EXPECT_EQ(s::closest_match("completely_different", keys), std::nullopt);
  EXPECT_EQ(s::closest_match("x", {}), std::nullopt);
}

TEST(Strings, SplitListTrimsAndHandlesEmpty) {
  EXPECT_EQ(s::split_list("a, b ,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s::split_list(""), std::vector<std::string>{});
  EXPECT_EQ(s::split_list("  "), std::vector<std::string>{});
  EXPECT_EQ(s::split_list("one"), std::vector<std::string>{"one"});
  EXPECT_EQ(s::split_list("a;b", ';'), (std::vector<std::string>{"a", "b"}));
}

TEST(Strings, ParseNumbersWholeStringOnly) {
  EXPECT_EQ(s::parse_int("42"), 42);
  EXPECT_EQ(s::parse_int("-7"), -7);
  EXPECT_EQ(s::parse_int("+3"), 3);
  EXPECT_EQ(s::parse_int("4x"), std::nullopt);
  EXPECT_EQ(s::parse_int(""), std::nullopt);
  EXPECT_EQ(s::parse_int("1.5"), std::nullopt);
  EXPECT_EQ(s::parse_double("8e-4"), 8e-4);
  EXPECT_EQ(s::parse_double("3"), 3.0);
  EXPECT_EQ(s::parse_double("abc"), std::nullopt);
  EXPECT_EQ(s::parse_double("1.0x"), std::nullopt);
}

TEST(Strings, ParseBool) {
  EXPECT_EQ(s::parse_bool("true"), true);
  EXPECT_EQ(s::parse_bool("False"), false);
  EXPECT_EQ(s::parse_bool("1"), true);
  EXPECT_EQ(s::parse_bool("off"), false);
  EXPECT_EQ(s::parse_bool("maybe"), std::nullopt);
}

TEST(Strings, QuoteEscapes) {
  EXPECT_EQ(s::quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
  EXPECT_EQ(s::quote(std::string("\x01", 1)), "\"\\u0001\"");
}
