// Saving and resuming training end to end: 10 steps + resume to 20 gives bitwise the losses of 20
// straight steps (sync and async saves, after SIGTERM, on 2-rank DDP through `loom launch`); a
// 1-rank checkpoint resumes into 2-rank DDP and back; faults (corrupt shard, failing writer) and
// keep_latest_k.
#include <gtest/gtest.h>

#include "support/test_sets.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/core/check.h"
#include "loom/core/folder_lock.h"
#include "loom/core/signals.h"
#include "loom/data/synthetic.h"
#include "loom/train/trainer.h"
#include "support/errors.h"
#include "support/jobs.h"
#include "support/metrics_log.h"
#include "support/process.h"

using loom::config::JobConfig;
using loom::train::Trainer;
namespace fs = std::filesystem;
using loom::testing::copy_of_checkpoint;

namespace {

JobConfig small_job(const std::string& folder, int64_t steps) {
  JobConfig c = loom::testing::small_job(folder, {4, 32, steps, 3, 10, 11});
  c.lr_scheduler.total_steps = 20;  // the same schedule for 10-step and 20-step runs
  c.checkpoint.enable = true;
  c.checkpoint.interval = 5;
  c.checkpoint.last_save_model_only = false;
  c.checkpoint.keep_latest_k = 0;
  return c;
}

const std::vector<double>& straight_losses() {
  static const std::vector<double> losses = [] {
    auto c = small_job(loom::testing::fresh_temp_dir("ckpt_straight"), 20);
    c.checkpoint.enable = false;
    return Trainer(c).train().losses;
  }();
  return losses;
}

void expect_bitwise(const std::vector<double>& want, size_t from, const std::vector<double>& got) {
  ASSERT_GE(want.size(), from + got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(want[from + i], got[i]) << "step " << from + i + 1;
  }
}

// Synthetic data that raises SIGTERM while the `at`-th microbatch is fetched.
class SignalAt : public loom::data::BatchSource {
 public:
  SignalAt(std::unique_ptr<loom::data::BatchSource> inner, int64_t at)
      : inner_(std::move(inner)), at_(at) {}
  loom::data::Batch next(int64_t batch, int64_t seq) override {
    if (++calls_ == at_) std::raise(SIGTERM);
    return inner_->next(batch, seq);
  }
  nlohmann::json state() const override { return inner_->state(); }
  void load_state(const nlohmann::json& s) override { inner_->load_state(s); }

 private:
  std::unique_ptr<loom::data::BatchSource> inner_;
  int64_t at_;
  int64_t calls_ = 0;
};

}  // namespace

LOOM_TEST(CheckpointTraining, TenStepsThenResumeIsBitwiseTheStraightRun) {
  for (const char* mode : {"disabled", "async"}) {
    SCOPED_TRACE(mode);
    const std::string folder = loom::testing::fresh_temp_dir(std::string("ckpt_resume_") + mode);
    auto first = small_job(folder, 10);
    first.checkpoint.async_mode = mode;
    auto head = Trainer(first).train();
    ASSERT_EQ(head.losses.size(), 10u);
    expect_bitwise(straight_losses(), 0, head.losses);
    EXPECT_TRUE(loom::checkpoint::is_complete_step(folder + "/checkpoint/step-10"));
    EXPECT_TRUE(loom::checkpoint::is_complete_step(folder + "/checkpoint/step-5"));
    auto second = small_job(folder, 20);
    second.checkpoint.async_mode = mode;
    auto tail = Trainer(second).train();
    expect_bitwise(straight_losses(), 10, tail.losses);
  }
}

LOOM_TEST(CheckpointTraining, SigtermSavesAndTheResumedRunMatches) {
  loom::signals::install_shutdown_handlers();
  loom::signals::clear_shutdown_request();
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_sigterm");
  auto job = small_job(folder, 20);
  job.checkpoint.interval = 100;  // only the stop saves
  auto source =
      std::make_unique<SignalAt>(std::make_unique<loom::data::SyntheticSource>(2048, 11), 7);
  auto head = Trainer(job, std::move(source)).train();
  loom::signals::clear_shutdown_request();
  ASSERT_TRUE(head.stopped_by_signal);
  const auto stopped = head.steps_completed;
  ASSERT_TRUE(
      loom::checkpoint::is_complete_step(folder + "/checkpoint/step-" + std::to_string(stopped)));
  auto tail = Trainer(job).train();
  EXPECT_EQ(tail.losses.size(), static_cast<size_t>(20 - stopped));
  std::vector<double> all = head.losses;
  all.insert(all.end(), tail.losses.begin(), tail.losses.end());
  expect_bitwise(straight_losses(), 0, all);
}

