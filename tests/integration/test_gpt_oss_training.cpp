// gpt-oss end to end: gpt_oss debugmodel (layers alternating a sliding window of 8 keys and full
// attention, sinks and biases in attention, a mixture of 8 experts with router and expert biases
// and the clamped SwiGLU in every layer) trains like one rank with the same global batch under
// tensor parallelism (sinks and the q/k/v biases split with the heads, the output projections'
// biases shared out over the partial sums) and expert parallelism for 10 steps by default, and
// FSDP, pipeline and context parallelism (ring, where windows and sinks cross the ranks) for 20
// in the slow label, through `loom launch`.
#include <gtest/gtest.h>

#include <string>

#include "support/layout_runs.h"
#include "support/metrics_log.h"
#include "support/test_sets.h"

namespace {
namespace test_gpt_oss_training {  // its own names in a unity batch

using loom::testing::LayoutRuns;

// The shared 20-step job (global batch 4 of 16 tokens, checkpoints at 10 and 20).
std::string job(const std::string& extra = "") {
  return loom::testing::twenty_step_job("gpt_oss_debug.toml", extra);
}

std::string layout(int ep, int dp_shard, int local_batch) {
  return " --parallelism.expert_parallel_degree " + std::to_string(ep) +
         " --parallelism.data_parallel_shard_degree " + std::to_string(dp_shard) +
         " --training.local_batch_size " + std::to_string(local_batch);
}

LayoutRuns& gpt_oss_runs() {
  static LayoutRuns instance("gpt_oss", job);
  return instance;
}

// The default suite's check: 10 steps, no checkpoints.
LayoutRuns& quick_runs() {
  static LayoutRuns instance = loom::testing::ten_step_runs("gpt_oss_quick", "gpt_oss_debug.toml");
  return instance;
}

LOOM_TEST(GptOssTraining, TensorAndExpertParallelTrainLikeOneRank) {
  quick_runs().expect_matches_one_rank(
      quick_runs().layout_run("tp2", 2,
                              layout(1, 1, 4) + " --parallelism.tensor_parallel_degree 2"),
      "gpt_oss TP 2");
  quick_runs().expect_matches_one_rank(quick_runs().layout_run("ep2", 2, layout(2, 2, 2)),
                                       "gpt_oss ep 2");
}

LOOM_SLOW_TEST(GptOssTraining, EveryLayoutTrainsLikeOneRank) {
  gpt_oss_runs().expect_matches_one_rank(gpt_oss_runs().layout_run("fsdp2", 2, layout(1, 2, 2)),
                                         "gpt_oss FSDP 2");
  gpt_oss_runs().expect_matches_one_rank(
      gpt_oss_runs().layout_run("pp2", 2,
                                layout(1, 1, 4) + " --parallelism.pipeline_parallel_degree 2"
                                                  " --parallelism.pipeline_parallel_schedule 1F1B"),
      "gpt_oss pp 2");
  gpt_oss_runs().expect_matches_one_rank(
      gpt_oss_runs().layout_run("cp2", 2,
                                layout(1, 1, 4) + " --parallelism.context_parallel_degree 2"
                                                  " --parallelism.context_parallel_rotate_method "
                                                  "alltoall"),
      "gpt_oss cp 2, ring (windows and sinks across the ranks)");
  gpt_oss_runs().expect_resumes_like_one_rank(gpt_oss_runs().layout_run("ep2", 2, layout(2, 2, 2)),
                                              1, "", "ep2_to_one", "gpt_oss ep 2 -> 1 rank");
}

}  // namespace test_gpt_oss_training
}  // namespace
