// DeepSeek-V3 end to end: deepseek_v3 debugmodel (latent attention, one dense layer then
// mixtures of 8 experts with group-limited sigmoid routing, 2 shared experts and the balancing
// bias) trains like one rank with the same global batch for 20 steps under FSDP, tensor (latent
// attention split by heads, its latent projections whole), expert and pipeline parallelism (the
// dense layer and the mixtures in different stages) and expert x FSDP, through `loom launch`;
// checkpoints reshard between ep 2 and one rank both ways; MuonClip (Muon + QK-clip) trains
// like one rank under each of them too; so does multi-token prediction. The default suite runs
// ep 2 and MTP's weight switch on one rank, for 10 steps; the other layouts, the 20-step runs,
// the reshards, MuonClip's and MTP's layouts are in the slow label.
#include <gtest/gtest.h>

#include <string>

#include "support/layout_runs.h"
#include "support/metrics_log.h"
#include "support/test_sets.h"

namespace {
namespace test_deepseek_v3_training {  // its own names in a unity batch

using loom::testing::LayoutRuns;

// The shared 20-step job (global batch 4 of 16 tokens, checkpoints at 10 and 20).
std::string job(const std::string& extra = "") {
  return loom::testing::twenty_step_job("deepseek_v3_debug.toml", extra);
}

std::string layout(int ep, int dp_shard, int local_batch) {
  return " --parallelism.expert_parallel_degree " + std::to_string(ep) +
         " --parallelism.data_parallel_shard_degree " + std::to_string(dp_shard) +
         " --training.local_batch_size " + std::to_string(local_batch);
}

LayoutRuns& runs() {
  static LayoutRuns instance("deepseek_v3", job);
  return instance;
}

// Kimi K2's recipe, MuonClip: Muon (Moonlight's lr rule; Newton-Schulz in float32, so that
// sharded and whole gradients' last bits are not rounded to bfloat16) with QK-clip at a threshold
// under the debug model's logits, so that every step clips.
constexpr const char* kMuon =
    "--optimizer.name Muon --optimizer.muon_adjust_lr_fn match_rms_adamw "
    "--optimizer.muon_ns_dtype float32 ";

LayoutRuns& muon_runs() {
  static LayoutRuns instance("deepseek_v3_muon",
                             [](const std::string& extra) { return job(kMuon + extra); });
  return instance;
}

LayoutRuns& clipped_runs() {
  static LayoutRuns instance("deepseek_v3_muon_clip", [](const std::string& extra) {
    return job(std::string(kMuon) + "--optimizer.qk_clip_threshold 0.05 " + extra);
  });
  return instance;
}

// MuonClip with float8 linears. Float8 scales activations by their amax over the microbatch at
// hand, so one rank matches FSDP 2 when it takes the same microbatches (2 rows, accumulated);
// against one microbatch of 4 rows the runs differ by ~1e-4 from step 2 (measured), which is
// float8's dynamic scaling, not a layout's error. Float8 also magnifies float32 rounding: a
// one-rank run with 2 intra-op threads (GEMMs blocked differently) was 3e-5 off at step 1, so
// this holds with ctest's OMP_NUM_THREADS=1, as every rank of the layout runs.
LayoutRuns& clipped_float8_runs() {
  static LayoutRuns instance("deepseek_v3_muon_clip_float8", [](const std::string& extra) {
    return job(std::string(kMuon) +
               "--optimizer.qk_clip_threshold 0.05 --model.converters float8 "
               "--training.local_batch_size 2 " +
               extra);
  });
  return instance;
}

// Multi-token prediction (DeepSeek-V3's MTP, two depths): the extra blocks sit with the head
// (the last pipeline stage), their tokens and labels are cut from whole rows before context
// parallelism shares them out.
LayoutRuns& mtp_runs() {
  static LayoutRuns instance("deepseek_v3_mtp", [](const std::string& extra) {
    return job("--model.num_mtp_layers 2 --model.mtp_scale 0.3 " + extra);
  });
  return instance;
}

// Expert parallelism's token traffic, by its definition: each MoE layer sends a token's hidden
// state to the rank of each of its top-k experts that lives elsewhere and gets the expert's
// output back (dispatch and combine), in the forward and again in the backward, plus the expert
// counts. So every step sends more than nothing, and at most every routed copy both ways twice.
// A run whose experts are not split (ep off) sends no all_to_all at all.
void expect_expert_traffic(const std::string& folder, int64_t rank_tokens, int steps,
                           const std::string& what) {
  constexpr int64_t kDim = 256, kTopK = 3, kMoeLayers = 3;  // deepseek_v3 debugmodel
  constexpr double kCountBytes = 4096;                      // the per-expert counts, generously
  const double most_mb =
      (static_cast<double>(kMoeLayers * rank_tokens * kTopK * kDim * 4 * 2 * 2) + kCountBytes) /
      1e6;
  int checked = 0;
  for (const auto& row : loom::testing::logged_rows(folder)) {
    if (!row.contains("loss")) continue;
    ++checked;
    ASSERT_TRUE(row.contains("comm_mb/all_to_all")) << what << ": no all_to_all " << row.dump();
    const double mb = row["comm_mb/all_to_all"].get<double>();
    EXPECT_GT(mb, 0) << what;
    EXPECT_LE(mb, most_mb) << what << " step " << row["step"];
  }
  EXPECT_EQ(checked, steps) << what;
}

// The default suite's checks: 10 steps, no checkpoints.
std::string quick_job(const std::string& extra) {
  return loom::testing::ten_step_job("deepseek_v3_debug.toml", extra);
}

LayoutRuns& quick_runs() {
  static LayoutRuns instance =
      loom::testing::ten_step_runs("deepseek_v3_quick", "deepseek_v3_debug.toml");
  return instance;
}

LayoutRuns& quick_mtp_runs() {
  static LayoutRuns instance(
      "deepseek_v3_mtp_quick",
      [](const std::string& extra) {
        return quick_job("--model.num_mtp_layers 2 --model.mtp_scale 0.3 " + extra);
      },
      10);
  return instance;
}

LOOM_TEST(DeepseekV3Training, ExpertParallelTrainsLikeOneRank) {
  const std::string ep2 = quick_runs().layout_run("ep2", 2, layout(2, 2, 2));
  quick_runs().expect_matches_one_rank(ep2, "deepseek_v3 ep 2");
  expect_expert_traffic(ep2, 2 * 16, 10, "deepseek_v3 ep 2");
}

// With its weight at 0 the depths change nothing the model's layers learn: the first 5 steps
// are next-token training's, bit for bit (the depths' blocks exist, their loss counts 0). The
// weight's switch at step 6 (DeepSeek's schedule, here 0 -> 0.3) changes the run from there on.
LOOM_TEST(DeepseekV3Training, MultiTokenPredictionAtWeightZeroIsNextTokenTrainingUntilItsSwitch) {
  const std::string folder = quick_mtp_runs().layout_run(
      "scale0_then_0.3", 1,
      "--model.mtp_scale 0 --model.mtp_scale_switch_step 6 --model.mtp_scale_after_switch 0.3");
  const auto switched = loom::testing::logged_losses(folder);
  const auto next_token = loom::testing::logged_losses(quick_runs().one_rank());
  ASSERT_EQ(switched.size(), 10u);
  ASSERT_EQ(next_token.size(), 10u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(switched[i], next_token[i]) << "step " << i + 1;
  for (size_t i = 5; i < 10; ++i) EXPECT_NE(switched[i], next_token[i]) << "step " << i + 1;
  // Each depth's mean token loss is logged on every step, whatever its weight: near
  // ln(vocab 4096) = 8.3 at the start, below it after.
  int logged = 0;
  for (const auto& row : loom::testing::logged_rows(folder)) {
    if (!row.contains("loss")) continue;
    for (const char* key : {"mtp/loss_1", "mtp/loss_2"}) {
      ASSERT_TRUE(row.contains(key)) << row.dump();
      EXPECT_GT(row[key].get<double>(), 1.0) << row.dump();
      EXPECT_LT(row[key].get<double>(), 10.0) << row.dump();
    }
    ++logged;
  }
  EXPECT_EQ(logged, 10);
}

// Each depth's logged mean token loss (`mtp/loss_<k>`, summed and counted over every rank) in a
// layout equals one rank's at every step: a layout that counted a depth's tokens or summed its
// losses over the wrong group would log another value while training alike.
void expect_mtp_metrics_match_one_rank(const std::string& folder, const std::string& what) {
  auto metrics = [](const std::string& dump) {
    std::vector<std::vector<double>> out;
    for (const auto& row : loom::testing::logged_rows(dump)) {
      if (!row.contains("loss")) continue;
      out.push_back({row.at("mtp/loss_1").get<double>(), row.at("mtp/loss_2").get<double>()});
    }
    return out;
  };
  const auto want = metrics(mtp_runs().one_rank());
  const auto got = metrics(folder);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t step = 0; step < want.size(); ++step) {
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_NEAR(got[step][k], want[step][k], 1e-4 * want[step][k])
          << what << ": mtp/loss_" << k + 1 << " at step " << step + 1;
    }
  }
}

// The depths train (the objective is not next-token training's) and every layout, expert
// parallelism (whose dispatch the depths' mixtures share) first, trains like one rank.
LOOM_SLOW_TEST(DeepseekV3Training, MultiTokenPredictionTrainsLikeOneRankUnderEveryLayout) {
  EXPECT_NE(loom::testing::logged_losses(mtp_runs().one_rank()),
            loom::testing::logged_losses(runs().one_rank()));
  mtp_runs().expect_matches_one_rank(mtp_runs().layout_run("ep2", 2, layout(2, 2, 2)),
                                     "deepseek_v3 MTP ep 2");
  mtp_runs().expect_matches_one_rank(mtp_runs().layout_run("fsdp2", 2, layout(1, 2, 2)),
                                     "deepseek_v3 MTP FSDP 2");
  mtp_runs().expect_matches_one_rank(
      mtp_runs().layout_run("tp2", 2, layout(1, 1, 4) + " --parallelism.tensor_parallel_degree 2"),
      "deepseek_v3 MTP TP 2");
  const std::string pp2 =
      mtp_runs().layout_run("pp2", 2,
                            layout(1, 1, 4) +
                                " --parallelism.pipeline_parallel_degree 2"
                                " --parallelism.pipeline_parallel_schedule 1F1B");
  mtp_runs().expect_matches_one_rank(pp2, "deepseek_v3 MTP pp 2 (the depths on the last stage)");
  mtp_runs().expect_matches_one_rank(
      mtp_runs().layout_run("cp2", 2,
                            layout(1, 1, 4) + " --parallelism.context_parallel_degree 2"
                                              " --parallelism.context_parallel_rotate_method "
                                              "alltoall"),
      "deepseek_v3 MTP cp 2, ring");
  mtp_runs().expect_matches_one_rank(mtp_runs().layout_run("ep2_fsdp4", 4, layout(2, 4, 1)),
                                     "deepseek_v3 MTP ep 2 x FSDP 2 (dp_shard 4)");
  // The same layouts' (cached) runs: the depths' logged losses.
  expect_mtp_metrics_match_one_rank(mtp_runs().layout_run("ep2", 2, layout(2, 2, 2)), "ep 2");
  expect_mtp_metrics_match_one_rank(
      mtp_runs().layout_run("tp2", 2, layout(1, 1, 4) + " --parallelism.tensor_parallel_degree 2"),
      "TP 2");
  expect_mtp_metrics_match_one_rank(pp2, "pp 2");
  expect_mtp_metrics_match_one_rank(
      mtp_runs().layout_run("cp2", 2,
                            layout(1, 1, 4) + " --parallelism.context_parallel_degree 2"
                                              " --parallelism.context_parallel_rotate_method "
                                              "alltoall"),
      "cp 2");
  // The depths' blocks (and their mixtures' balancing bias) are checkpointed: a run resumed
  // in another layout continues as the one-rank run.
  mtp_runs().expect_resumes_like_one_rank(pp2, 2, layout(2, 2, 2), "mtp_pp2_to_ep2",
                                          "deepseek_v3 MTP pp 2 -> ep 2");
}

LOOM_SLOW_TEST(DeepseekV3Training, EveryLayoutTrainsLikeOneRank) {
  runs().expect_matches_one_rank(runs().layout_run("fsdp2", 2, layout(1, 2, 2)),
                                 "deepseek_v3 FSDP 2");
  runs().expect_matches_one_rank(
      runs().layout_run("tp2", 2, layout(1, 1, 4) + " --parallelism.tensor_parallel_degree 2"),
      "deepseek_v3 TP 2");
  runs().expect_matches_one_rank(
      runs().layout_run("pp2", 2,
                        layout(1, 1, 4) + " --parallelism.pipeline_parallel_degree 2"
                                          " --parallelism.pipeline_parallel_schedule 1F1B"),
      "deepseek_v3 pp 2 (dense layer and mixtures in different stages)");
  runs().expect_matches_one_rank(runs().layout_run("ep2_fsdp4", 4, layout(2, 4, 1)),
                                 "deepseek_v3 ep 2 x FSDP 2 (dp_shard 4)");
  // Latent attention's keys and values (value heads narrower than the keys) around the ring.
  runs().expect_matches_one_rank(
      runs().layout_run("cp2", 2,
                        layout(1, 1, 4) + " --parallelism.context_parallel_degree 2"
                                          " --parallelism.context_parallel_rotate_method alltoall"),
      "deepseek_v3 cp 2, ring");
}

// MuonClip on latent attention: Muon gathers each hidden matrix whole (FSDP's rows, TP's heads),
// each pipeline stage and each expert-parallel rank (whole experts) steps its own; QK-clip's
// rows are scaled on every rank's own box after the max over the ranks holding the same heads.
// Every layout trains like one rank; the clip changes the run (not Muon's losses without it) and
// logs the step's largest logit.
LOOM_SLOW_TEST(DeepseekV3Training, MuonClipTrainsLikeOneRankUnderEveryLayout) {
  const std::string one = clipped_runs().one_rank();
  EXPECT_NE(loom::testing::logged_losses(one),
            loom::testing::logged_losses(muon_runs().one_rank()));
  int logged = 0;
  for (const auto& row : loom::testing::logged_rows(one)) {
    if (!row.contains("loss")) continue;
    ASSERT_TRUE(row.contains("max_attention_logit")) << row.dump();
    EXPECT_GT(row["max_attention_logit"].get<double>(), 0.05) << row.dump();
    ++logged;
  }
  EXPECT_EQ(logged, 20);
  clipped_runs().expect_matches_one_rank(clipped_runs().layout_run("fsdp2", 2, layout(1, 2, 2)),
                                         "deepseek_v3 MuonClip FSDP 2");
  clipped_runs().expect_matches_one_rank(
      clipped_runs().layout_run("tp2", 2,
                                layout(1, 1, 4) + " --parallelism.tensor_parallel_degree 2"),
      "deepseek_v3 MuonClip TP 2");
  clipped_runs().expect_matches_one_rank(
      clipped_runs().layout_run("pp2", 2,
                                layout(1, 1, 4) + " --parallelism.pipeline_parallel_degree 2"
                                                  " --parallelism.pipeline_parallel_schedule 1F1B"),
      "deepseek_v3 MuonClip pp 2");
  clipped_runs().expect_matches_one_rank(clipped_runs().layout_run("ep2", 2, layout(2, 2, 2)),
                                         "deepseek_v3 MuonClip ep 2");
}

LOOM_SLOW_TEST(DeepseekV3Training, MuonClipWithFloat8TrainsLikeOneRankUnderFsdp) {
  EXPECT_NE(loom::testing::logged_losses(clipped_float8_runs().one_rank()),
            loom::testing::logged_losses(clipped_runs().one_rank()))
      << "float8 changes the run";
  clipped_float8_runs().expect_matches_one_rank(
      clipped_float8_runs().layout_run("fsdp2", 2, layout(1, 2, 2)),
      "deepseek_v3 MuonClip float8 FSDP 2");
}

LOOM_SLOW_TEST(DeepseekV3Training, CheckpointsReshardBetweenExpertParallelAndOneRank) {
  runs().expect_resumes_like_one_rank(runs().layout_run("ep2", 2, layout(2, 2, 2)), 1, "",
                                      "ep2_to_one", "deepseek_v3 ep 2 -> 1 rank");
  runs().expect_resumes_like_one_rank(runs().one_rank(), 2, layout(2, 2, 2), "one_to_ep2",
                                      "deepseek_v3 1 rank -> ep 2");
}

}  // namespace test_deepseek_v3_training
}  // namespace