LOOM_TEST(CheckpointTraining, CorruptNewestStepFallsBackAndExplicitStepIsRefused) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_corrupt");
  Trainer(small_job(folder, 10)).train();
  const std::string shard = folder + "/checkpoint/step-10/rank-00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x55');
  }
  // An explicit load_step names the file.
  auto explicit_step = small_job(folder, 20);
  explicit_step.checkpoint.load_step = 10;
  try {
    Trainer(explicit_step).train();
    FAIL() << "a corrupt checkpoint was loaded";
  } catch (const loom::InputError& error) {
    EXPECT_NE(std::string(error.what()).find("rank-00000.safetensors"), std::string::npos)
        << error.what();
  }
  // load_step = -1: step 10 is unreadable, step 5 loads (with a warning), 15 steps follow
  // (and re-save step 10).
  auto resumed = Trainer(small_job(folder, 20)).train();
  ASSERT_EQ(resumed.losses.size(), 15u);
  expect_bitwise(straight_losses(), 5, resumed.losses);
}

LOOM_TEST(CheckpointTraining, FailingWriterLeavesTrainingRunningAndTheStepIncomplete) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_write_fail");
  auto job = small_job(folder, 7);
  job.checkpoint.async_mode = "async";
  {
    Trainer trainer(job);  // holds the folder until it ends
    trainer.checkpointer().inject_write_failure("No space left on device (injected)");
    auto result = trainer.train();
    EXPECT_EQ(result.steps_completed, 7);
    EXPECT_FALSE(trainer.checkpointer().wait());
  }
  EXPECT_FALSE(fs::exists(folder + "/checkpoint/step-5"));
  EXPECT_TRUE(loom::checkpoint::complete_steps(folder + "/checkpoint").empty());
  auto inspect = loom::testing::run_loom("checkpoint inspect " + folder + "/checkpoint");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("step-5.tmp: INCOMPLETE"), std::string::npos) << inspect.output;
  // The next run ignores the incomplete folders and starts from scratch.
  auto again = Trainer(small_job(folder, 3)).train();
  EXPECT_EQ(again.losses.size(), 3u);
  EXPECT_FALSE(fs::exists(folder + "/checkpoint/step-5.tmp"));
}

// Saves that keep failing stop the run at the next scheduled save (checkpoint.
// stop_after_failed_saves, default 2) rather than training on with nothing to resume from:
// steps 2 and 4 fail, step 6 is the last trained. 0 trains on.
LOOM_TEST(CheckpointTraining, SavesFailingInARowStopTheRun) {
  for (const int64_t limit : {2, 0}) {
    const std::string folder =
        loom::testing::fresh_temp_dir("ckpt_failing_in_a_row_" + std::to_string(limit));
    auto job = small_job(folder, 10);
    job.checkpoint.interval = 2;
    job.checkpoint.stop_after_failed_saves = limit;
    job.metrics.log_freq = 1;
    Trainer trainer(job);
    trainer.checkpointer().inject_write_failure("Input/output error (injected)");
    std::string error;
    try {
      trainer.train();
    } catch (const loom::Error& e) {
      error = e.what();
    }
    const auto steps = loom::testing::losses_by_step(folder);
    ASSERT_FALSE(steps.empty());
    if (limit == 0) {
      EXPECT_EQ(error, "");
      EXPECT_EQ(steps.rbegin()->first, 10);
      continue;
    }
    EXPECT_NE(error.find("the last 2 checkpoint saves failed (Input/output error (injected)"),
              std::string::npos)
        << error;
    EXPECT_EQ(steps.rbegin()->first, 6);
  }
}

// A stop between steps (a replica group's quorum wait) saves the last step unless its scheduled
// save completed: it skipped a step whose scheduled save had failed, losing the steps since the
// one before.
LOOM_TEST(CheckpointTraining, AStopBetweenStepsSavesAStepWhoseScheduledSaveFailed) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_stop_after_failed_save");
  Trainer trainer(small_job(folder, 5));
  trainer.checkpointer().inject_write_failure("No space left on device (injected)");
  EXPECT_EQ(trainer.train().steps_completed, 5);
  EXPECT_FALSE(trainer.checkpointer().wait());
  trainer.checkpointer().inject_write_failure("");
  trainer.checkpointer().save_stopped(5, 5 * 4 * 32);
  EXPECT_TRUE(trainer.checkpointer().wait());
  EXPECT_TRUE(loom::checkpoint::is_complete_step(folder + "/checkpoint/step-5"));
}

