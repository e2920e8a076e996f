// Elastic training through several `loom launch --nnodes 1:2` invocations on one machine, each
// standing for a node (nodes of LOOM_ELASTIC_NPROC workers: 1 in the default suite, so 2 -> 1
// and 1 -> 2 ranks; 2 in the "slow" label, so 4 -> 2 and 2 -> 4):
//  - shrink: the second node's launcher is SIGKILLed mid-run; the first re-forms the group
//    alone and finishes from the last complete checkpoint;
//  - grow: a node started mid-run is admitted at the next step boundary (the running workers
//    save a checkpoint) and the job finishes on both nodes.
// Both keep the global batch (accumulation adjusts), so every step's loss is within 1e-5 of an
// uninterrupted one-rank run with the same global batch. Every node holds LOOM_JOB_SECRET, so
// each store on the way sits behind the job secret's gate.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>

#include "support/metrics_log.h"
#include "support/process.h"

// Distinct suite names: ctest labels go by test name, so the two binaries must not share them.
#ifndef LOOM_ELASTIC_NPROC
#define LOOM_ELASTIC_NPROC 1
#define LOOM_ELASTIC_SUITE Elastic
#else
#define LOOM_ELASTIC_SUITE ElasticTwoRankNodes
#endif

namespace {

using loom::testing::fresh_temp_dir;
using loom::testing::losses_by_step;
constexpr int kSteps = 8;
constexpr int kNproc = LOOM_ELASTIC_NPROC;

// Global batch 8, local batch 2: accumulation 4 on 1 rank, 2 on 2 ranks, 1 on 4.
std::string job_without_folder() {
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --training.steps " +
         std::to_string(kSteps) +
         " --training.seq_len 32 --training.local_batch_size 2 --training.global_batch_size 8"
         " --validation.enable false --metrics.log_freq 1 --metrics.peak_tflops 1"
         " --debug.seed 7 --lr_scheduler.warmup_steps 2"
         " --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 30"
         " --comm.trace_buf_size 0 --checkpoint.enable true --checkpoint.interval 3"
         " --checkpoint.keep_latest_k 0 --checkpoint.last_save_model_only false";
}

std::string job(const std::string& folder) {
  return job_without_folder() + " --job.dump_folder " + folder;
}

// Every node's launcher holds the job's secret: the agents' store, its standbys and the workers'
// stores admit only processes that prove it (secured_store.h).
std::string node(int port) {
  return "LOOM_JOB_SECRET=" + std::string(64, 'e') + " " + LOOM_BINARY +
         " launch --nnodes 1:2 --nproc-per-node " + std::to_string(kNproc) +
         " --rdzv-endpoint 127.0.0.1:" + std::to_string(port) +
         " --rdzv-conf last_call_timeout=2,keep_alive_interval=0.5,keep_alive_max_attempt=2"
         " --max-restarts 1 --grace-period 60";
}

// One rank with the same global batch, run once for all the tests of this binary.
void expect_losses_match_one_rank(const std::string& elastic) {
  const auto want = losses_by_step(loom::testing::shared_run(
      "elastic_one_rank", job_without_folder() + " --checkpoint.enable false"));
  const auto got = losses_by_step(elastic);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
}

// Waits (up to 120 s) in the shell for `file` to contain `pattern`.
std::string wait_for(const std::string& file, const std::string& pattern) {
  return "for i in $(seq 1 1200); do grep -q '" + pattern + "' " + file +
         " 2>/dev/null && break; sleep 0.1; done; ";
}

}  // namespace

