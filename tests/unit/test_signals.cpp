#include <gtest/gtest.h>

#include <csignal>

#include "loom/core/signals.h"

TEST(Signals, SigtermSetsTheShutdownFlagInsteadOfKilling) {
  loom::signals::install_shutdown_handlers();
  loom::signals::clear_shutdown_request();
  EXPECT_FALSE(loom::signals::shutdown_requested());
  std::raise(SIGTERM);
  EXPECT_TRUE(loom::signals::shutdown_requested());
  EXPECT_EQ(loom::signals::shutdown_signal(), SIGTERM);
  loom::signals::clear_shutdown_request();
  EXPECT_FALSE(loom::signals::shutdown_requested());
}

TEST(Signals, SigintIsHandledTheSameWay) {
  loom::signals::install_shutdown_handlers();
  loom::signals::clear_shutdown_request();
  std::raise(SIGINT);
  EXPECT_EQ(loom::signals::shutdown_signal(), SIGINT);
  loom::signals::clear_shutdown_request();
}

// Ctrl-C twice kills a stuck job; a repeated SIGTERM (the scheduler's and the launcher's
// forwarded one arrive together) leaves the stop and its checkpoint running.
TEST(Signals, SecondSigintKillsARepeatedSigtermDoesNot) {
  EXPECT_EXIT(
      {
        loom::signals::install_shutdown_handlers();
        std::raise(SIGINT);
        std::raise(SIGINT);
        std::exit(0);  // not reached: the second SIGINT terminates
      },
      ::testing::KilledBySignal(SIGINT), "");
  EXPECT_EXIT(
      {
        loom::signals::install_shutdown_handlers();
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        std::exit(loom::signals::shutdown_signal() == SIGTERM ? 7 : 1);
      },
      ::testing::ExitedWithCode(7), "");
}