LOOM_TEST(CheckpointTraining, UnwritableCheckpointFolderIsLoggedAndTrainingGoesOn) {
  // A real I/O failure (no injection): the checkpoint folder's path is taken by a file.
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_unwritable");
  std::ofstream(folder + "/checkpoint") << "not a folder";
  for (const char* mode : {"disabled", "async"}) {
    auto job = small_job(folder, 6);
    job.checkpoint.async_mode = mode;
    Trainer trainer(job);
    auto result = trainer.train();
    EXPECT_EQ(result.steps_completed, 6) << mode;
    EXPECT_FALSE(trainer.checkpointer().wait()) << mode;
  }
}

// A checkpoint folder another job holds (its rank 0's lock on <folder>/.lock) is refused at
// start, naming the holder, after comm.init_timeout_seconds of trying: two jobs there would
// delete each other's saves. A load_only job, which writes nothing there, reads it. Once the
// holder lets go (it ended, however), the folder is this job's.
LOOM_TEST(CheckpointTraining, AFolderAnotherJobHoldsIsRefused) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_folder_held");
  auto job = small_job(folder, 2);
  job.comm.init_timeout_seconds = 1;
  std::string holder;
  auto other = loom::files::FolderLock::try_lock(folder + "/checkpoint", &holder);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(holder, "");
  std::string error;
  try {
    Trainer(job).train();
  } catch (const loom::Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("is in use by another job (host "), std::string::npos) << error;
  EXPECT_NE(error.find("pid " + std::to_string(::getpid())), std::string::npos) << error;
  auto reader = job;
  reader.checkpoint.load_only = true;
  EXPECT_EQ(Trainer(reader).train().steps_completed, 2);
  other.reset();
  EXPECT_EQ(Trainer(job).train().steps_completed, 2);
}

LOOM_TEST(CheckpointTraining, KeepLatestKPurgesOlderSteps) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_keep");
  auto job = small_job(folder, 8);
  job.checkpoint.interval = 2;
  job.checkpoint.keep_latest_k = 2;
  { Trainer(job).train(); }  // the destructor waits for the purge
  const auto steps = loom::checkpoint::complete_steps(folder + "/checkpoint");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].first, 8);
  EXPECT_EQ(steps[1].first, 6);
  EXPECT_FALSE(fs::exists(folder + "/checkpoint/step-2"));
  auto inspect =
      loom::testing::run_loom("checkpoint inspect --verify --tensors " + steps[0].second);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  for (const char* want : {"step 8, complete", "model.tok_embeddings.weight", "F32   [2048, 256]",
                           "optimizer.exp_avg_sq.norm.weight", "every chunk matches its CRC-32"}) {
    EXPECT_NE(inspect.output.find(want), std::string::npos) << want << "\n" << inspect.output;
  }
}

LOOM_TEST(CheckpointTraining, ModelOnlyInitialLoadStartsAtStepOne) {
  const std::string source = loom::testing::fresh_temp_dir("ckpt_initial_src");
  auto first = small_job(source, 5);
  first.checkpoint.last_save_model_only = true;
  first.checkpoint.export_dtype = "bfloat16";
  Trainer(first).train();
  auto index =
      nlohmann::json::parse(loom::testing::read_text(source + "/checkpoint/step-5/index.json"));
  EXPECT_TRUE(index["model_only"].get<bool>());
  EXPECT_EQ(index["tensors"]["model.norm.weight"]["dtype"], "BF16");
  EXPECT_FALSE(index["tensors"].contains("optimizer.exp_avg.norm.weight"));
  // A new run starts from those weights at step 1 (not from the initialization).
  auto job = small_job(loom::testing::fresh_temp_dir("ckpt_initial_dst"), 3);
  job.checkpoint.initial_load_path = source + "/checkpoint";
  auto result = Trainer(job).train();
  ASSERT_EQ(result.losses.size(), 3u);
  EXPECT_LT(result.losses[0], straight_losses()[0] - 0.05);
}

// export_dtype is for the weights: a weights-only save keeps a MoE layer's balancing bias (model
// state that is not a parameter, moved in small steps) in float32. It was rounded to bfloat16.
LOOM_TEST(CheckpointTraining, ModelOnlySavesKeepTheBalancingBiasInFloat32) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_model_only_bias");
  auto job = small_job(folder, 1);
  job.model.name = "deepseek_v3";
  job.checkpoint.last_save_model_only = true;
  job.checkpoint.export_dtype = "bfloat16";
  Trainer(job).train();
  const auto index =
      nlohmann::json::parse(loom::testing::read_text(folder + "/checkpoint/step-1/index.json"));
  EXPECT_EQ(index["tensors"]["model.layers.1.moe.expert_bias"]["dtype"], "F32");
  EXPECT_EQ(index["tensors"]["model.norm.weight"]["dtype"], "BF16");
}

