// The "slow" label's tests (ctest -L slow, excluded by scripts/test.sh) live next to the default
// suite's in the same files and the same binary. LOOM_TEST(suite, name) is a test of the default
// suite; LOOM_SLOW_TEST(suite, name) registers as suite + "Slow", and ctest discovers the binary
// twice (loom_add_test_binary ... WITH_SLOW in tests/CMakeLists.txt): the default suite filters
// the "*Slow" suites and instantiations out, the slow label keeps only them.
#pragma once

#include <gtest/gtest.h>

#define LOOM_TEST(suite, name) TEST(suite, name)
#define LOOM_SLOW_TEST(suite, name) TEST(suite##Slow, name)
