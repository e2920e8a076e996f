#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>

#include "loom/core/check.h"
#include "loom/core/logging.h"

TEST(Logging, ParseLevelAcceptsSpdlogNames) {
  EXPECT_EQ(loom::log::parse_level("debug"), spdlog::level::debug);
  EXPECT_EQ(loom::log::parse_level("warn"), spdlog::level::warn);
  EXPECT_EQ(loom::log::parse_level("warning"), spdlog::level::warn);
  EXPECT_EQ(loom::log::parse_level("off"), spdlog::level::off);
  EXPECT_THROW(loom::log::parse_level("loud"), loom::InputError);
}

TEST(Logging, ComponentLoggersAreSharedAndNamed) {
  auto a = loom::log::get("config");
  auto b = loom::log::get("config");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->name(), "config");
  EXPECT_NE(loom::log::get("trainer").get(), a.get());
}

TEST(Logging, LinesCarryRankAndComponent) {
  ::testing::internal::CaptureStderr();
  loom::log::init(3);
  loom::log::get("checkpoint")->info("saved step {}", 10);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[rank3] [checkpoint]"), std::string::npos) << err;
  EXPECT_NE(err.find("saved step 10"), std::string::npos) << err;
  loom::log::init(0);
}

TEST(Logging, LevelComesFromTheEnvironmentAndBadValuesWarn) {
  ::setenv("LOOM_LOG_LEVEL", "error", 1);
  loom::log::init(0);
  ::testing::internal::CaptureStderr();
  loom::log::get("quiet")->info("hidden");
  loom::log::get("quiet")->error("shown");
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("hidden"), std::string::npos);
  EXPECT_NE(err.find("shown"), std::string::npos);

  ::setenv("LOOM_LOG_LEVEL", "chatty", 1);
  ::testing::internal::CaptureStderr();
  loom::log::init(0);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("LOOM_LOG_LEVEL='chatty'"), std::string::npos) << err;
  ::unsetenv("LOOM_LOG_LEVEL");
  loom::log::init(0);
}
