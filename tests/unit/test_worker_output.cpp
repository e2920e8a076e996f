// Worker output: chunks cut into whole lines, partial last lines kept, log files written as is.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/core/check.h"
#include "loom/launch/worker_group.h"
#include "loom/launch/worker_output.h"
#include "support/process.h"

using loom::distributed::LineSplitter;
using loom::distributed::WorkerOutput;

namespace {

std::vector<std::string> split(const std::vector<std::string>& chunks, bool finish) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto collect = [&](std::string_view line) { lines.emplace_back(line); };
  for (const auto& chunk : chunks) splitter.feed(chunk, collect);
  if (finish) splitter.finish(collect);
  return lines;
}

}  // namespace

TEST(LineSplitter, JoinsChunksIntoLines) {
  EXPECT_EQ(split({"a\nb", "c\n", "\nd"}, false), (std::vector<std::string>{"a\n", "bc\n", "\n"}));
  EXPECT_EQ(split({"a\nb", "c\n", "\nd"}, true),
            (std::vector<std::string>{"a\n", "bc\n", "\n", "d\n"}));
  EXPECT_EQ(split({"x", "y", "z"}, true), (std::vector<std::string>{"xyz\n"}));
  EXPECT_EQ(split({"", "\n\n"}, true), (std::vector<std::string>{"\n", "\n"}));
  EXPECT_TRUE(split({}, true).empty());
}

TEST(LineSplitter, CutsOverlongLines) {
  const std::string big(LineSplitter::kMaxLine + 10, 'q');
  auto lines = split({big}, true);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].size(), LineSplitter::kMaxLine + 1);
  EXPECT_EQ(lines[1], std::string(10, 'q') + "\n");
}

TEST(WorkerOutput, LogFileGetsBothStreamsUnprefixed) {
  const std::string dir = loom::testing::fresh_temp_dir("worker_output");
  const std::string path = dir + "/rank_3.log";
  {
    WorkerOutput output("[rank3]: ", false, path);
    output.on_bytes(1, "out one\nout ");
    output.on_bytes(2, "err\n");
    output.on_bytes(1, "two");
    output.on_end(1);
    output.on_end(2);
  }
  EXPECT_EQ(loom::testing::read_text(path), "out one\nerr\nout two\n");
}

TEST(WorkerOutput, UnwritableLogIsAnIoError) {
  EXPECT_THROW(WorkerOutput("", false, std::string("/nonexistent-dir/x/rank_0.log")),
               loom::IoError);
}

TEST(WorkerOutput, SignalNames) {
  EXPECT_EQ(loom::distributed::signal_name(9), "SIGKILL");
  EXPECT_EQ(loom::distributed::signal_name(15), "SIGTERM");
  EXPECT_EQ(loom::distributed::signal_name(77), "signal 77");
}

// The default console filter of `loom launch` hides other ranks' routine log lines only.
TEST(WorkerOutput, RoutineLogLinesAreInfoDebugAndTraceOnly) {
  using loom::distributed::is_routine_log_line;
  EXPECT_TRUE(is_routine_log_line("[2026-12-01 10:00:00.000] [rank1] [metrics] info: step: 1\n"));
  EXPECT_TRUE(is_routine_log_line("[2026-12-01 10:00:00.000] [rank1] [data] debug: x\n"));
  EXPECT_FALSE(is_routine_log_line("[2026-12-01 10:00:00.000] [rank1] [lr] warning: a: b\n"));
  EXPECT_FALSE(is_routine_log_line("[2026-12-01 10:00:00.000] [rank1] [trainer] error: x\n"));
  EXPECT_FALSE(is_routine_log_line("error: invalid job config: 1 problem\n"));
  EXPECT_FALSE(is_routine_log_line("terminate called after throwing an instance of 'x'\n"));
  EXPECT_FALSE(is_routine_log_line("\n"));
}