LOOM_TEST(CheckpointTraining, SeedCheckpointAndHuggingFaceRoundTripThroughTraining) {
  // create_seed_checkpoint: the initialized model as step-0, no training.
  const std::string seed = loom::testing::fresh_temp_dir("ckpt_seed");
  auto seed_job = small_job(seed, 5);
  seed_job.checkpoint.create_seed_checkpoint = true;
  EXPECT_EQ(Trainer(seed_job).train().steps_completed, 0);
  ASSERT_TRUE(loom::checkpoint::is_complete_step(seed + "/checkpoint/step-0"));
  // Train 5 steps; the final save is also exported to Hugging Face (last_save_in_hf).
  const std::string source = loom::testing::fresh_temp_dir("ckpt_hf_src");
  auto first = small_job(source, 5);
  first.checkpoint.last_save_model_only = true;
  first.checkpoint.last_save_in_hf = true;
  Trainer(first).train();
  ASSERT_TRUE(fs::exists(source + "/checkpoint/step-5-hf/model.safetensors"));
  ASSERT_TRUE(fs::exists(source + "/checkpoint/step-5-hf/config.json"));
  // Starting from the HF export (initial_load_in_hf) trains exactly like starting from the loom
  // checkpoint it came from: export and import are exact in float32.
  auto from_hf = small_job(loom::testing::fresh_temp_dir("ckpt_hf_dst"), 3);
  from_hf.checkpoint.initial_load_path = source + "/checkpoint/step-5-hf";
  from_hf.checkpoint.initial_load_in_hf = true;
  auto hf_losses = Trainer(from_hf).train().losses;
  auto from_loom = small_job(loom::testing::fresh_temp_dir("ckpt_hf_loom"), 3);
  from_loom.checkpoint.initial_load_path = source + "/checkpoint/step-5";
  auto loom_losses = Trainer(from_loom).train().losses;
  ASSERT_EQ(hf_losses.size(), 3u);
  EXPECT_EQ(hf_losses, loom_losses);
  EXPECT_LT(hf_losses[0], straight_losses()[0] - 0.05);

  // The same weights described with another RoPE (transformers 5's layout, theta 10000): the
  // shapes fit the flavor, the arithmetic would not, and the import says what differs.
  const std::string other = loom::testing::fresh_temp_dir("ckpt_hf_other_rope");
  for (const auto& entry : fs::directory_iterator(source + "/checkpoint/step-5-hf")) {
    fs::copy_file(entry.path(), other + "/" + entry.path().filename().string());
  }
  auto config = nlohmann::json::parse(std::ifstream(other + "/config.json"));
  config.erase("rope_theta");
  config.erase("rope_scaling");
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  std::ofstream(other + "/config.json") << config.dump(1);
  auto mismatched = small_job(loom::testing::fresh_temp_dir("ckpt_hf_other_dst"), 3);
  mismatched.checkpoint.initial_load_path = other;
  mismatched.checkpoint.initial_load_in_hf = true;
  try {
    Trainer(mismatched).train();
    ADD_FAILURE() << "a Hugging Face folder with another RoPE was loaded into debugmodel";
  } catch (const loom::InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("describes another model than model.flavor 'debugmodel'"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("rope_theta: 10000.0 vs 500000.0"), std::string::npos) << message;
    EXPECT_NE(message.find("rope_scaling: null vs {"), std::string::npos) << message;
  }
}

