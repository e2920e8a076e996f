// Mixture of experts end to end: qwen3_moe debugmodel_moe (8 experts, top 2, the
// auxiliary-loss-free balancing bias on) trains like one rank with the same global batch for
// 20 steps under expert parallelism, alone and composed with FSDP, HSDP, tensor and pipeline
// parallelism, through `loom launch` (real processes over Gloo); checkpoints (the balancing bias
// included) reshard between ep 2 and one rank. The default suite runs ep 2 and its reshard into
// one rank; the other layouts are in the slow label.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/metrics_log.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

using loom::testing::copy_of_checkpoint;
using loom::testing::expect_losses_close;
using loom::testing::launch_args;
using loom::testing::logged_losses;
using loom::testing::run_loom;
using loom::testing::shared_run;

// Global batch 4 of 16 tokens; checkpoints at 10 and 20.
std::string job(const std::string& extra = "") {
  return "train --config " LOOM_SOURCE_DIR
         "/configs/qwen3_moe_debug.toml --training.steps 20"
         " --training.seq_len 16 --training.local_batch_size 4 --training.global_batch_size 4"
         " --parallelism.pipeline_parallel_microbatch_size 1 --validation.enable false"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 13"
         " --lr_scheduler.warmup_steps 2 --lr_scheduler.total_steps 20"
         " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60"
         " --checkpoint.enable true --checkpoint.interval 10 --checkpoint.keep_latest_k 0 " +
         extra;
}

// ep ranks come out of dp_shard: each data-parallel rank takes its share of the global batch.
std::string experts(int ep, int dp_shard, int local_batch) {
  return " --parallelism.expert_parallel_degree " + std::to_string(ep) +
         " --parallelism.data_parallel_shard_degree " + std::to_string(dp_shard) +
         " --training.local_batch_size " + std::to_string(local_batch);
}

const std::string& one_rank() {
  static const std::string folder = shared_run("qwen3_moe_one_rank", job());
  return folder;
}

std::string layout_run(const std::string& name, int ranks, const std::string& layout) {
  return shared_run("qwen3_moe_" + name, launch_args(ranks, job(layout), "{port}"));
}

void expect_matches_one_rank(const std::string& folder, const std::string& what) {
  const auto want = logged_losses(one_rank());
  ASSERT_EQ(want.size(), 20u);
  expect_losses_close(want, logged_losses(folder), 1e-5, what);
}

// Resumes `from`'s step-10 checkpoint in another layout (folder name unique across the default
// and slow binaries): the last 10 steps continue as the one-rank run's, which needs the
// balancing bias restored (a zeroed bias routes differently).
void expect_resumes_like_one_rank(const std::string& from, int ranks, const std::string& layout,
                                  const std::string& name, const std::string& what) {
  const auto want = logged_losses(one_rank());
  ASSERT_EQ(want.size(), 20u);
  const std::string folder = copy_of_checkpoint(from, 10, "qwen3_moe_resume_" + name);
  const std::string args = job("--job.dump_folder " + folder + layout);
  auto result = run_loom(ranks > 1 ? launch_args(ranks, args) : args);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("resumed from"), std::string::npos) << result.output;
  expect_losses_close(std::vector<double>(want.begin() + 10, want.end()), logged_losses(folder),
                      1e-5, what);
}

LOOM_TEST(Qwen3MoeTraining, ExpertParallelTrainsLikeOneRankAndReshards) {
  const std::string ep2 = layout_run("ep2", 2, experts(2, 2, 2));
  expect_matches_one_rank(ep2, "qwen3_moe ep 2");
  expect_resumes_like_one_rank(ep2, 1, "", "ep2_to_one", "qwen3_moe ep 2 -> 1 rank");
}

LOOM_SLOW_TEST(Qwen3MoeTraining, EveryExpertLayoutTrainsLikeOneRank) {
  expect_matches_one_rank(layout_run("ep4", 4, experts(4, 4, 1)), "qwen3_moe ep 4");
  expect_matches_one_rank(layout_run("ep2_fsdp4", 4, experts(2, 4, 1)),
                          "qwen3_moe ep 2 x FSDP 2 (dp_shard 4)");
  expect_matches_one_rank(
      layout_run("ep2_hsdp", 4,
                 experts(2, 2, 1) + " --parallelism.data_parallel_replicate_degree 2"),
      "qwen3_moe ep 2 x HSDP 2 x 2");
  expect_matches_one_rank(
      layout_run("ep2_pp2", 4,
                 experts(2, 2, 2) + " --parallelism.pipeline_parallel_degree 2"
                                    " --parallelism.pipeline_parallel_schedule 1F1B"),
      "qwen3_moe ep 2 x pp 2");
  expect_matches_one_rank(layout_run("fsdp2", 2, experts(1, 2, 2)), "qwen3_moe FSDP 2");
  expect_matches_one_rank(
      layout_run("ep2_tp2", 4, experts(2, 2, 2) + " --parallelism.tensor_parallel_degree 2"),
      "qwen3_moe ep 2 x TP 2");
}

LOOM_SLOW_TEST(Qwen3MoeTraining, CheckpointsReshardIntoExpertParallelism) {
  expect_resumes_like_one_rank(one_rank(), 2, experts(2, 2, 2), "one_to_ep2",
                               "qwen3_moe 1 rank -> ep 2");
  expect_resumes_like_one_rank(layout_run("ep2", 2, experts(2, 2, 2)), 4, experts(4, 4, 1),
                               "ep2_to_ep4", "qwen3_moe ep 2 -> ep 4");
}

}  // namespace
