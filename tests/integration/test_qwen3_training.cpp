// The second family end to end: qwen3 debugmodel (q/k norms, head_dim 128 over a 256-wide model,
// rotate-half RoPE, the head tied to the token table) trains like one rank with the same global
// batch for 20 steps under every parallel layout, through `loom launch` (real processes over
// Gloo), and its checkpoints reshard between those layouts and one rank. The tied table is the
// hard part: one FSDP unit spanning the model, the vocabulary rows under TP, and under PP a copy
// on the last stage whose gradient is summed with the first stage's (docs/parallelism.md).
// The default suite runs pp 2 (the tied copies) for 10 steps; every other layout, the 20-step
// runs and the reshards are in the slow label.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/layout_runs.h"
#include "support/test_sets.h"

namespace {
namespace test_qwen3_training {  // its own names in a unity batch

using loom::testing::LayoutRuns;

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

LayoutRuns& runs() {
  static LayoutRuns instance("qwen3", job);
  return instance;
}

// The default suite's check: 10 steps, no checkpoints.
LayoutRuns& quick_runs() {
  static LayoutRuns instance = loom::testing::ten_step_runs("qwen3_quick", "qwen3_debug.toml");
  return instance;
}

LOOM_TEST(Qwen3Training, PipelineWithTiedEmbeddingsTrainsLikeOneRank) {
  quick_runs().expect_matches_one_rank(quick_runs().layout_run("pp2_1f1b", 2, pipeline("1F1B")),
                                       "qwen3 pp 2 1F1B");
}

LOOM_SLOW_TEST(Qwen3Training, EveryLayoutTrainsLikeOneRank) {
  runs().expect_matches_one_rank(runs().layout_run("fsdp2", 2, kFsdp2), "qwen3 FSDP x 2");
  runs().expect_matches_one_rank(runs().layout_run("tp2", 2, kTp2), "qwen3 TP x 2");
  runs().expect_matches_one_rank(
      runs().layout_run("pp2_interleaved", 2, pipeline("Interleaved1F1B")),
      "qwen3 pp 2 Interleaved1F1B");
  runs().expect_matches_one_rank(runs().layout_run("fsdp2_tp2", 4, kFsdp2 + kTp2),
                                 "qwen3 FSDP x 2 x TP x 2");
  runs().expect_matches_one_rank(
      runs().layout_run("pp2_fsdp2_tp2", 8, pipeline("Interleaved1F1B") + kFsdp2 + kTp2),
      "qwen3 pp 2 x FSDP x 2 x TP x 2");
}

LOOM_SLOW_TEST(Qwen3Training, CheckpointsReshardBetweenLayouts) {
  runs().expect_resumes_like_one_rank(runs().layout_run("pp2_1f1b", 2, pipeline("1F1B")), 1, "",
                                      "pp2_to_one", "qwen3 pp 2 -> 1 rank");
  runs().expect_resumes_like_one_rank(runs().one_rank(), 2, pipeline("Interleaved1F1B"),
                                      "one_to_pp2", "qwen3 1 rank -> pp 2");
  runs().expect_resumes_like_one_rank(runs().layout_run("fsdp2", 2, kFsdp2), 2, kTp2,
                                      "fsdp2_to_tp2", "qwen3 FSDP x 2 -> TP x 2");
  runs().expect_resumes_like_one_rank(runs().layout_run("tp2", 2, kTp2), 2, pipeline("1F1B"),
                                      "tp2_to_pp2", "qwen3 TP x 2 -> pp 2");
  runs().expect_resumes_like_one_rank(
      runs().layout_run("pp2_fsdp2_tp2", 8, pipeline("Interleaved1F1B") + kFsdp2 + kTp2), 1, "",
      "pp2_fsdp2_tp2_to_one", "qwen3 pp 2 x FSDP x 2 x TP x 2 -> 1 rank");
  runs().expect_resumes_like_one_rank(runs().one_rank(), 4, kFsdp2 + kTp2, "one_to_fsdp2_tp2",
                                      "qwen3 1 rank -> FSDP x 2 x TP x 2");
}

}  // namespace test_qwen3_training
}  // namespace