namespace {

// The debug job on the embedded corpus (its loader state is global: it reshards when dp
// changes), one schedule of 20 steps whatever training.steps is.
std::string corpus_job(int steps) {
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --training.steps " +
         std::to_string(steps) +
         " --training.seq_len 16 --training.local_batch_size 4 --validation.enable false"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 7"
         " --lr_scheduler.warmup_steps 2 --lr_scheduler.total_steps 20"
         " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60"
         " --checkpoint.enable true --checkpoint.interval 5 --checkpoint.keep_latest_k 0"
         " --checkpoint.last_save_model_only false --checkpoint.async_mode async";
}

std::string corpus_job(const std::string& folder, int steps) {
  return corpus_job(steps) + " --job.dump_folder " + folder;
}

// One rank with 2 microbatches of 4 (the global batch of 2 ranks x 4), 20 steps with
// checkpoints every 5: the reference of the resharding tests and the step-10 checkpoint they
// resume from, run once for all of them.
const std::string& one_rank_global8() {
  static const std::string folder = loom::testing::shared_run(
      "ckpt_one_rank_global8", corpus_job(20) + " --training.global_batch_size 8");
  return folder;
}

std::vector<double> one_rank_global8_losses() {
  return loom::testing::logged_losses(one_rank_global8());
}

// `port`: a number, or "{port}" for shared_run to fill in.
std::string two_ranks(const std::string& job,
                      const std::string& port = std::to_string(loom::testing::free_port())) {
  return "launch --nproc-per-node 2 --master-port " + port + " -- " + job +
         " --parallelism.data_parallel_replicate_degree 2";
}

// 2-rank DDP, 20 steps with checkpoints every 5: the straight run of the bitwise resume test and
// the step-10 checkpoint of the 2 -> 1 resharding test, run once for both.
const std::string& two_rank_ddp_run() {
  static const std::string folder =
      loom::testing::shared_run("ckpt_ddp_straight", two_ranks(corpus_job(20), "{port}"));
  return folder;
}

std::vector<double> steps_11_to_20(const std::vector<double>& losses) {
  EXPECT_EQ(losses.size(), 20u);
  return losses.size() < 20 ? losses : std::vector<double>(losses.begin() + 10, losses.end());
}

std::vector<double> logged_losses(const std::string& folder) {
  return loom::testing::logged_losses(folder);
}

void run_ok(const std::string& args) {
  auto result = loom::testing::run_loom(args);
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

}  // namespace

LOOM_SLOW_TEST(CheckpointTraining, TwoRankDataParallelResumeIsBitwiseTheStraightRun) {
  const std::string& straight = two_rank_ddp_run();
  // Replicated tensors are written once: the two ranks split them.
  auto index =
      nlohmann::json::parse(loom::testing::read_text(straight + "/checkpoint/step-10/index.json"));
  EXPECT_EQ(index["files"].size(), 2u);
  for (const auto& [fqn, tensor] : index["tensors"].items()) {
    EXPECT_EQ(tensor["chunks"].size(), 1u) << fqn;
  }
  const std::string resumed = copy_of_checkpoint(straight, 10, "ckpt_ddp_resumed");
  run_ok(two_ranks(corpus_job(resumed, 20)));
  loom::testing::expect_losses_close(steps_11_to_20(logged_losses(straight)),
                                     logged_losses(resumed), 0.0, "resumed vs straight");
}

// Slow label: FsdpCheckpointsReshardIntoOneRankAndBack keeps 1 <-> 2 rank resharding in the
// default suite.
LOOM_SLOW_TEST(CheckpointTraining, CheckpointsResumeAcrossOneRankAndTwoRankDataParallel) {
  const auto want = steps_11_to_20(one_rank_global8_losses());
  auto expect_close = [&](const std::vector<double>& got, const char* what) {
    loom::testing::expect_losses_close(want, got, 1e-5, what);
  };
  // 1 rank -> 2 ranks.
  const std::string up = copy_of_checkpoint(one_rank_global8(), 10, "ckpt_1to2_resumed");
  run_ok(two_ranks(corpus_job(up, 20)));
  expect_close(logged_losses(up), "1 -> 2 ranks");
  // 2 ranks -> 1 rank.
  const std::string down = copy_of_checkpoint(two_rank_ddp_run(), 10, "ckpt_2to1_resumed");
  run_ok(corpus_job(down, 20) + " --training.global_batch_size 8");
  expect_close(logged_losses(down), "2 -> 1 rank");
}

LOOM_TEST(CheckpointTraining, SigtermToTwoRankJobSavesAndStopsCleanly) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_ddp_sigterm");
  // SIGTERM to the launcher once step 3 was logged; it forwards the signal to both ranks, which
  // finish the step, save and exit 143; the launcher reports the signal as torchrun does (143).
  auto result = loom::testing::run_command(
      std::string(LOOM_BINARY) + " " + two_ranks(corpus_job(folder, 400)) + " > " + folder +
      "/launch.log 2>&1 & pid=$!; for i in $(seq 1 600); do grep -q 'step:     3' " + folder +
      "/launch.log 2>/dev/null && break; sleep 0.1; done; kill -TERM $pid; wait $pid; rc=$?; cat " +
      folder + "/launch.log; exit $rc");
  EXPECT_EQ(result.exit_code, 143) << result.output;
  for (const char* rank : {"[rank0]", "[rank1]"}) {
    EXPECT_NE(result.output.find(std::string(rank) + " [train] warning: stopped at step "),
              std::string::npos)
        << rank << " did not stop cleanly\n"
        << result.output;
  }
  EXPECT_EQ(result.output.find("SIGKILL"), std::string::npos) << result.output;
  const auto steps = loom::checkpoint::complete_steps(folder + "/checkpoint");
  ASSERT_FALSE(steps.empty()) << result.output;
  const auto logged = logged_losses(folder);
  EXPECT_EQ(steps[0].first, static_cast<int64_t>(logged.size())) << "the save is the last step";
  EXPECT_LT(logged.size(), 400u);
  auto index = nlohmann::json::parse(loom::testing::read_text(steps[0].second + "/index.json"));
  EXPECT_FALSE(index["model_only"].get<bool>());
}

