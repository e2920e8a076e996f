// The second family end to end: qwen3 debugmodel (q/k norms, head_dim 128 over a 256-wide model,
// rotate-half RoPE, the head tied to the token table) trains like one rank with the same global
// batch for 20 steps under every parallel layout, through `loom launch` (real processes over
// Gloo), and its checkpoints reshard between those layouts and one rank. The tied table is the
// hard part: one FSDP unit spanning the model, the vocabulary rows under TP, and under PP a copy
// on the last stage whose gradient is summed with the first stage's (docs/parallelism.md).
// The default suite runs pp 2 (the tied copies) with a reshard into one rank; every other
// layout is in the slow label.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/metrics_log.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

using loom::testing::copy_of_checkpoint;
using loom::testing::expect_losses_close;
using loom::testing::fresh_temp_dir;
using loom::testing::launch_args;
using loom::testing::logged_losses;
using loom::testing::run_loom;
using loom::testing::shared_run;

// Global batch 4 of 16 tokens in 1-row pipeline microbatches (the debug model is 5x llama3's: a
// short sequence keeps the default suite's run short); checkpoints at 10 and 20.
std::string job(const std::string& extra = "") {
  return "train --config " LOOM_SOURCE_DIR
         "/configs/qwen3_debug.toml --training.steps 20"
         " --training.seq_len 16 --training.local_batch_size 4 --training.global_batch_size 4"
         " --parallelism.pipeline_parallel_microbatch_size 1 --validation.enable false"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 13"
         " --lr_scheduler.warmup_steps 2 --lr_scheduler.total_steps 20"
         " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60"
         " --checkpoint.enable true --checkpoint.interval 10 --checkpoint.keep_latest_k 0"
         " --checkpoint.last_save_model_only true " +
         extra;
}

// Two data-parallel ranks of 2 rows each keep the global batch of 4.
const std::string kFsdp2 =
    " --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2";
const std::string kTp2 = " --parallelism.tensor_parallel_degree 2";
std::string pipeline(const std::string& schedule) {
  return " --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule " +
         schedule;
}

const std::string& one_rank() {
  static const std::string folder = shared_run("qwen3_one_rank", job());
  return folder;
}

// A layout's run with checkpoints (shared by the tests that reshard from it).
std::string layout_run(const std::string& name, int ranks, const std::string& layout) {
  return shared_run("qwen3_" + name, launch_args(ranks, job(layout), "{port}"));
}

void expect_matches_one_rank(const std::string& folder, const std::string& what) {
  const auto want = logged_losses(one_rank());
  ASSERT_EQ(want.size(), 20u);
  expect_losses_close(want, logged_losses(folder), 1e-5, what);
}

// Resumes `from`'s step-10 checkpoint in another layout, in the test folder `name` (unique across
// the default and slow binaries, which ctest may run side by side): the last 10 steps continue
// as the one-rank run's.
void expect_resumes_like_one_rank(const std::string& from, int ranks, const std::string& layout,
                                  const std::string& name, const std::string& what) {
  const auto want = logged_losses(one_rank());
  ASSERT_EQ(want.size(), 20u);
  const std::string folder = copy_of_checkpoint(from, 10, "qwen3_resume_" + name);
  const std::string args = job("--job.dump_folder " + folder + layout);
  auto result = run_loom(ranks > 1 ? launch_args(ranks, args) : args);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("resumed from"), std::string::npos) << result.output;
  expect_losses_close(std::vector<double>(want.begin() + 10, want.end()), logged_losses(folder),
                      1e-5, what);
}

LOOM_TEST(Qwen3Training, PipelineWithTiedEmbeddingsTrainsLikeOneRankAndReshards) {
  const std::string pp2 = layout_run("pp2_1f1b", 2, pipeline("1F1B"));
  expect_matches_one_rank(pp2, "qwen3 pp 2 1F1B");
  expect_resumes_like_one_rank(pp2, 1, "", "pp2_to_one", "qwen3 pp 2 -> 1 rank");
}

LOOM_SLOW_TEST(Qwen3Training, EveryLayoutTrainsLikeOneRank) {
  expect_matches_one_rank(layout_run("fsdp2", 2, kFsdp2), "qwen3 FSDP x 2");
  expect_matches_one_rank(layout_run("tp2", 2, kTp2), "qwen3 TP x 2");
  expect_matches_one_rank(layout_run("pp2_interleaved", 2, pipeline("Interleaved1F1B")),
                          "qwen3 pp 2 Interleaved1F1B");
  expect_matches_one_rank(layout_run("fsdp2_tp2", 4, kFsdp2 + kTp2), "qwen3 FSDP x 2 x TP x 2");
  expect_matches_one_rank(
      layout_run("pp2_fsdp2_tp2", 8, pipeline("Interleaved1F1B") + kFsdp2 + kTp2),
      "qwen3 pp 2 x FSDP x 2 x TP x 2");
}

LOOM_SLOW_TEST(Qwen3Training, CheckpointsReshardBetweenLayouts) {
  expect_resumes_like_one_rank(one_rank(), 2, pipeline("Interleaved1F1B"), "one_to_pp2",
                               "qwen3 1 rank -> pp 2");
  expect_resumes_like_one_rank(layout_run("fsdp2", 2, kFsdp2), 2, kTp2, "fsdp2_to_tp2",
                               "qwen3 FSDP x 2 -> TP x 2");
  expect_resumes_like_one_rank(layout_run("tp2", 2, kTp2), 2, pipeline("1F1B"), "tp2_to_pp2",
                               "qwen3 TP x 2 -> pp 2");
  expect_resumes_like_one_rank(
      layout_run("pp2_fsdp2_tp2", 8, pipeline("Interleaved1F1B") + kFsdp2 + kTp2), 1, "",
      "pp2_fsdp2_tp2_to_one", "qwen3 pp 2 x FSDP x 2 x TP x 2 -> 1 rank");
  expect_resumes_like_one_rank(one_rank(), 4, kFsdp2 + kTp2, "one_to_fsdp2_tp2",
                               "qwen3 1 rank -> FSDP x 2 x TP x 2");
}

}  // namespace
