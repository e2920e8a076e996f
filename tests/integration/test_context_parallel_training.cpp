// Context parallelism end to end: the llama3 debug model on rows packed from short documents
// trains like one rank with the same global batch for 20 steps (validation included) when each
// sequence is split over cp ranks (head-tail), under the causal and the block_causal mask, by
// both attention methods (all-gather and the ring), alone and with FSDP, TP and PP; checkpoints
// resume into another cp. Through `loom launch` (processes over Gloo). The default suite runs
// the ring at cp 2 under block_causal for 10 steps; the other layouts and the 20-step runs are
// in the slow label.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/layout_runs.h"
#include "support/metrics_log.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {
namespace test_context_parallel_training {  // its own names in a unity batch

using loom::testing::LayoutRuns;

// Short documents (8 to 40 words), so that most rows of 32 tokens hold several.
const std::string& short_documents() {
  static const std::string file = [] {
    const std::string folder = loom::testing::fresh_temp_dir("cp_documents");
    const std::string path = folder + "/short.jsonl";
    std::ofstream out(path);
    const char* words[] = {"the",          "jury", "said",       "it",    "did",
                           "find",         "that", "many",       "of",    "Georgia's",
                           "registration", "and",  "election",   "laws",  "are",
                           "outmoded",     "or",   "inadequate", "often", "ambiguous"};
    for (int doc = 0; doc < 400; ++doc) {
      std::string text;
      const int length = 8 + (doc * 7) % 33;
      for (int w = 0; w < length; ++w)
        text += std::string(w ? " " : "") + words[(doc * 3 + w * 5) % 20];
      out << "{\"text\": \"" << text << ".\"}\n";
    }
    return path;
  }();
  return file;
}

// Global batch 4 of 32 tokens on every layout (cp ranks share rows); validation halfway and at
// the end. 20 steps with checkpoints at 10 (the resumes'), or the default suite's 10 without.
std::string job(const std::string& mask, const std::string& extra, int steps = 20) {
  const std::string checkpoints =
      steps == 20
          ? " --checkpoint.enable true --checkpoint.interval 10 --checkpoint.keep_latest_k 0 "
          : " --checkpoint.enable false ";
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --training.steps " +
         std::to_string(steps) + " --training.dataset_path " + short_documents() +
         " --training.seq_len 32 --training.local_batch_size 4 --training.global_batch_size 4"
         " --validation.enable true --validation.dataset_path " +
         short_documents() + " --validation.freq " + std::to_string(steps / 2) +
         " --validation.steps 2 --validation.seq_len 32"
         " --validation.local_batch_size 4 --model.attn_mask_type " +
         mask +
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 11"
         " --lr_scheduler.warmup_steps 2 --lr_scheduler.total_steps " +
         std::to_string(steps) + " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60" +
         checkpoints + extra;
}

LayoutRuns& block_causal() {
  static LayoutRuns instance("cp_block_causal",
                             [](const std::string& extra) { return job("block_causal", extra); });
  return instance;
}

LayoutRuns& quick_block_causal() {
  static LayoutRuns instance(
      "cp_block_causal_quick",
      [](const std::string& extra) { return job("block_causal", extra, 10); }, 10);
  return instance;
}

LayoutRuns& causal() {
  static LayoutRuns instance("cp_causal",
                             [](const std::string& extra) { return job("causal", extra); });
  return instance;
}

std::vector<double> val_losses(const std::string& folder) {
  std::vector<double> out;
  std::ifstream in(folder + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("val_loss")) out.push_back(row["val_loss"].get<double>());
  }
  return out;
}

// Training losses and the validation losses at steps 10 and 20 (same rows: the layouts keep the
// global validation batch) within 1e-5 of one rank's.
void expect_like_one_rank(LayoutRuns& runs, const std::string& folder, const std::string& what) {
  runs.expect_matches_one_rank(folder, what);
  const auto want = val_losses(runs.one_rank()), got = val_losses(folder);
  ASSERT_EQ(want.size(), 2u) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << what << ": validation " << i;
  }
}