LOOM_TEST(CheckpointTraining, ExcludedPartsAreNotLoaded) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_exclude");
  Trainer(small_job(folder, 5)).train();
  // Without train_state the steps count from 1 again (5 steps run), with the loaded weights.
  auto job = small_job(folder, 5);
  job.checkpoint.exclude_from_loading = {"train_state", "lr_scheduler"};
  auto again = Trainer(job).train();
  ASSERT_EQ(again.losses.size(), 5u);
  EXPECT_LT(again.losses[0], straight_losses()[0] - 0.05);
  // Without train_state but with the schedule: the steps count from 1 again and the schedule goes
  // on from 5. Its checkpoints record the schedule's position (10 at step 5) and load (they were
  // refused: a position past the step).
  auto on_schedule = small_job(folder, 5);
  on_schedule.checkpoint.exclude_from_loading = {"train_state"};
  ASSERT_EQ(Trainer(on_schedule).train().losses.size(), 5u);
  const auto state = nlohmann::json::parse(
      loom::testing::read_text(folder + "/checkpoint/step-5/train_state.json"));
  EXPECT_EQ(state["lr_scheduler"]["step"], 10) << state.dump();
  EXPECT_EQ(Trainer(small_job(folder, 7)).train().losses.size(), 2u);
  auto bad = small_job(folder, 5);
  bad.checkpoint.exclude_from_loading = {"optimiser"};
  EXPECT_THROW(Trainer{bad}, loom::InputError);
}

// A resume that restarts the learning-rate schedule (exclude_from_loading lr_scheduler) trains
// steps 6-10 at schedule positions 1-5, and its checkpoints record those positions: resuming
// one continues the schedule where it was. train_state.json recorded the training step (10), so
// a resume of step 10 jumped the schedule 5 positions ahead.
LOOM_TEST(CheckpointTraining, ARestartedScheduleIsSavedWhereItIs) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_lr_restart");
  Trainer(small_job(folder, 5)).train();
  auto job = small_job(folder, 10);
  job.checkpoint.exclude_from_loading = {"lr_scheduler"};
  const auto restarted = Trainer(job).train();
  EXPECT_EQ(restarted.first_step, 6);
  const auto state = nlohmann::json::parse(
      loom::testing::read_text(folder + "/checkpoint/step-10/train_state.json"));
  EXPECT_EQ(state["step"], 10);
  EXPECT_EQ(state["lr_scheduler"]["step"], 5) << state.dump();
}

namespace {

// FSDP over 2 ranks: data_parallel_shard_degree -1 takes both ranks.
std::string two_ranks_fsdp(const std::string& job,
                           const std::string& port = std::to_string(loom::testing::free_port())) {
  return "launch --nproc-per-node 2 --master-port " + port + " -- " + job;
}

// FSDP x2, 20 steps with checkpoints every 5, run once for the two tests below.
const std::string& two_rank_fsdp_run() {
  static const std::string folder =
      loom::testing::shared_run("ckpt_fsdp_straight", two_ranks_fsdp(corpus_job(20), "{port}"));
  return folder;
}

}  // namespace

LOOM_TEST(CheckpointTraining, TwoRankFsdpResumeIsBitwiseTheStraightRun) {
  const std::string& straight = two_rank_fsdp_run();
  // Each rank wrote its dim-0 shard of every tensor: two chunks per parameter.
  auto index =
      nlohmann::json::parse(loom::testing::read_text(straight + "/checkpoint/step-10/index.json"));
  EXPECT_EQ(index["tensors"]["model.tok_embeddings.weight"]["chunks"].size(), 2u);
  const std::string resumed = copy_of_checkpoint(straight, 10, "ckpt_fsdp_resumed");
  run_ok(two_ranks_fsdp(corpus_job(resumed, 20)));
  loom::testing::expect_losses_close(steps_11_to_20(logged_losses(straight)),
                                     logged_losses(resumed), 0.0, "resumed vs straight");
}

