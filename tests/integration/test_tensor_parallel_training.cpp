// Tensor parallelism end to end through `loom launch` (real processes over Gloo): tp 2 (loss
// parallel on and off), tp 4, dp_shard 2 x tp 2 and dp_replicate 2 x tp 2 train like one rank
// with the same global batch for 20 steps, validation included; a tp 2 checkpoint resumes
// bitwise on tp 2, and within 1e-5 on one rank and on dp_shard 2; its Hugging Face export
// equals the one-rank export of the same step. The one-rank reference runs once for all tests.
// tp 2 with loss parallel off, tp 4, dp_shard 2 x tp 2 and dp_replicate 2 x tp 2 are in the
// "slow" label (ctest -L slow): their thread-rank tests in the default suite prove the same
// layouts step by step, and the 8-rank pipeline test (pp 2 x dp_shard 2 x tp 2) runs FSDP x TP
// end to end. The default suite's tp 2 check and export run 10 steps (one validation, one
// checkpoint); the 20-step runs the resumes need are the slow label's.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "support/metrics_log.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

using loom::testing::copy_of_checkpoint;
using loom::testing::fresh_temp_dir;
using loom::testing::launch_args;
using loom::testing::logged_losses;
using loom::testing::run_loom;
using loom::testing::shared_run;

// Global batch 8: one rank runs 2 microbatches of 4, tp-only layouts too (one data-parallel
// rank), dp 2 layouts one microbatch of 4 per data-parallel rank. Validation every 10 steps.
std::string job(int steps, const std::string& extra = "") {
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --training.steps " +
         std::to_string(steps) +
         " --training.seq_len 32 --training.local_batch_size 4 --training.global_batch_size 8"
         " --validation.enable true --validation.freq 10 --validation.steps 2"
         " --validation.seq_len 32 --validation.local_batch_size 4"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 7"
         " --lr_scheduler.warmup_steps 2 --lr_scheduler.total_steps 20"
         " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60"
         " --checkpoint.interval 10 --checkpoint.keep_latest_k 0"
         " --checkpoint.last_save_model_only false " +
         extra;
}

std::vector<double> val_losses(const std::string& folder) {
  std::vector<double> out;
  std::ifstream in(folder + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("val_loss")) out.push_back(j["val_loss"].get<double>());
  }
  return out;
}

const std::string& one_rank() {
  static const std::string folder = shared_run("tp_one_rank", job(20, "--checkpoint.enable true"));
  return folder;
}

// The default suite's reference: 10 steps, its one checkpoint (step 10) for the export test.
const std::string& quick_one_rank() {
  static const std::string folder =
      shared_run("tp_quick_one_rank", job(10, "--checkpoint.enable true"));
  return folder;
}

// `folder`'s `steps` losses within 1e-5 of `reference`'s, and its validations (every 10 steps).
// Validation is compared where the data-parallel degree is 1: with validation.steps N every
// data-parallel rank scores N batches of its own slice, so dp 2 scores other windows.
void expect_matches(const std::string& reference, int steps, const std::string& folder,
                    const std::string& what, bool same_validation = true) {
  const auto want = logged_losses(reference);
  ASSERT_EQ(want.size(), static_cast<size_t>(steps));
  loom::testing::expect_losses_close(want, logged_losses(folder), 1e-5, what);
  const size_t validations = static_cast<size_t>(steps / 10);
  if (!same_validation) {
    EXPECT_EQ(val_losses(folder).size(), validations);
    return;
  }
  const auto want_val = val_losses(reference);
  ASSERT_EQ(want_val.size(), validations);
  loom::testing::expect_losses_close(want_val, val_losses(folder), 1e-5, what + " validation");
}

void expect_matches_one_rank(const std::string& folder, const std::string& what,
                             bool same_validation = true) {
  expect_matches(one_rank(), 20, folder, what, same_validation);
}

