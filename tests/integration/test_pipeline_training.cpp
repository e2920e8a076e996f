// Pipeline parallelism end to end through `loom launch` (real processes over Gloo): every
// schedule on pp 2 and pp 4, and pp 2 x dp_shard 2 x tp 2 on 8 ranks, train like one rank with
// the same global batch for 20 steps (validation through the forward-only pipeline included);
// checkpoints reshard between a pipeline and one rank both ways; a bad microbatch count fails
// on every rank with the key named. The one-rank reference runs once for all tests.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "support/metrics_log.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {
namespace test_pipeline_training {  // its own names in a unity batch

namespace fs = std::filesystem;
using loom::testing::copy_of_checkpoint;
using loom::testing::expect_losses_close;
using loom::testing::fresh_temp_dir;
using loom::testing::launch_args;
using loom::testing::logged_losses;
using loom::testing::run_loom;
using loom::testing::shared_run;

// Global batch 4 of 32 tokens; a pipeline splits its local batch into microbatches of 1 row.
// Validation at steps 10 and 20; checkpoints at 10 and 20 where enabled.
std::string job(const std::string& extra = "") {
  return "train --config " LOOM_SOURCE_DIR
         "/configs/llama3_debug.toml --training.steps 20"
         " --training.seq_len 32 --training.local_batch_size 4 --training.global_batch_size 4"
         " --parallelism.pipeline_parallel_microbatch_size 1"
         " --validation.enable true --validation.freq 10 --validation.steps 2"
         " --validation.seq_len 32 --validation.local_batch_size 4"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 11"
         " --lr_scheduler.warmup_steps 2 --lr_scheduler.total_steps 20"
         " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60"
         " --checkpoint.interval 10 --checkpoint.keep_latest_k 0"
         " --checkpoint.last_save_model_only false " +
         extra;
}

std::string pipeline(int pp, const std::string& schedule) {
  return " --parallelism.pipeline_parallel_degree " + std::to_string(pp) +
         " --parallelism.pipeline_parallel_schedule " + schedule;
}

std::vector<nlohmann::json> rows(const std::string& folder, const char* key) {
  std::vector<nlohmann::json> out;
  std::ifstream in(folder + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains(key)) out.push_back(j);
  }
  return out;
}

std::vector<double> val_losses(const std::string& folder) {
  std::vector<double> out;
  for (const auto& j : rows(folder, "val_loss")) out.push_back(j["val_loss"].get<double>());
  return out;
}

const std::string& one_rank() {
  static const std::string folder = shared_run("pp_one_rank", job("--checkpoint.enable true"));
  return folder;
}

// Every step row has the measured bubble: idle over busy time in percent, never 0 (a pipeline at
// least fills and drains). No upper bound: with tiny stages and more ranks than cores the ranks
// may wait several times longer than they compute (1196% seen for pp 4 on 2 cores).
void expect_bubble_logged(const std::string& folder) {
  const auto steps = rows(folder, "loss");
  ASSERT_EQ(steps.size(), 20u);
  for (const auto& j : steps) {
    ASSERT_TRUE(j.contains("pp_bubble_pct")) << j.dump();
    const double bubble = j["pp_bubble_pct"].get<double>();
    EXPECT_GT(bubble, 0.0);
    EXPECT_TRUE(std::isfinite(bubble)) << j.dump();
  }
}

// Validation is compared where the data-parallel degree is 1 (with validation.steps N each
// data-parallel rank scores N batches of its own slice).
void expect_matches_one_rank(const std::string& folder, const std::string& what,
                             bool same_validation = true) {
  const auto want = logged_losses(one_rank());
  ASSERT_EQ(want.size(), 20u);
  expect_losses_close(want, logged_losses(folder), 1e-5, what);
  ASSERT_EQ(val_losses(folder).size(), 2u) << what;
  if (same_validation) expect_losses_close(val_losses(one_rank()), val_losses(folder), 1e-5, what);
}

std::string run_ok(const std::string& args, const std::string& expect_in_log) {
  auto result = run_loom(args);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(expect_in_log), std::string::npos) << result.output;
  return result.output;
}