// cp ranks by `method` (allgather or alltoall, the ring), with no data-parallel sharding.
std::string context(int cp, const std::string& method = "alltoall") {
  return " --parallelism.context_parallel_degree " + std::to_string(cp) +
         " --parallelism.context_parallel_rotate_method " + method +
         " --parallelism.data_parallel_shard_degree 1";
}

std::string pipeline(int pp) {
  return " --parallelism.pipeline_parallel_degree " + std::to_string(pp) +
         " --parallelism.pipeline_parallel_schedule 1F1B"
         " --parallelism.pipeline_parallel_microbatch_size 2";
}

// The ring's traffic by its definition: per layer, the forward passes each rank's key and value
// blocks cp - 1 steps around the ring; the backward passes them around again (cp - 1 steps) and
// each block's key/value gradient accumulator cp steps (home at the end). Block: the rank's
// tokens (rows x seq_len / cp) x kv heads x head dim floats. The all-gather method sends none of
// it (its keys travel as all_gather_into_tensor), and neither does a run without cp.
// Steps 2 to 9 are checked, but for a validation step and the one after it (`validation_freq`).
void expect_ring_traffic(const std::string& folder, int cp, int validation_freq,
                         const std::string& what) {
  constexpr int64_t kLayers = 6, kKvHeads = 16, kHeadDim = 16;  // llama3 debugmodel
  constexpr int64_t kRows = 4, kSeqLen = 32;
  const int64_t block_bytes = kRows * kSeqLen / cp * kKvHeads * kHeadDim * 4;
  const int64_t per_layer = 2 * (cp - 1) + 2 * (cp - 1) + 2 * cp;  // K,V fwd; K,V bwd; dK,dV
  const double want_mb = static_cast<double>(kLayers * per_layer * block_bytes) / 1e6;
  const auto validated = [&](int64_t step) {
    return step % validation_freq == 0 || (step - 1) % validation_freq == 0;
  };
  int checked = 0, want_checked = 0;
  for (int64_t step = 2; step <= 9; ++step) want_checked += validated(step) ? 0 : 1;
  for (const auto& row : loom::testing::logged_rows(folder)) {
    if (!row.contains("loss")) continue;
    const int64_t step = row["step"].get<int64_t>();
    // One step per window, no validation forward in it.
    if (step < 2 || step > 9 || validated(step)) continue;
    ++checked;
    ASSERT_TRUE(row.contains("comm_mb/send")) << what << ": no ring traffic at step " << step;
    EXPECT_NEAR(row["comm_mb/send"].get<double>(), want_mb, 1e-9)
        << what << " step " << step << ": the ring's bytes per step";
  }
  EXPECT_EQ(checked, want_checked) << what;
}

LOOM_TEST(ContextParallelTraining, BlockCausalRingCp2TrainsLikeOneRank) {
  const std::string ring = quick_block_causal().layout_run("cp2", 2, context(2));
  expect_like_one_rank(quick_block_causal(), ring, "block_causal cp 2, ring");
  expect_ring_traffic(ring, 2, 5, "block_causal cp 2, ring");
}

