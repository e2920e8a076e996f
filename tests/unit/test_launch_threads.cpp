// The per-worker thread count `loom launch` sets when OMP_NUM_THREADS is unset.
#include <gtest/gtest.h>

#include "loom/launch/launcher.h"

using loom::distributed::available_cpus;
using loom::distributed::threads_per_rank;

TEST(LaunchThreads, EachWorkerGetsAnEqualShareOfTheCpus) {
  EXPECT_EQ(threads_per_rank(16, 1), 16);
  EXPECT_EQ(threads_per_rank(16, 4), 4);
  EXPECT_EQ(threads_per_rank(16, 3), 5);  // rounded down: 15 of 16 CPUs busy, none shared
  EXPECT_EQ(threads_per_rank(96, 8), 12);
}

TEST(LaunchThreads, NeverZeroThreads) {
  EXPECT_EQ(threads_per_rank(2, 4), 1);  // more workers than CPUs: one thread each
  EXPECT_EQ(threads_per_rank(1, 1), 1);
  EXPECT_EQ(threads_per_rank(8, 0), 8);  // a degenerate count is treated as one worker
}

TEST(LaunchThreads, AvailableCpusIsPositive) { EXPECT_GE(available_cpus(), 1); }