TEST(LOOM_ELASTIC_SUITE, KilledNodeShrinksTheGroupAndTrainingContinues) {
  const std::string folder = fresh_temp_dir("elastic_shrink");
  const std::string a = folder + "/a.log", b = folder + "/b.log";
  const int port = loom::testing::free_port();
  // Node A hosts the store; node B joins, and is killed (with its workers) after step 4.
  auto result = loom::testing::run_command(
      node(port) + " -- " + job(folder) + " > " + a + " 2>&1 & pa=$!; " +
      wait_for(a, "hosting the store") + node(port) + " -- " + job(folder) + " > " + b +
      " 2>&1 & pb=$!; " + wait_for(a, "step: *4 ") + "kill -KILL $pb; wait $pa; rc=$?; cat " + a +
      "; exit $rc");
  ASSERT_EQ(result.exit_code, 0) << result.output << loom::testing::read_text(b);
  EXPECT_NE(result.output.find("world size " + std::to_string(2 * kNproc) + " (node 0 of 2)"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("world size " + std::to_string(kNproc) + " (node 0 of 1)"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("resumed from " + folder + "/checkpoint/step-3 "), std::string::npos)
      << result.output;
  expect_losses_match_one_rank(folder);
}

TEST(LOOM_ELASTIC_SUITE, LateNodeIsAdmittedAtTheNextStepBoundary) {
  const std::string folder = fresh_temp_dir("elastic_grow");
  const std::string a = folder + "/a.log", b = folder + "/b.log";
  const int port = loom::testing::free_port();
  // Node A starts alone (after the last call) and trains; node B arrives after step 2.
  auto result = loom::testing::run_command(
      node(port) + " -- " + job(folder) + " > " + a + " 2>&1 & pa=$!; " + wait_for(a, "step: *2 ") +
      node(port) + " -- " + job(folder) + " > " + b +
      " 2>&1 & pb=$!; wait $pa; ra=$?; wait $pb; rb=$?; cat " + a + "; echo '--- node b'; cat " +
      b + "; exit $((ra + rb))");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("world size " + std::to_string(kNproc) + " (node 0 of 1)"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("re-forming the group (a node asks to join)"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("(node 1 of 2)"), std::string::npos) << result.output;
  expect_losses_match_one_rank(folder);
}

#if LOOM_ELASTIC_NPROC > 1
// The node hosting the rendezvous store (node A, which also leads the first round) is SIGKILLed
// after step 4: node B takes the store over at its standby address, re-forms the group alone
// and finishes from the last complete checkpoint, with the one-rank losses.
TEST(LOOM_ELASTIC_SUITE, KilledStoreHostIsTakenOverByTheSurvivor) {
  const std::string folder = fresh_temp_dir("elastic_store_host");
  const std::string a = folder + "/a.log", b = folder + "/b.log";
  const int port = loom::testing::free_port();
  auto result = loom::testing::run_command(
      node(port) + " -- " + job(folder) + " > " + a + " 2>&1 & pa=$!; " +
      wait_for(a, "hosting the store") + node(port) + " -- " + job(folder) + " > " + b +
      " 2>&1 & pb=$!; " + wait_for(a, "step: *4 ") + "kill -KILL $pa; wait $pb; rc=$?; cat " + b +
      "; exit $rc");
  ASSERT_EQ(result.exit_code, 0) << result.output << loom::testing::read_text(a);
  EXPECT_NE(result.output.find("took over the store"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("world size " + std::to_string(kNproc) + " (node 0 of 1)"),
            std::string::npos)
      << result.output;
  expect_losses_match_one_rank(folder);
}

// Preemption of one node (SIGTERM to its launcher): its workers finish the step and save, the
// launcher exits 143, and the other node re-forms the group alone from that checkpoint, losing
// nothing. (In the slow label only: the default suite covers SIGTERM and shrinking apart.)
TEST(LOOM_ELASTIC_SUITE, PreemptedNodeSavesAndTheOthersGoOnWithoutIt) {
  const std::string folder = fresh_temp_dir("elastic_preempt");
  const std::string a = folder + "/a.log", b = folder + "/b.log";
  const int port = loom::testing::free_port();
  auto result = loom::testing::run_command(
      node(port) + " -- " + job(folder) + " > " + a + " 2>&1 & pa=$!; " +
      wait_for(a, "hosting the store") + node(port) + " -- " + job(folder) + " > " + b +
      " 2>&1 & pb=$!; " + wait_for(a, "step: *4 ") +
      "kill -TERM $pb; wait $pb; rb=$?; wait $pa; ra=$?; cat " + a + "; echo \"b: $rb\"; exit $ra");
  ASSERT_EQ(result.exit_code, 0) << result.output << loom::testing::read_text(b);
  EXPECT_NE(result.output.find("b: 143"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("re-forming the group (another node left)"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("world size " + std::to_string(kNproc) + " (node 0 of 1)"),
            std::string::npos)
      << result.output;
  // The restart resumed from the step the preempted workers saved when they stopped (> 3).
  EXPECT_EQ(result.output.find("resumed from " + folder + "/checkpoint/step-3 "), std::string::npos)
      << result.output;
  expect_losses_match_one_rank(folder);
}
#endif

#if LOOM_ELASTIC_NPROC == 2
// `loom launch --replan-layout cpu`: the group starts on 4 ranks with the job's own layout; when
// a node is killed the 2 survivors train the layout the planner picks for 2 ranks (same global
// batch), resuming from the checkpoint.
TEST(LOOM_ELASTIC_SUITE, ShrunkGroupTrainsAReplannedLayout) {
  const std::string folder = fresh_temp_dir("elastic_replan");
  const std::string a = folder + "/a.log", b = folder + "/b.log";
  const int port = loom::testing::free_port();
  const std::string replan = " --replan-layout cpu";
  auto result = loom::testing::run_command(
      node(port) + replan + " -- " + job(folder) + " > " + a + " 2>&1 & pa=$!; " +
      wait_for(a, "hosting the store") + node(port) + replan + " -- " + job(folder) + " > " + b +
      " 2>&1 & pb=$!; " + wait_for(a, "step: *4 ") + "kill -KILL $pb; wait $pa; rc=$?; cat " + a +
      "; exit $rc");
  ASSERT_EQ(result.exit_code, 0) << result.output << loom::testing::read_text(b);
  EXPECT_NE(result.output.find("world size 2: training the layout --replan-layout planned"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("--training.global_batch_size 8"), std::string::npos)
      << result.output;
  EXPECT_EQ(losses_by_step(folder).size(), static_cast<size_t>(kSteps)) << result.output;
}
#endif