LOOM_TEST(CheckpointTraining, FsdpCheckpointsReshardIntoOneRankAndBack) {
  const auto want = steps_11_to_20(one_rank_global8_losses());
  auto expect_close = [&](const std::vector<double>& got, const char* what) {
    loom::testing::expect_losses_close(want, got, 1e-5, what);
  };
  // FSDP x2 -> 1 rank (shards merged by overlap).
  const std::string down = copy_of_checkpoint(two_rank_fsdp_run(), 10, "ckpt_fsdp_2to1");
  run_ok(corpus_job(down, 20) + " --training.global_batch_size 8");
  expect_close(logged_losses(down), "FSDP x2 -> 1 rank");
  // 1 rank -> FSDP x2 (whole tensors cut into shards).
  const std::string up = copy_of_checkpoint(one_rank_global8(), 10, "ckpt_fsdp_1to2");
  run_ok(two_ranks_fsdp(corpus_job(up, 20)));
  expect_close(logged_losses(up), "1 rank -> FSDP x2");
}

namespace {

// Muon with Moonlight's lr rule; Newton-Schulz in float32, so that the last-bit differences of
// FSDP's reduce-scattered gradients are not rounded to bfloat16 (a one-rank run's and a sharded
// run's updates then agree to float32 precision).
const char* const kMuon =
    " --optimizer.name Muon --optimizer.muon_adjust_lr_fn match_rms_adamw"
    " --optimizer.muon_ns_dtype float32";

const std::string& muon_one_rank_run() {
  static const std::string folder = loom::testing::shared_run(
      "ckpt_muon_one_rank", corpus_job(20) + " --training.global_batch_size 8" + kMuon);
  return folder;
}

}  // namespace

// Muon under FSDP x2 (each hidden matrix gathered onto its owner rank, orthogonalized there and
// scattered back) trains like one rank over 20 steps; its checkpoint (momentum buffers for the
// matrices, AdamW's moments for the rest) resumes bitwise on one rank and reshards FSDP x2 -> 1.
// Slow label (five trainings, 1-3 minutes here); the thread-rank tests of loom_optim_tests keep
// distributed Muon in the default suite.
LOOM_SLOW_TEST(CheckpointTraining, MuonUnderFsdpTrainsLikeOneRankResumesAndReshards) {
  const auto one = logged_losses(muon_one_rank_run());
  ASSERT_EQ(one.size(), 20u);
  // 20 small steps at AdamW's lr (Moonlight's rule): Muon's matrices move about 0.2 lr per
  // element, so the loss falls slower than AdamW's here, but it falls.
  EXPECT_LT(one.back(), one.front() - 0.1) << "Muon did not train";
  const std::string fsdp = loom::testing::fresh_temp_dir("ckpt_muon_fsdp");
  run_ok(two_ranks_fsdp(corpus_job(fsdp, 20) + kMuon));
  loom::testing::expect_losses_close(one, logged_losses(fsdp), 1e-5, "Muon FSDP x2 vs 1 rank");
  auto index =
      nlohmann::json::parse(loom::testing::read_text(fsdp + "/checkpoint/step-10/index.json"));
  EXPECT_EQ(
      index["tensors"]["optimizer.momentum_buffer.layers.0.attention.wq.weight"]["chunks"].size(),
      2u);
  EXPECT_TRUE(index["tensors"].contains("optimizer.exp_avg.tok_embeddings.weight"));
  EXPECT_FALSE(index["tensors"].contains("optimizer.exp_avg.layers.0.attention.wq.weight"));
  // One rank, resumed at step 10: bitwise its straight run.
  const std::string resumed = copy_of_checkpoint(muon_one_rank_run(), 10, "ckpt_muon_resumed");
  run_ok(corpus_job(resumed, 20) + " --training.global_batch_size 8" + kMuon);
  loom::testing::expect_losses_close(steps_11_to_20(one), logged_losses(resumed), 0.0,
                                     "Muon resumed vs straight");
  // FSDP x2 -> 1 rank.
  const std::string down = copy_of_checkpoint(fsdp, 10, "ckpt_muon_fsdp_2to1");
  run_ok(corpus_job(down, 20) + " --training.global_batch_size 8" + kMuon);
  loom::testing::expect_losses_close(steps_11_to_20(one), logged_losses(down), 1e-5,
                                     "Muon FSDP x2 -> 1 rank");
  // Resuming Muon's checkpoint with AdamW is refused by name.
  const std::string other = copy_of_checkpoint(muon_one_rank_run(), 10, "ckpt_muon_to_adamw");
  auto refused = loom::testing::run_loom(corpus_job(other, 20) + " --training.global_batch_size 8");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("optimizer.name"), std::string::npos) << refused.output;
}

