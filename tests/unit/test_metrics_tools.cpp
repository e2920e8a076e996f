// The pieces of observability without LibTorch: CRC-32C and TFRecord framing of TensorBoard
// event files, reading runs, sparklines, the watch status line, summary and SVG plot.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "loom/core/check.h"
#include "loom/metrics/crc32c.h"
#include "loom/metrics/plot.h"
#include "loom/metrics/run_log.h"
#include "loom/metrics/summary.h"
#include "loom/metrics/tensorboard.h"
#include "loom/metrics/watch.h"
#include "support/process.h"

using namespace loom::metrics;

TEST(Crc32c, StandardVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the common check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const std::string ones(32, '\xff');
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoardWriter, RecordFramingAndFileName) {
  const std::string record = TensorBoardWriter::frame_record("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(static_cast<unsigned char>(record[0]), 3);  // little-endian length
  for (int i = 1; i < 8; ++i) EXPECT_EQ(record[i], 0);
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 15, 4);
  EXPECT_EQ(length_crc, masked_crc32c(record.data(), 8));
  EXPECT_EQ(data_crc, masked_crc32c("abc", 3));
  const std::string dir = loom::testing::fresh_temp_dir("tb_writer");
  std::string path;
  {
    TensorBoardWriter writer(dir + "/tb", 1);
    writer.add_scalars(1, 1.0, {{"loss", 2.5}});
    path = writer.path();
  }
  EXPECT_NE(path.find("/tb/events.out.tfevents."), std::string::npos);
  EXPECT_GT(loom::testing::read_text(path).size(), 3 * 16u);
  EXPECT_THROW(TensorBoardWriter("/proc/no_such_folder/tb", 1), loom::Error);
}

namespace {

// Every line ends with a newline, but the last when `last_unfinished` (a live run writing it).
std::string write_run(const std::string& name, const std::vector<std::string>& lines,
                      const std::string& status, bool last_unfinished = false) {
  const std::string dir = loom::testing::fresh_temp_dir(name);
  std::ofstream out(dir + "/metrics.jsonl");
  for (size_t i = 0; i < lines.size(); ++i) {
    out << lines[i] << (last_unfinished && i + 1 == lines.size() ? "" : "\n");
  }
  if (!status.empty()) std::ofstream(dir + "/run_status.json") << status;
  return dir;
}

std::string train_line(int step, double loss, double wall) {
  return "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
         ",\"lr\":0.001,\"tps\":100,\"mem_peak_gib\":1.5,\"tokens_seen\":" +
         std::to_string(step * 64) + ",\"step_time_s\":1.0,\"wall_time\":" + std::to_string(wall) +
         "}";
}

}  // namespace

