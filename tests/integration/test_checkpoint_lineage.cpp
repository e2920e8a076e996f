// Which checkpoint a run goes on from: the last one saved, not the highest step (a run resumed
// from an older step with load_step), and a full one before a weights-only last save (a run
// extended past its end); leftovers of a stopped save removed or put in place; the seed of a run
// without debug.seed; a fallback that keeps nothing of the step that failed, and none for a step
// the job cannot follow.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loom/checkpoint/manager.h"
#include "loom/core/check.h"
#include "loom/train/trainer.h"
#include "support/errors.h"
#include "support/jobs.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

namespace fs = std::filesystem;
using loom::config::JobConfig;
using loom::train::Trainer;

JobConfig lineage_job(const std::string& folder, int64_t steps) {
  JobConfig c = loom::testing::small_job(folder, {4, 32, steps, 3, 10, 11});
  c.lr_scheduler.total_steps = 20;  // one schedule whatever the run's length
  c.checkpoint.enable = true;
  c.checkpoint.interval = 4;
  c.checkpoint.last_save_model_only = false;
  c.checkpoint.keep_latest_k = 0;
  return c;
}

std::vector<double> straight_losses(const std::string& name, int64_t steps) {
  auto c = lineage_job(loom::testing::fresh_temp_dir(name), steps);
  c.checkpoint.enable = false;
  return Trainer(c).train().losses;
}

}  // namespace

// A: steps 1-12 (saves 4, 8, 12). B: back to step 4 (load_step), on to 8 (its own step-8 replaces
// A's). C, with no load_step: goes on from B's step 8, the last saved; it took A's step 12 (an
// abandoned line) when the highest step was the newest. Were B's step 8 unreadable, C would fall
// back to step 4, its parent, before A's step 12. When C starts, a step folder left without its
// COMPLETE marker is removed, and a complete step-N.tmp (stopped before its rename) is put in
// place.
LOOM_TEST(CheckpointLineage, ARunResumedFromAnOlderStepGoesOnFromItsOwnSaves) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_lineage_rollback");
  Trainer(lineage_job(folder, 12)).train();
  auto back = lineage_job(folder, 8);
  back.checkpoint.load_step = 4;
  ASSERT_EQ(Trainer(back).train().losses.size(), 4u);
  const std::string checkpoints = folder + "/checkpoint";
  const auto order = loom::checkpoint::complete_steps(checkpoints);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0].first, 8);
  EXPECT_EQ(order[1].first, 4) << "B's step 8 descends from step 4";
  EXPECT_EQ(order[2].first, 12) << "A's step 12 is of an abandoned line";
  // A save stopped between its rename and its marker.
  fs::copy(checkpoints + "/step-8", checkpoints + "/step-6", fs::copy_options::recursive);
  fs::remove(checkpoints + "/step-6/COMPLETE");
  // A save that stopped after its marker, before its rename (B's step 8 re-did A's).
  fs::rename(checkpoints + "/step-8", checkpoints + "/step-8.tmp");
  const auto on = Trainer(lineage_job(folder, 12)).train();
  ASSERT_EQ(on.losses.size(), 4u) << "steps 9-12 after B's step 8";
  // B's line is A's (the same data and seed): C's steps equal A's straight run.
  const auto want = straight_losses("ckpt_lineage_straight", 12);
  for (size_t i = 0; i < on.losses.size(); ++i) EXPECT_EQ(on.losses[i], want[8 + i]) << i;
  EXPECT_FALSE(fs::exists(checkpoints + "/step-6")) << "the step without COMPLETE stays";
}

// A run of 10 steps saves step 5 in full and step 10 weights only (last_save_model_only).
// Extended to 14 steps, it goes on from step 5 with its optimizer and data (it started over from
// step 0 with step 10's weights and a fresh optimizer).
LOOM_TEST(CheckpointLineage, AnExtendedRunGoesOnFromItsNewestFullCheckpoint) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_lineage_extend");
  auto first = lineage_job(folder, 10);
  first.checkpoint.interval = 5;
  first.checkpoint.last_save_model_only = true;
  Trainer(first).train();
  const std::string checkpoints = folder + "/checkpoint";
  EXPECT_TRUE(loom::checkpoint::saved_step_facts(checkpoints + "/step-10").model_only);
  ASSERT_TRUE(loom::checkpoint::is_complete_step(checkpoints + "/step-5"));
  const auto order = loom::checkpoint::resume_order(checkpoints);
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0].first, 5);
  auto extended = lineage_job(folder, 14);
  extended.checkpoint.interval = 5;
  const auto on = Trainer(extended).train();
  ASSERT_EQ(on.losses.size(), 9u) << "steps 6-14 after step 5";
  const auto want = straight_losses("ckpt_lineage_extend_straight", 14);
  for (size_t i = 0; i < on.losses.size(); ++i) EXPECT_EQ(on.losses[i], want[5 + i]) << i;
}