namespace {

// The model's and the optimizer's tensors of a one-rank checkpoint step.
std::map<std::string, at::Tensor> trained_state(const std::string& step_folder) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] :
       loom::checkpoint::load_safetensors(step_folder + "/rank-00000.safetensors").tensors) {
    if (name.rfind("model.", 0) == 0 || name.rfind("optimizer.", 0) == 0) out[name] = tensor;
  }
  return out;
}

}  // namespace

// training.skip_nonfinite_steps: a NaN in a gradient at step 3 (debug.nonfinite_gradient_steps)
// skips that step's update. Checkpoint step-3 holds step 2's model and optimizer tensors bit for
// bit, a run resumed from it trains steps 4-5 as the straight run did (the skipped step is not
// counted by the optimizer's bias correction), and metrics.jsonl counts the skip; for AdamW and
// Muon. With skipping off the run stops at step 3, before its checkpoint is written (the losses
// are read before every save); two in a row over a limit of 1 stop it too.
LOOM_TEST(CheckpointTraining, ANonFiniteGradientSkipsItsUpdateOrStopsTheRunBeforeASave) {
  for (const std::string optimizer : {"AdamW", "Muon"}) {
    const std::string folder = loom::testing::fresh_temp_dir("skip_nonfinite_" + optimizer);
    auto job = small_job(folder, 5);
    job.optimizer.name = optimizer;
    // With Muon, MuonClip too: a skipped step rescales no head either.
    if (optimizer == "Muon") job.optimizer.qk_clip_threshold = 0.5;
    job.checkpoint.interval = 1;
    job.training.skip_nonfinite_steps = 1;
    job.debug.nonfinite_gradient_steps = {3};
    const auto straight = Trainer(job).train();
    ASSERT_EQ(straight.grad_norms.size(), 5u) << optimizer;
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(std::isfinite(straight.grad_norms[i]), i != 2) << optimizer << " step " << i + 1;
    }
    const auto at2 = trained_state(folder + "/checkpoint/step-2");
    const auto at3 = trained_state(folder + "/checkpoint/step-3");
    const auto at4 = trained_state(folder + "/checkpoint/step-4");
    ASSERT_EQ(at2.size(), at3.size()) << optimizer;
    for (const auto& [name, tensor] : at2) {
      EXPECT_TRUE(at::equal(tensor, at3.at(name))) << optimizer << ": " << name;
    }
    EXPECT_FALSE(at::equal(at3.at("model.norm.weight"), at4.at("model.norm.weight"))) << optimizer;
    // The optimizer's step counts (its bias correction) did not count the skipped step.
    auto counts = [&](int step) {
      return nlohmann::json::parse(
          loom::testing::read_text(folder + "/checkpoint/step-" + std::to_string(step) +
                                   "/rank-00000.json"))["state"]["optimizer_step"];
    };
    EXPECT_EQ(counts(3), counts(2)) << optimizer;
    EXPECT_EQ(counts(3)["norm.weight"], 2) << optimizer;
    const auto rows = loom::testing::logged_rows(folder);
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows.back().value("skipped_steps", -1), 1) << rows.back().dump();

    auto resumed = small_job(copy_of_checkpoint(folder, 3, "skip_nonfinite_resumed"), 5);
    resumed.optimizer.name = optimizer;
    resumed.optimizer.qk_clip_threshold = job.optimizer.qk_clip_threshold;
    resumed.checkpoint.interval = 1;
    resumed.training.skip_nonfinite_steps = 1;
    expect_bitwise(straight.losses, 3, Trainer(resumed).train().losses);
  }

  const std::string stopped = loom::testing::fresh_temp_dir("skip_nonfinite_off");
  auto off = small_job(stopped, 5);
  off.checkpoint.interval = 3;  // step 3 is no logging step (log_freq 2)
  off.debug.nonfinite_gradient_steps = {3};
  const std::string off_error = loom::testing::input_error_of([&] { Trainer(off).train(); });
  EXPECT_NE(off_error.find("step 3: the gradient norm is nan"), std::string::npos) << off_error;
  EXPECT_TRUE(loom::checkpoint::complete_steps(stopped + "/checkpoint").empty());

  auto twice = small_job(loom::testing::fresh_temp_dir("skip_nonfinite_twice"), 5);
  twice.training.skip_nonfinite_steps = 1;
  twice.debug.nonfinite_gradient_steps = {3, 4};
  const std::string twice_error = loom::testing::input_error_of([&] { Trainer(twice).train(); });
  EXPECT_NE(twice_error.find("step 4: 2 steps in a row"), std::string::npos) << twice_error;
}