LOOM_SLOW_TEST(ContextParallelTraining, EveryLayoutTrainsLikeOneRank) {
  expect_like_one_rank(block_causal(),
                       block_causal().layout_run("cp2_allgather", 2, context(2, "allgather")),
                       "block_causal cp 2, all-gather");
  for (const std::string method : {"allgather", "alltoall"}) {
    expect_like_one_rank(causal(), causal().layout_run("cp2_" + method, 2, context(2, method)),
                         "causal cp 2, " + method);
    const std::string cp4 = causal().layout_run("cp4_" + method, 4, context(4, method));
    expect_like_one_rank(causal(), cp4, "causal cp 4, " + method);
    if (method == "alltoall") expect_ring_traffic(cp4, 4, 10, "causal cp 4, ring");
    expect_like_one_rank(block_causal(),
                         block_causal().layout_run("cp4_" + method, 4, context(4, method)),
                         "block_causal cp 4, " + method);
  }
  // dp_shard 2: each data-parallel rank reads half of the global batches.
  expect_like_one_rank(causal(),
                       causal().layout_run("cp2_fsdp2", 4,
                                           " --parallelism.context_parallel_degree 2"
                                           " --parallelism.data_parallel_shard_degree 2"
                                           " --training.local_batch_size 2"
                                           " --validation.local_batch_size 2"),
                       "causal cp 2 x FSDP 2");
  expect_like_one_rank(block_causal(),
                       block_causal().layout_run(
                           "cp2_tp2", 4, context(2) + " --parallelism.tensor_parallel_degree 2"),
                       "block_causal cp 2 x TP 2, ring");
  // Two microbatches of 2 rows through two stages, each stage's tokens split over cp 2.
  expect_like_one_rank(causal(), causal().layout_run("cp2_pp2", 4, context(2) + pipeline(2)),
                       "causal cp 2 x PP 2, ring");
  expect_like_one_rank(
      block_causal(),
      block_causal().layout_run("cp2_pp2", 4, context(2, "allgather") + pipeline(2)),
      "block_causal cp 2 x PP 2, all-gather");
  expect_like_one_rank(block_causal(), block_causal().layout_run("pp2", 2, pipeline(2)),
                       "block_causal PP 2");
  expect_like_one_rank(
      causal(),
      causal().layout_run("cp2_none", 2,
                          context(2) + " --parallelism.context_parallel_load_balancer none"),
      "causal cp 2, contiguous shares, ring");
  // The two masks train different models on these rows (the check sees the documents).
  const auto a = loom::testing::logged_losses(causal().one_rank());
  const auto b = loom::testing::logged_losses(block_causal().one_rank());
  EXPECT_GT(std::abs(a.back() - b.back()), 1e-3);
}

// A row of 8192 tokens on the debug model needs ~0.8 GiB of tensors on one rank (activations
// 0.69 GiB, docs/parallelism.md): under a 0.5 GiB capacity one rank runs out of memory at its
// first step, and the same job over cp 4 (the ring, ~0.2 GiB of activations per rank) trains.
LOOM_SLOW_TEST(ContextParallelTraining, ASequenceTooLongForOneRankTrainsAtCp4) {
  const std::string job =
      "train --config " LOOM_SOURCE_DIR
      "/configs/llama3_debug.toml --training.steps 2 --training.seq_len 8192"
      " --training.local_batch_size 1 --training.global_batch_size 1 --validation.enable false"
      " --checkpoint.enable false --metrics.log_freq 1 --debug.seed 3"
      " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 300"
      " --debug.cpu_memory_limit_gib 0.5 --job.dump_folder ";
  const std::string one_folder = loom::testing::fresh_temp_dir("cp_memory_one");
  const auto one = loom::testing::run_loom(job + one_folder);
  EXPECT_NE(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("out of memory on cpu"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("debug.cpu_memory_limit_gib = 0.500 GiB"), std::string::npos)
      << one.output;
  const std::string cp_folder = loom::testing::fresh_temp_dir("cp_memory_cp4");
  const auto cp4 = loom::testing::run_loom(
      loom::testing::launch_args(4, job + cp_folder + context(4, "alltoall")));
  ASSERT_EQ(cp4.exit_code, 0) << cp4.output;
  const auto losses = loom::testing::logged_losses(cp_folder);
  ASSERT_EQ(losses.size(), 2u);
  for (double loss : losses) EXPECT_TRUE(std::isfinite(loss) && loss > 0);
}

LOOM_SLOW_TEST(ContextParallelTraining, CheckpointsResumeIntoAnotherCp) {
  block_causal().expect_resumes_like_one_rank(block_causal().layout_run("cp2", 2, context(2)), 1,
                                              "", "cp2_to_one", "block_causal cp 2 -> 1 rank");
  block_causal().expect_resumes_like_one_rank(block_causal().one_rank(), 4, context(4),
                                              "one_to_cp4", "block_causal 1 rank -> cp 4");
}

}  // namespace test_context_parallel_training
}  // namespace
