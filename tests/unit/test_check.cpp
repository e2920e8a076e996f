#include <gtest/gtest.h>

#include "loom/core/check.h"

namespace {

int checked_half(int value) {
  LOOM_CHECK(value % 2 == 0, "value ", value, " is odd");
  return value / 2;
}

TEST(Check, PassingCheckReturnsNormally) {
  EXPECT_EQ(checked_half(4), 2);
}

TEST(Check, FailingCheckThrowsInternalErrorWithLocationAndCondition) {
  try {
    checked_half(3);
    FAIL() << "expected a throw";
  } catch (const loom::InternalError& error) {
    EXPECT_EQ(error.message(), "check failed: value % 2 == 0: value 3 is odd");
    EXPECT_STREQ(error.file(), "tests/unit/test_check.cpp");
    EXPECT_GT(error.line(), 0);
    EXPECT_NE(std::string(error.what()).find("tests/unit/test_check.cpp:"), std::string::npos);
  }
}

TEST(Check, TypedCheckThrowsTheGivenType) {
  auto bad_input = [] { LOOM_CHECK_AS(loom::InputError, 1 > 2, "seq_len must be positive"); };
  EXPECT_THROW(bad_input(), loom::InputError);
  try {
    bad_input();
  } catch (const loom::InputError& error) {
    // User-facing messages do not repeat the C++ condition.
    EXPECT_EQ(error.message(), "seq_len must be positive");
  }
}

TEST(Check, ThrowIsAlwaysAnError) {
  EXPECT_THROW(LOOM_THROW(loom::IoError, "disk full at ", 42), loom::IoError);
  EXPECT_THROW(LOOM_THROW(loom::IoError, "x"), loom::Error);
}

}  // namespace
