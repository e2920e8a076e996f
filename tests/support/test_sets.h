// The "slow" label's tests (ctest -L slow, excluded by scripts/test.sh) live next to the default
// suite's in the same files; the slow binary compiles those files with LOOM_SLOW_TESTS=1.
// LOOM_TEST(suite, name) is a test of the default suite, LOOM_SLOW_TEST(suite, name) one of the
// slow label. A test of the other set still compiles (its helpers stay used) but is never
// registered.
#pragma once

#include <gtest/gtest.h>

#ifndef LOOM_SLOW_TESTS
#define LOOM_SLOW_TESTS 0
#endif

#define LOOM_TEST_NOT_IN_THIS_SET(suite, name) \
  [[maybe_unused]] static void suite##_##name##_NotInThisSet()

#if LOOM_SLOW_TESTS
#define LOOM_TEST(suite, name) LOOM_TEST_NOT_IN_THIS_SET(suite, name)
#define LOOM_SLOW_TEST(suite, name) TEST(suite, name)
#else
#define LOOM_TEST(suite, name) TEST(suite, name)
#define LOOM_SLOW_TEST(suite, name) LOOM_TEST_NOT_IN_THIS_SET(suite, name)
#endif