TEST(RunLog, ResumedStepsCountOnceAndPartialLinesAreSkipped) {
  const auto dir = write_run("runlog",
                             {train_line(1, 5, 100), train_line(2, 4, 101), train_line(2, 3.5, 105),
                              "{\"step\":2,\"val_loss\":4.2}", "{\"step\":3,\"lo"},
                             "", true);
  const auto run = read_run(dir);
  ASSERT_EQ(run.train.size(), 2u);
  EXPECT_DOUBLE_EQ(run.train[1]["loss"].get<double>(), 3.5);  // the resumed run's value
  ASSERT_EQ(run.validation.size(), 1u);
  EXPECT_EQ(series(run.train, "loss", true).back().first, 128);
  EXPECT_THROW(read_run(dir + "/nothing"), loom::InputError);
  const auto s = summarize(run);
  EXPECT_DOUBLE_EQ(s["metrics"]["loss"]["best"].get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(s["metrics"]["loss"]["mean"].get<double>(), 4.25);
  EXPECT_DOUBLE_EQ(s["metrics"]["tps"]["best"].get<double>(), 100);
  EXPECT_FALSE(s["metrics"]["lr"].contains("best"));
  EXPECT_NE(format_summary(s).find("val_loss"), std::string::npos);
}

// Hostile rows: only the last line may be unfinished; a damaged row elsewhere, a row nested a
// million deep (it overflowed the stack of the tools that copy it), and steps that are not
// integers (3.5 and 1e300 landed on other steps' rows) are errors naming file:line.
TEST(RunLog, DamagedRowsAreErrorsNamingTheLine) {
  auto error_of = [](const std::vector<std::string>& lines) {
    try {
      read_run(write_run("runlog_bad", lines, ""));
    } catch (const loom::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_NE(
      error_of({train_line(1, 5, 1), "{\"step\": 2, \"loss\": " + deep + "}", train_line(3, 4, 3)})
          .find("metrics.jsonl:2: not a metrics row"),
      std::string::npos);
  EXPECT_NE(error_of({"{\"step\":2,\"lo", train_line(3, 4, 3)}).find("metrics.jsonl:1:"),
            std::string::npos);
  EXPECT_NE(error_of({train_line(1, 5, 1), "{\"step\": 3.5, \"loss\": 1}"})
                .find("metrics.jsonl:2: step must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of({"{\"step\": 1e300, \"loss\": 1}"}).find("metrics.jsonl:1: step"),
            std::string::npos);
  EXPECT_NE(error_of({"{\"step\": \"two\", \"loss\": 1}"}).find("metrics.jsonl:1: step"),
            std::string::npos);
  EXPECT_NE(error_of({"[1, 2]", train_line(1, 5, 1)}).find("metrics.jsonl:1: a metrics row"),
            std::string::npos);
  // A last line without its newline is a row being written: skipped. With its newline it is
  // finished, and damaged.
  EXPECT_EQ(read_run(write_run("runlog_tail", {train_line(1, 5, 1), deep}, "", true)).train.size(),
            1u);
  EXPECT_NE(error_of({train_line(1, 5, 1), deep}).find("metrics.jsonl:2: not a metrics row"),
            std::string::npos);
}

// A metric name with an escape sequence is shown, not obeyed by the terminal.
TEST(RunLog, ControlCharactersInNamesArePrintedEscaped) {
  const auto run =
      read_run(write_run("runlog_escape", {"{\"step\":1,\"loss\":2,\"\\u001b[2Jx\":1}"}, ""));
  const std::string text = format_summary(summarize(run));
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("\\x1b[2Jx"), std::string::npos) << text;
}

TEST(Watch, StatusLineSaysRunningStalledFinishedOrGone) {
  std::vector<std::string> lines;
  for (int i = 1; i <= 10; ++i) lines.push_back(train_line(i, 10.0 - i * 0.5, 1000 + 2 * i));
  // Another host: whether its process lives cannot be checked from here.
  const std::string running =
      "{\"state\":\"running\",\"total_steps\":20,\"pid\":1,\"host\":\"elsewhere\"}";
  const auto dir = write_run("watch_state", lines, running);
  const auto run = read_run(dir);
  WatchOptions options;
  EXPECT_EQ(run_state(run, 1021, options).word, "RUNNING");
  // The median is 2 s between steps: 5 x 2 s without a step is a stall.
  const auto stalled = run_state(run, 1020 + 11, options);
  EXPECT_EQ(stalled.word, "STALLED") << stalled.line;
  EXPECT_NE(stalled.line.find("no new step for 11s"), std::string::npos) << stalled.line;
  const std::string screen = render_watch({run}, 1021, options);
  EXPECT_NE(screen.find("step 10/20"), std::string::npos) << screen;
  EXPECT_NE(screen.find("ETA 20s"), std::string::npos) << screen;
  const auto finished = read_run(write_run("watch_done", lines, "{\"state\":\"finished\"}"));
  EXPECT_EQ(run_state(finished, 5000, options).word, "FINISHED");
  EXPECT_EQ(sparkline({1, 2, 3, 4, 5, 6, 7, 8}, 8), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(sparkline({1, 2, 3}, 2), "▁█");
}

// Steps of a fraction of a second keep their digits ("median 0.20s", not "0s"), and an
// 80-column screen wraps between fields or words: the same words, none cut, no line too long.
TEST(Watch, SubSecondStepsAndNarrowTerminals) {
  std::vector<std::string> lines;
  for (int i = 1; i <= 10; ++i) lines.push_back(train_line(i, 10.0 - i * 0.5, 1000 + 0.2 * i));
  const std::string status =
      "{\"state\":\"running\",\"total_steps\":20000,\"pid\":1,"
      "\"host\":\"elsewhere\"}";
  const auto run = read_run(write_run("watch_fast", lines, status));
  WatchOptions options;
  const auto stalled = run_state(run, 1005, options);
  EXPECT_EQ(stalled.word, "STALLED") << stalled.line;
  EXPECT_NE(stalled.line.find("the median 0.20s between logged steps"), std::string::npos)
      << stalled.line;
  auto words = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
  };
  options.width = 0;
  const std::string wide = render_watch({run}, 1005, options);
  options.width = 80;
  const std::string narrow = render_watch({run}, 1005, options);
  EXPECT_EQ(words(narrow), words(wide));
  std::istringstream rows(narrow);
  bool wrapped = false;
  for (std::string row; std::getline(rows, row);) {
    size_t columns = 0;
    for (unsigned char c : row) columns += (c & 0xC0) != 0x80;
    // Only a single word longer than the line (a long path) may stay longer.
    const size_t text = row.find_first_not_of(' ');
    EXPECT_TRUE(columns <= 80 || row.find(' ', text) == std::string::npos) << row;
    wrapped = wrapped || row.rfind("    ", 0) == 0;  // a continuation line
  }
  EXPECT_TRUE(wrapped) << narrow;
  // Fields stay whole: a label keeps its value.
  EXPECT_EQ(wrap_lines("  alpha 1  beta 2  gamma 3", 18), "  alpha 1  beta 2\n    gamma 3\n");
  EXPECT_EQ(wrap_lines("  one two three four", 12), "  one two\n    three\n    four\n");
}

TEST(Plot, SvgHasAPanelPerMetricAndALegendEntryPerRun) {
  const auto a = read_run(write_run("plot_a", {train_line(1, 5, 1), train_line(2, 4, 2)}, ""));
  auto b = a;
  b.name = "second <run>";
  const std::string svg = plot_svg({a, b}, {});
  for (const char* title : {"loss (dashed: val_loss)", "learning rate", "throughput", "memory"}) {
    EXPECT_NE(svg.find(title), std::string::npos) << title;
  }
  EXPECT_NE(svg.find("second &lt;run&gt;"), std::string::npos);  // escaped
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.rfind("</svg>\n"), svg.size() - 7);
}