// pp 2 over Interleaved1F1B (2 virtual stages per rank) with checkpoints at 10 and 20: one of
// the schedule runs, and the run the resharding test resumes from.
const std::string& interleaved_pp2() {
  static const std::string folder = shared_run(
      "pp2_interleaved",
      launch_args(2, job("--checkpoint.enable true" + pipeline(2, "Interleaved1F1B")), "{port}"));
  return folder;
}

// (pp, schedule); strings, not pointers, so that the ctest names (which show the parameter) stay
// the same from build to build.
using ScheduleCase = std::tuple<int, std::string>;
class PipelineSchedules : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(PipelineSchedules, TrainLikeOneRank) {
  const auto [pp, schedule] = GetParam();
  const std::string what = "pp " + std::to_string(pp) + " " + schedule;
  std::string folder;
  if (pp == 2 && schedule == "Interleaved1F1B") {
    folder = interleaved_pp2();
  } else {
    folder = fresh_temp_dir("pp" + std::to_string(pp) + "_" + schedule);
    const int stages = pp * (schedule.rfind("Interleaved", 0) == 0 ? 2 : 1);
    const std::string output =
        run_ok(launch_args(pp, job("--job.dump_folder " + folder + pipeline(pp, schedule))),
               "pipeline: " + schedule + " over " + std::to_string(pp) + " ranks, " +
                   std::to_string(stages) + " stages");
    // The console line carries the bubble too; the start-up names the layout, not "none".
    EXPECT_NE(output.find("%  bubble: "), std::string::npos) << output;
    EXPECT_NE(output.find("parallelism: pp " + std::to_string(pp) +
                          ", dp_replicate 1, dp_shard 1, cp 1, tp 1; gradient sync: none"),
              std::string::npos)
        << output;
  }
  expect_matches_one_rank(folder, what);
  expect_bubble_logged(folder);
}

// The default suite runs one pp 2 job per executor path with more than one stage per rank:
// Interleaved1F1B (two) and InterleavedZeroBubble (split backward); 1F1B (one stage per rank)
// runs there as Qwen3Training.PipelineWithTiedEmbeddingsTrainsLikeOneRank. GPipe, llama's pp 2
// 1F1B and the pp 4 runs (Interleaved1F1B with 8 stages) are in the "slow" label.
std::string schedule_case_name(const ::testing::TestParamInfo<ScheduleCase>& test) {
  return "pp" + std::to_string(std::get<0>(test.param)) + "_" + std::get<1>(test.param);
}

INSTANTIATE_TEST_SUITE_P(EverySchedule, PipelineSchedules,
                         ::testing::Values(ScheduleCase{2, "Interleaved1F1B"},
                                           ScheduleCase{2, "InterleavedZeroBubble"}),
                         schedule_case_name);
// The slow label (support/test_sets.h: instantiations whose name ends in "Slow").
INSTANTIATE_TEST_SUITE_P(EveryScheduleSlow, PipelineSchedules,
                         ::testing::Values(ScheduleCase{2, "GPipe"}, ScheduleCase{2, "1F1B"},
                                           ScheduleCase{4, "GPipe"}, ScheduleCase{4, "1F1B"},
                                           ScheduleCase{4, "Interleaved1F1B"},
                                           ScheduleCase{4, "InterleavedZeroBubble"}),
                         schedule_case_name);

// 3-D, with the same global batch (2 rows per data-parallel rank, so 2 microbatches): each pp
// rank's two stages are FSDP-wrapped (units kept gathered across microbatches,
// gradients reduced on each stage's last backward) around tensor-parallel blocks.
LOOM_SLOW_TEST(PipelineTraining, ThreeDimensionsOnEightRanksTrainLikeOneRank) {
  const std::string folder = fresh_temp_dir("pp2_fsdp2_tp2");
  run_ok(
      launch_args(8, job("--job.dump_folder " + folder + pipeline(2, "Interleaved1F1B") +
                         " --parallelism.data_parallel_shard_degree 2"
                         " --parallelism.tensor_parallel_degree 2 --training.local_batch_size 2")),
      "reduce-scatter in Float, gradient sync deferred to the last microbatch + FSDP");
  expect_matches_one_rank(folder, "pp 2 x dp_shard 2 x tp 2", false);
  expect_bubble_logged(folder);
}