void run_ok(const std::string& args, const std::string& expect_in_log = "") {
  auto result = run_loom(args);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  if (!expect_in_log.empty()) {
    EXPECT_NE(result.output.find(expect_in_log), std::string::npos) << result.output;
  }
}

// tp 2 over `steps` steps, checkpointed at the end (every 10 steps with 20).
std::string tp2_run_of(int steps, const std::string& name) {
  return shared_run(
      name,
      launch_args(2, job(steps, "--checkpoint.enable true --parallelism.tensor_parallel_degree 2"),
                  "{port}"));
}

// tp 2 with checkpoints at steps 10 and 20: the straight run other tests resume against.
const std::string& tp2_run() {
  static const std::string folder = tp2_run_of(20, "tp2");
  return folder;
}

// The default suite's tp 2: 10 steps, checkpointed at the end.
const std::string& quick_tp2_run() {
  static const std::string folder = tp2_run_of(10, "tp2_quick");
  return folder;
}

}  // namespace

// The first step's traffic proves the tp group carried the region changes (a job that ignored
// tensor_parallel_degree would send nothing): the formula of docs/parallelism.md for
// 2 microbatches of b = 4, s = 32, d = 256, L = 6, N = 2, plus 12 bytes of the trainer's own
// all-reduces (the gradient norm and the stop flag over the world).
LOOM_TEST(TensorParallelTraining, TwoRanksMatchOneRankWithLossParallel) {
  expect_matches(quick_one_rank(), 10, quick_tp2_run(), "tp 2");
  std::ifstream in(quick_tp2_run() + "/metrics.jsonl");
  std::string line;
  double comm_bytes = -1;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("step", 0) == 1 && j.contains("comm_mb")) {
      comm_bytes = j["comm_mb"].get<double>() * 1e6;
      break;
    }
  }
  const double b = 4, s = 32, d = 256, layers = 6, ring = 0.5, micro = 2;
  const double per_micro = (8 * layers + 4) * b * s * d * 4 * ring + 24 * b * s * ring;
  const double want = micro * per_micro + 8 * (2 * layers + 1) * d * ring + 12;
  EXPECT_NEAR(comm_bytes, want, 1e-3 * want);
}

// Resumed on the same layout: bitwise; on one rank and on FSDP x2: the tp boxes are read by
// overlap into whole tensors and row shards.
LOOM_SLOW_TEST(TensorParallelTraining, CheckpointResumesOnTpBitwiseAndReshardsToOneRankAndFsdp) {
  const std::string straight = tp2_run();
  const auto want = logged_losses(straight);
  ASSERT_EQ(want.size(), 20u);
  const std::string same = copy_of_checkpoint(straight, 10, "tp2_resume_tp2");
  run_ok(launch_args(2, job(20, "--checkpoint.enable true --job.dump_folder " + same +
                                    " --parallelism.tensor_parallel_degree 2")));
  const std::vector<double> tail(want.begin() + 10, want.end());
  loom::testing::expect_losses_close(tail, logged_losses(same), 0.0, "tp 2 -> tp 2");
  const auto one = logged_losses(one_rank());
  const std::vector<double> one_tail(one.begin() + 10, one.end());
  const std::string single = copy_of_checkpoint(straight, 10, "tp2_resume_one");
  run_ok(job(20, "--checkpoint.enable true --job.dump_folder " + single));
  loom::testing::expect_losses_close(one_tail, logged_losses(single), 1e-5, "tp 2 -> 1 rank");
  const std::string fsdp = copy_of_checkpoint(straight, 10, "tp2_resume_fsdp");
  run_ok(launch_args(2, job(20, "--checkpoint.enable true --job.dump_folder " + fsdp)));
  loom::testing::expect_losses_close(one_tail, logged_losses(fsdp), 1e-5, "tp 2 -> dp_shard 2");
}

