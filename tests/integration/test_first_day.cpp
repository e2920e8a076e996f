// What a new user coming from torchtitan meets on a first day (issue 19), end to end through the
// loom binary: whole-set validation equal on 1, 2 and 3 ranks; a config change on resume named
// instead of called corruption; a signal stop's exit status and last line; launch output.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/process.h"

namespace {

using loom::testing::fresh_temp_dir;
using loom::testing::read_text;
using loom::testing::run_loom;

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// Documents of varied sentences (data no other test reads), as a .jsonl file.
std::string write_corpus(const std::string& folder, int documents) {
  const std::string path = folder + "/corpus.jsonl";
  std::ofstream out(path);
  const char* words[] = {"river", "stone", "lamp",  "north", "quiet", "market",
                         "salt",  "wheel", "bright", "copper", "field", "winter"};
  for (int d = 0; d < documents; ++d) {
    std::string text;
    for (int w = 0; w < 40 + 7 * (d % 5); ++w) {
      text += std::string(w == 0 ? "" : " ") + words[(d * 5 + w * w) % 12];
      if (w % 9 == 8) text += ".";
    }
    out << nlohmann::json({{"text", text}}).dump() << "\n";
  }
  return path;
}

std::string base_args(const std::string& folder) {
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --job.dump_folder " +
         folder +
         " --training.seq_len 32 --training.local_batch_size 2 --metrics.log_freq 1"
         " --metrics.peak_tflops 1 --debug.seed 11 --comm.init_timeout_seconds 60"
         " --comm.train_timeout_seconds 60";
}

std::string launch(int ranks) {
  return "launch --nproc-per-node " + std::to_string(ranks) + " --master-port " +
         std::to_string(loom::testing::free_port()) + " -- ";
}

// validation.steps = -1 over a set of W windows, W divisible by none of the global batches
// (2, 4, 6 samples): the remainder is masked, not dropped, so every layout reports the same
// val_loss. With optimizer.lr = 0 the model never changes, so the two evaluations of a run must
// also agree: each starts from the beginning of the set.
std::vector<double> val_losses(const std::string& folder) {
  std::vector<double> losses;
  for (const auto& line : read_jsonl(folder + "/metrics.jsonl")) {
    if (line.contains("val_loss")) losses.push_back(line["val_loss"].get<double>());
  }
  return losses;
}

std::string validation_args(const std::string& folder, const std::string& corpus, int steps) {
  return base_args(folder) + " --training.steps 2 --optimizer.lr 0 --training.dataset_path " +
         corpus + " --validation.enable true --validation.dataset_path " + corpus +
         " --validation.steps " + std::to_string(steps) +
         " --validation.freq 1 --validation.seq_len 32 --validation.local_batch_size 2"
         " --training.global_batch_size 12";
}

TEST(FirstDay, WholeSetValidationIsLayoutIndependent) {
  const std::string data = fresh_temp_dir("firstday_val_data");
  const std::string corpus = write_corpus(data, 23);
  std::vector<std::vector<double>> by_layout;
  int64_t windows = 0;
  for (int ranks : {1, 2, 3}) {
    const std::string folder = fresh_temp_dir("firstday_val_" + std::to_string(ranks));
    const std::string layout =
        ranks == 2 ? " --parallelism.data_parallel_shard_degree 2"
                   : (ranks == 3 ? " --parallelism.data_parallel_replicate_degree 3" : "");
    auto result =
        run_loom((ranks > 1 ? launch(ranks) : "") + validation_args(folder, corpus, -1) + layout);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    std::smatch match;
    static const std::regex samples("([0-9]+) samples of 32 tokens");
    ASSERT_TRUE(std::regex_search(result.output, match, samples)) << result.output;
    windows = std::stoll(match[1].str());
    by_layout.push_back(val_losses(folder));
    ASSERT_EQ(by_layout.back().size(), 2u) << "ranks " << ranks;
    EXPECT_EQ(by_layout.back()[0], by_layout.back()[1]) << "ranks " << ranks;
  }
  // The premise: the set does not divide into global batches of 2, 4 or 6 windows.
  ASSERT_NE(windows % 2, 0) << windows;
  ASSERT_NE(windows % 3, 0) << windows;
  for (size_t layout = 1; layout < by_layout.size(); ++layout) {
    EXPECT_NEAR(by_layout[layout][0], by_layout[0][0], 1e-6 * by_layout[0][0])
        << (layout + 1) << " ranks vs 1";
  }
}

// A fixed number of validation batches reads the same first batches at every evaluation.
TEST(FirstDay, EveryValidationStartsAtTheBeginningOfTheSet) {
  const std::string data = fresh_temp_dir("firstday_rewind_data");
  const std::string corpus = write_corpus(data, 23);
  const std::string folder = fresh_temp_dir("firstday_rewind");
  auto result = run_loom(validation_args(folder, corpus, 2));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto losses = val_losses(folder);
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0], losses[1]);
}