// Two ranks without debug.seed (torchtitan's default): the first rank draws the seed, every rank
// takes it, and the checkpoints record it. The ranks shuffle the corpus alike, and the run resumes
// (each rank used to draw its own seed on every start, and the data loader refused the saved state
// of another seed). Step 4 is left complete in step-4.tmp (stopped before its rename): rank 0 puts
// it in place at start and both ranks resume from it (rank 1 used to list the folder before the
// rename and resume from step 2; then the ranks trained different steps and hung).
LOOM_TEST(CheckpointLineage, TwoRanksWithoutASeedResumeTogetherWithTheSeedTheyDrew) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_lineage_unseeded");
  std::string toml = loom::testing::read_text(LOOM_SOURCE_DIR "/configs/llama3_debug.toml");
  const auto seed_line = toml.find("\nseed = 42\n");
  ASSERT_NE(seed_line, std::string::npos);
  toml.erase(seed_line, std::string("\nseed = 42").size());
  std::ofstream(folder + "/job.toml") << toml;
  auto train = [&](int steps) {
    return loom::testing::run_loom(
        "launch --nproc-per-node 2 --local-ranks-filter all --master-port " +
        std::to_string(loom::testing::free_port()) + " -- train --config " + folder +
        "/job.toml --job.dump_folder " + folder + " --training.steps " + std::to_string(steps) +
        " --training.seq_len 32 --training.local_batch_size 2 --training.global_batch_size 4"
        " --validation.enable false --checkpoint.enable true --checkpoint.interval 2"
        " --checkpoint.last_save_model_only false --comm.train_timeout_seconds 30 2>&1");
  };
  const auto first = train(4);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string step = folder + "/checkpoint/step-4/";
  const auto state = nlohmann::json::parse(loom::testing::read_text(step + "train_state.json"));
  ASSERT_TRUE(state.contains("seed"));
  for (const char* rank : {"rank-00000.json", "rank-00001.json"}) {
    const auto part = nlohmann::json::parse(loom::testing::read_text(step + rank));
    EXPECT_EQ(part["state"]["dataloader"]["seed"], state["seed"]) << rank;
  }
  fs::rename(folder + "/checkpoint/step-4", folder + "/checkpoint/step-4.tmp");
  const auto resumed = train(6);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("the checkpoint's: debug.seed is unset"), std::string::npos)
      << resumed.output;
  for (const char* rank : {"[rank0]", "[rank1]"}) {
    const auto line = resumed.output.find(std::string(rank) + " [checkpoint] info: resumed from");
    ASSERT_NE(line, std::string::npos) << rank << "\n" << resumed.output;
    EXPECT_NE(resumed.output.substr(line, 200).find("(step 4,"), std::string::npos)
        << resumed.output.substr(line, 200);
  }
}

// A full step 4 whose RNG state is damaged (found unreadable only after its optimizer and data
// loader loaded): the run falls back to step 2 and trains exactly as a run resumed from step 2
// alone; it kept nothing of step 4 (its optimizer moments, data position). With only a seed
// (step-0, weights only) beside a damaged full step, the run stops instead: falling back would
// start over at step 1 and replace the full checkpoint, which a passing failure must not cost.
LOOM_TEST(CheckpointLineage, AFallbackKeepsNothingOfTheStepThatFailedAndNeverFallsToWeightsOnly) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_lineage_fallback");
  const std::string reference = loom::testing::fresh_temp_dir("ckpt_lineage_fallback_ref");
  auto damage_rng = [](const std::string& step_folder) {
    const std::string part = step_folder + "/rank-00000.json";
    auto j = nlohmann::json::parse(loom::testing::read_text(part));
    j["state"]["rng"]["cpu"].erase(0);
    std::ofstream(part) << j.dump();
  };
  for (const std::string& dump : {folder, reference}) {
    auto first = lineage_job(dump, 4);
    first.checkpoint.interval = 2;
    Trainer(first).train();
  }
  damage_rng(folder + "/checkpoint/step-4");
  fs::remove_all(reference + "/checkpoint/step-4");
  const auto fell_back = Trainer(lineage_job(folder, 6)).train();
  const auto from_two = Trainer(lineage_job(reference, 6)).train();
  ASSERT_EQ(fell_back.losses.size(), 4u);
  ASSERT_EQ(from_two.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(fell_back.losses[i], from_two.losses[i]) << i;

  const std::string seeded = loom::testing::fresh_temp_dir("ckpt_lineage_seed_only");
  auto seed = lineage_job(seeded, 4);
  seed.checkpoint.create_seed_checkpoint = true;
  Trainer(seed).train();
  auto full = lineage_job(seeded, 2);
  full.checkpoint.interval = 2;
  Trainer(full).train();
  damage_rng(seeded + "/checkpoint/step-2");
  const std::string error =
      loom::testing::input_error_of([&] { Trainer(lineage_job(seeded, 4)).train(); });
  EXPECT_NE(error.find("step-2"), std::string::npos) << error;
  EXPECT_NE(error.find("checkpoint.load_step = 0"), std::string::npos) << error;
  EXPECT_TRUE(fs::exists(seeded + "/checkpoint/step-2/COMPLETE")) << "the full step is kept";
}

// A step this job cannot follow (another optimizer) stops the load at once: an older step would
// not fit either, and falling back to it discarded the newer steps' work. The steps' config.toml
// removed (checkpoints from before it was saved), so that the config comparison, which names
// such a change before any load, cannot.
LOOM_TEST(CheckpointLineage, ACheckpointTheJobCannotFollowStopsWithoutFallingBack) {
  const std::string folder = loom::testing::fresh_temp_dir("ckpt_lineage_incompatible");
  auto first = lineage_job(folder, 4);
  first.checkpoint.interval = 2;
  Trainer(first).train();
  for (const char* step : {"/step-2", "/step-4"})
    fs::remove(folder + "/checkpoint" + step + "/config.toml");
  auto muon = lineage_job(folder, 6);
  muon.optimizer.name = "Muon";
  try {
    Trainer(muon).train();
    FAIL() << "an AdamW checkpoint resumed under Muon";
  } catch (const loom::InputError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("step-4"), std::string::npos) << text;
    EXPECT_NE(text.find("not falling back"), std::string::npos) << text;
  }
}