// The export reads the tp boxes back into whole tensors: the same model as the one-rank
// export of the same step (the runs agree to 1e-5 in loss; the weights to float32 training noise,
// which AdamW's normalized updates amplify where gradients are near zero: 1.5e-4 of a tensor's
// largest value measured; a misplaced box would differ by the order of the values themselves).
LOOM_TEST(TensorParallelTraining, HuggingFaceExportOfTpCheckpointEqualsOneRankExport) {
  // `checkpoint inspect` names the layout that wrote it, not only its data-parallel degree.
  run_ok("checkpoint inspect " + quick_tp2_run() + "/checkpoint/step-10",
         "written by 2 ranks (pp 1, dp_replicate 1, dp_shard 1, cp 1, tp 2)");
  const std::string out = fresh_temp_dir("tp2_export");
  run_ok("checkpoint export --to hf --dtype float32 " + quick_tp2_run() + "/checkpoint/step-10 " +
         out + "/tp2");
  run_ok("checkpoint export --to hf --dtype float32 " + quick_one_rank() + "/checkpoint/step-10 " +
         out + "/one");
  const std::string compare =
      std::string(LOOM_PYTHON_BIN_DIR) +
      "/python -c \"import sys, json\n"
      "from safetensors.torch import load_file\n"
      "import glob\n"
      "def load(d):\n"
      "  t = {}\n"
      "  for f in sorted(glob.glob(d + '/*.safetensors')): t.update(load_file(f))\n"
      "  return t\n"
      "a, b = load(sys.argv[1]), load(sys.argv[2])\n"
      "assert a.keys() == b.keys(), (sorted(a), sorted(b))\n"
      "worst = max(float((a[k] - b[k]).abs().max() / b[k].abs().max()) for k in a)\n"
      "print('tensors', len(a), 'worst relative difference', worst)\n"
      "assert worst < 1e-3, worst\n"
      "ca = json.load(open(sys.argv[1] + '/config.json'))\n"
      "cb = json.load(open(sys.argv[2] + '/config.json'))\n"
      "assert ca == cb, (ca, cb)\n\" " +
      out + "/tp2 " + out + "/one";
  auto result = loom::testing::run_command(compare);
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

// The same layouts as the thread-rank tests of tests/unit/test_tensor_parallel.cpp, which
// prove each one step at a time in the default suite; here end to end over 20 steps: `ranks`
// ranks with `layout` train like one rank, and the log shows the wrappers (`in_log`).
namespace {
void expect_layout_matches_one_rank(const std::string& name, int ranks, const std::string& layout,
                                    const std::string& in_log, bool same_validation) {
  const std::string folder = fresh_temp_dir(name);
  run_ok(launch_args(ranks, job(20, "--job.dump_folder " + folder + " " + layout)), in_log);
  expect_matches_one_rank(folder, name + ": " + layout, same_validation);
}
}  // namespace

LOOM_SLOW_TEST(TensorParallelTraining, LossParallelOffGivesTheSameLosses) {
  expect_layout_matches_one_rank(
      "tp2_no_loss_parallel", 2,
      "--parallelism.tensor_parallel_degree 2 --parallelism.disable_loss_parallel true",
      "TP over group", true);
}

LOOM_SLOW_TEST(TensorParallelTraining, FourRanksMatchOneRank) {
  expect_layout_matches_one_rank("tp4", 4, "--parallelism.tensor_parallel_degree 4",
                                 "TP over group", true);
}

LOOM_SLOW_TEST(TensorParallelTraining, FsdpTimesTpMatchesOneRank) {
  expect_layout_matches_one_rank(
      "fsdp2_tp2", 4,
      "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2",
      "reduce-scatter in Float + TP over group 'tp'", false);
}

LOOM_SLOW_TEST(TensorParallelTraining, DdpTimesTpMatchesOneRank) {
  expect_layout_matches_one_rank("ddp2_tp2", 4,
                                 "--parallelism.tensor_parallel_degree 2"
                                 " --parallelism.data_parallel_replicate_degree 2"
                                 " --parallelism.data_parallel_shard_degree 1",
                                 "TP over group 'tp'", false);
}
