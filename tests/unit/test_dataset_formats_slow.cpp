// The slow label's data test: a 1 GB Parquet file (made by pyarrow inside the test) streams
// through the training loader with bounded memory: one row group at a time, never the file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loom/data/streaming_loader.h"
#include "loom/data/tokenizer.h"
#include "support/process.h"

namespace {

// A line of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t status_bytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}

TEST(DatasetFormatsSlow, OneGigabyteParquetStreamsInBoundedMemory) {
  const std::string dir = loom::testing::fresh_temp_dir("dataset_formats_big");
  const auto made = loom::testing::run_command(
      std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
      "/tools/make_dataset_fixtures.py' '" + dir + "' --big-bytes 1073741824 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto facts = nlohmann::json::parse(made.output.substr(made.output.find('{')));
  ASSERT_GE(facts.at("file_bytes").get<int64_t>(), int64_t{1} << 30) << facts;

  loom::data::ByteTokenizer tokenizer;
  // The peak from here on: the kernel's high-water mark starts again at the current RSS.
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before = status_bytes("VmRSS");
  const int64_t rows = facts.at("rows").get<int64_t>();
  const int64_t tokens = facts.at("text_bytes").get<int64_t>() + 2 * rows;  // BOS text EOS
  const int64_t seq_len = 4095, batch = 64, window = batch * (seq_len + 1);
  {
    loom::data::StreamingLoader loader({dir + "/big.parquet"}, tokenizer, {seq_len, 0, false});
    EXPECT_EQ(loader.total_rows(), rows);
    for (int64_t read = 0; read + window <= tokens; read += window) loader.next(batch, seq_len);
    const auto state = loader.state();
    // The last whole batch ends in the last row group, with the whole file read once.
    EXPECT_EQ(state.at("epoch"), 0) << state;
    EXPECT_EQ(state.at("unit").get<int64_t>(), loader.rank_units() - 1) << state;
  }
  const int64_t peak = status_bytes("VmHWM");
  const double above_mb = static_cast<double>(peak - before) / 1e6;
  std::printf("1 GB Parquet (%lld bytes, %lld rows): peak RSS %.1f MB above the %.1f MB before\n",
              static_cast<long long>(facts.at("file_bytes").get<int64_t>()),
              static_cast<long long>(rows), above_mb, static_cast<double>(before) / 1e6);
  EXPECT_LT(above_mb, 300.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