// Parameter names are global: a pipeline checkpoint loads on one rank, a one-rank checkpoint
// on another pipeline split (pp 2 with one stage per rank), and resumes on its own layout
// bitwise.
LOOM_SLOW_TEST(PipelineTraining, CheckpointsReshardBetweenPipelineAndOneRank) {
  const auto want = logged_losses(one_rank());
  ASSERT_EQ(want.size(), 20u);
  const std::vector<double> tail(want.begin() + 10, want.end());
  const std::string to_one = copy_of_checkpoint(interleaved_pp2(), 10, "pp2_to_one");
  run_ok(job("--checkpoint.enable true --job.dump_folder " + to_one), "resumed from");
  expect_losses_close(tail, logged_losses(to_one), 1e-5, "pp 2 -> 1 rank");

  const std::string to_pp = copy_of_checkpoint(one_rank(), 10, "one_to_pp2");
  run_ok(launch_args(
             2, job("--checkpoint.enable true --job.dump_folder " + to_pp + pipeline(2, "1F1B"))),
         "resumed from");
  expect_losses_close(tail, logged_losses(to_pp), 1e-5, "1 rank -> pp 2");

  const auto straight = logged_losses(interleaved_pp2());
  const std::string same = copy_of_checkpoint(interleaved_pp2(), 10, "pp2_to_pp2");
  run_ok(launch_args(2, job("--checkpoint.enable true --job.dump_folder " + same +
                            pipeline(2, "Interleaved1F1B"))),
         "resumed from");
  expect_losses_close(std::vector<double>(straight.begin() + 10, straight.end()),
                      logged_losses(same), 0.0, "pp 2 -> pp 2");
}

// Too few microbatches for the schedule: the ranks refuse before the rendezvous, naming the
// key, instead of waiting in a receive.
LOOM_TEST(PipelineTraining, TooFewMicrobatchesAreRefusedBeforeTheRendezvousNamingTheKey) {
  const std::string folder = fresh_temp_dir("pp4_too_few");
  auto result = run_loom(launch_args(4, job("--job.dump_folder " + folder + pipeline(4, "1F1B") +
                                            " --training.local_batch_size 2"
                                            " --training.global_batch_size 2")));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  // The first rank to refuse ends the job (the launcher stops the others, which may not have
  // printed yet): a refusal with exit code 2, never a rank left waiting for its peers.
  EXPECT_NE(result.output.find("exited with code 2"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("timed out"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("parallelism.pipeline_parallel_microbatch_size"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("1F1B with 4 pipeline ranks needs at least 4 microbatches, got 2"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(folder + "/metrics.jsonl"));
}

// A stage that holds neither an attention nor a mixture layer (the embedding alone) of a
// DeepSeek-V3 with QK-clip: it has nothing to clip and no expert load, but still joins the
// world's max of the step's largest logit and the pp group's max of the load metrics on each log
// step, so the ranks' collectives stay matched (skipping either, the job died in a collective
// mismatch at step 1), and the logged values are the other stage's.
LOOM_TEST(PipelineTraining, QkClipAndMoeMetricsWithAStageWithoutThoseLayers) {
  const std::string folder = fresh_temp_dir("pp2_qk_clip_embedding_stage");
  run_ok(launch_args(2, job("--job.dump_folder " + folder + pipeline(2, "1F1B") +
                            " --model.name deepseek_v3 --model.flavor debugmodel"
                            " --training.steps 3 --validation.enable false"
                            " --optimizer.qk_clip_threshold 0.5"
                            " --parallelism.module_fqns_per_model_part "
                            "'tok_embeddings;layers.0,layers.1,layers.2,layers.3,norm,output'")),
         "");
  const auto steps = rows(folder, "loss");
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& j : steps) {
    ASSERT_TRUE(j.contains("max_attention_logit")) << j.dump();
    const double logit = j["max_attention_logit"].get<double>();
    EXPECT_TRUE(std::isfinite(logit) && logit > 0) << j.dump();
    ASSERT_TRUE(j.contains("moe/load_max_mean")) << j.dump();
    EXPECT_GE(j["moe/load_max_mean"].get<double>(), 1.0) << j.dump();
  }
}

}  // namespace test_pipeline_training
}  // namespace