// Resuming with another training.seq_len: the change is named once with exclude_from_loading
// as the way out, exit 2, no walk back through older checkpoints, and the dump folder keeps the
// config of the run it tried to resume; with the data loader excluded the resume works.
TEST(FirstDay, ConfigChangeOnResumeIsNamedNotCalledCorruption) {
  const std::string folder = fresh_temp_dir("firstday_resume_change");
  const std::string checkpoints =
      " --validation.enable false --checkpoint.enable true --checkpoint.interval 1";
  auto first = run_loom(base_args(folder) + " --training.steps 2" + checkpoints);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string saved_config = read_text(folder + "/config.toml");
  ASSERT_NE(saved_config.find("seq_len = 32"), std::string::npos) << saved_config;

  auto changed = run_loom(base_args(folder) + " --training.steps 4 --training.seq_len 16" +
                          checkpoints);
  EXPECT_EQ(changed.exit_code, 2) << changed.output;
  EXPECT_NE(changed.output.find("training.seq_len 32 -> 16"), std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("exclude_from_loading"), std::string::npos) << changed.output;
  EXPECT_EQ(changed.output.find("falling back"), std::string::npos) << changed.output;
  EXPECT_EQ(changed.output.find("unreadable"), std::string::npos) << changed.output;
  EXPECT_EQ(read_text(folder + "/config.toml"), saved_config);

  auto excluded = run_loom(base_args(folder) + " --training.steps 4 --training.seq_len 16" +
                           checkpoints + " --checkpoint.exclude_from_loading dataloader");
  ASSERT_EQ(excluded.exit_code, 0) << excluded.output;
  EXPECT_NE(excluded.output.find("resumed from"), std::string::npos) << excluded.output;
  EXPECT_NE(read_text(folder + "/config.toml").find("seq_len = 16"), std::string::npos);
}

// SIGTERM: the run saves, says where it stopped and where to resume, and exits 128 + 15 (not 0,
// which SLURM and scripts read as finished); the resumed run says which steps it ran.
TEST(FirstDay, SignalStopExitsWithTheSignalsCodeAndSaysWhereToResume) {
  const std::string folder = fresh_temp_dir("firstday_sigterm");
  const std::string job = base_args(folder) +
                          " --validation.enable false --checkpoint.enable true"
                          " --checkpoint.interval 1000 --training.steps 500";
  auto stopped = loom::testing::run_command(
      std::string("'") + LOOM_BINARY + "' " + job + " > " + folder +
      "/train.log 2>&1 & pid=$!; for i in $(seq 1 600); do grep -q 'step:     3' " + folder +
      "/train.log 2>/dev/null && break; sleep 0.1; done; kill -TERM $pid; wait $pid; rc=$?; cat " +
      folder + "/train.log; exit $rc");
  EXPECT_EQ(stopped.exit_code, 143) << stopped.output;
  std::smatch match;
  static const std::regex last(
      "stopped at step ([0-9]+) of 500 by SIGTERM; resumable from step-([0-9]+)");
  ASSERT_TRUE(std::regex_search(stopped.output, match, last)) << stopped.output;
  EXPECT_EQ(match[1].str(), match[2].str());
  const int64_t step = std::stoll(match[1].str());
  EXPECT_LT(step, 500);

  auto resumed = run_loom(base_args(folder) +
                          " --validation.enable false --checkpoint.enable true"
                          " --checkpoint.interval 1000 --training.steps " +
                          std::to_string(step + 2));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string ran = "finished: 2 steps (steps " + std::to_string(step + 1) + "-" +
                          std::to_string(step + 2) + ", resumed from step " +
                          std::to_string(step) + ") of " + std::to_string(step + 2);
  EXPECT_NE(resumed.output.find(ran), std::string::npos) << resumed.output;
}

}  // namespace
