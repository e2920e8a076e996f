// Data-parallel training end to end through `loom launch` (real processes over Gloo): 2 ranks
// (DDP and FSDP), 4 ranks (FSDP, HSDP) and a simulated 2-node job train exactly like 1 rank with
// the same global batch; a worker killed mid-run stops the job with the rank named.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/metrics_log.h"
#include "support/process.h"
#include "support/test_sets.h"

namespace {

using loom::testing::fresh_temp_dir;
using loom::testing::run_command;
using loom::testing::run_loom;

// The debug model on the embedded corpus, small enough for 20 steps in seconds.
std::string job_args(int steps) {
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --training.steps " +
         std::to_string(steps) +
         " --training.seq_len 32 --training.local_batch_size 4 --validation.enable false"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 7"
         " --lr_scheduler.warmup_steps 2 --comm.init_timeout_seconds 60"
         " --comm.train_timeout_seconds 30";
}

std::string job_args(const std::string& folder, int steps) {
  return job_args(steps) + " --job.dump_folder " + folder;
}

std::vector<double> losses(const std::string& folder) {
  return loom::testing::logged_losses(folder);
}

void expect_same_losses(const std::vector<double>& want, const std::vector<double>& got) {
  loom::testing::expect_losses_close(want, got, 1e-5, "data parallel vs 1 rank");
}

// Global batch 8 = 2 microbatches of 4 on one rank, as 2 ranks x 4 do in the tests. Run once
// for all the tests (ctest runs them as separate processes, side by side).
std::vector<double> single_rank_losses(const std::string& /*name*/) {
  return losses(
      loom::testing::shared_run("dp_one_rank", job_args(20) + " --training.global_batch_size 8"));
}

LOOM_TEST(DistributedTraining, TwoRankDataParallelMatchesOneRank) {
  const std::string folder = fresh_temp_dir("ddp_two");
  // Every rank's lines on the console (by default rank 1 shows only warnings and errors).
  auto result = run_loom("launch --nproc-per-node 2 --local-ranks-filter all --master-port " +
                         std::to_string(loom::testing::free_port()) + " -- " +
                         job_args(folder, 20) + " --parallelism.data_parallel_replicate_degree 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("[rank1]:"), std::string::npos) << "rank 1 did not run";
  // DDP sends 2·Ψ·(N−1)/N per step: Ψ = 7,212,288 float32 parameters (brown_bpe vocabulary),
  // plus a few bytes of loss, token-count and stop-flag all-reduces.
  std::ifstream metrics(folder + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  const double comm_mb = nlohmann::json::parse(last)["comm_mb"].get<double>();
  EXPECT_NEAR(comm_mb, 7212288.0 * 4 * 2 * 0.5 / 1e6, 0.001) << last;
  // Every step waits on its bucket all-reduces: a share of the step, never more than all of it.
  const double wait = nlohmann::json::parse(last)["comm_wait_pct"].get<double>();
  EXPECT_GT(wait, 0.0) << last;
  EXPECT_LE(wait, 100.0) << last;
  const auto want = single_rank_losses("ddp_two");
  ASSERT_EQ(want.size(), 20u);
  expect_same_losses(want, losses(folder));
}

// FSDP through the trainer: 2 ranks (reshard default), 4 ranks (reshard always, activation
// checkpointing) and HSDP 2 x 2 (reshard never) train like 1 rank with the same global batch
// of 8, so the reshard policies give the same losses too.
void expect_fsdp_matches_one_rank(const std::string& name, int ranks, const std::string& extra) {
  const std::string folder = fresh_temp_dir(name);
  auto result = run_loom("launch --nproc-per-node " + std::to_string(ranks) + " --master-port " +
                         std::to_string(loom::testing::free_port()) + " -- " +
                         job_args(folder, 20) + " --training.global_batch_size 8 " + extra);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("sharded over group"), std::string::npos) << result.output;
  const auto want = single_rank_losses(name);
  ASSERT_EQ(want.size(), 20u);
  expect_same_losses(want, losses(folder));
}

LOOM_TEST(DistributedTraining, TwoRankFsdpMatchesOneRank) {
  expect_fsdp_matches_one_rank("fsdp_two", 2, "");
}

// The layouts of the thread-rank tests Fsdp.FourRanksWithAnEmptyShard,
// ReshardAlwaysAndNeverMatchToo, ComposesWithActivationCheckpointingAndAccumulation and
// HybridShardingTwoByTwo, end to end.

LOOM_SLOW_TEST(DistributedTraining, FourRankFsdpWithCheckpointingMatchesOneRank) {
  expect_fsdp_matches_one_rank("fsdp_four", 4,
                               "--training.local_batch_size 2 "
                               "--parallelism.fsdp_reshard_after_forward always "
                               "--activation_checkpoint.mode full");
}

LOOM_SLOW_TEST(DistributedTraining, HsdpTwoByTwoMatchesOneRank) {
  expect_fsdp_matches_one_rank("hsdp", 4,
                               "--training.local_batch_size 2 "
                               "--parallelism.data_parallel_replicate_degree 2 "
                               "--parallelism.data_parallel_shard_degree 2 "
                               "--parallelism.fsdp_reshard_after_forward never");
}

// training.cuda_graph under the data-parallel wrappers (2 microbatches a step, so DDP's no_sync
// and FSDP's accumulation are inside the recorded step): the graphed path trains as the eager
// one bit for bit, and the byte counters -- which a real replay's collectives never touch --
// advance by the eager step's traffic on every replay. On CPU a replay runs the body again
// (debug.cuda_graph_on_cpu); the wrappers' host bookkeeping must end each step as it began.
LOOM_TEST(DistributedTraining, CudaGraphUnderDataParallelTrainsAsTheEagerStep) {
  for (const std::string layout : {"--parallelism.data_parallel_replicate_degree 2",
                                   "--parallelism.data_parallel_shard_degree 2"}) {
    auto run = [&](const std::string& name, const std::string& extra) {
      const std::string folder = fresh_temp_dir(name);
      auto result = run_loom(
          "launch --nproc-per-node 2 --master-port " + std::to_string(loom::testing::free_port()) +
          " -- " + job_args(folder, 4) +
          " --training.global_batch_size 8 --training.local_batch_size 2 " + layout + extra);
      EXPECT_EQ(result.exit_code, 0) << result.output;
      return std::make_pair(folder, result.output);
    };
    const auto [eager, eager_log] = run("graph_dp_eager", "");
    const auto [graphed, graphed_log] =
        run("graph_dp", " --training.cuda_graph true --debug.cuda_graph_on_cpu true");
    EXPECT_NE(graphed_log.find("the step is recorded"), std::string::npos) << graphed_log;
    loom::testing::expect_losses_close(losses(eager), losses(graphed), 0, layout);
    auto comm_mb = [](const std::string& folder) {
      std::vector<double> out;
      for (const auto& row : loom::testing::logged_rows(folder)) {
        if (row.contains("loss") && row.contains("comm_mb")) out.push_back(row["comm_mb"]);
      }
      return out;
    };
    const auto want = comm_mb(eager);
    ASSERT_EQ(want.size(), 4u) << layout;
    EXPECT_GT(want.back(), 1.0) << layout;
    EXPECT_EQ(comm_mb(graphed), want) << layout;
  }
}

// debug.force_fsdp: FSDP over a one-rank shard group (how one GPU runs FSDP's code paths).
LOOM_TEST(DistributedTraining, ForcedFsdpOnOneRankMatchesPlainTraining) {
  const std::string folder = fresh_temp_dir("fsdp_one");
  const std::string plain = fresh_temp_dir("fsdp_one_plain");
  auto result = run_loom(job_args(folder, 5) + " --debug.force_fsdp true");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("sharded over group"), std::string::npos) << result.output;
  ASSERT_EQ(run_loom(job_args(plain, 5)).exit_code, 0);
  expect_same_losses(losses(plain), losses(folder));
}

// bf16 all-gather and compute (float32 masters and reduce-scatter) on CPU: runs, and tracks the
// float32 losses of the same job.
LOOM_TEST(DistributedTraining, TwoRankFsdpInBfloat16TracksFloat32) {
  auto run = [](const std::string& name, const std::string& extra) {
    const std::string folder = fresh_temp_dir(name);
    auto result =
        run_loom("launch --nproc-per-node 2 --master-port " +
                 std::to_string(loom::testing::free_port()) + " -- " + job_args(folder, 3) + extra);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return std::make_pair(losses(folder), result.output);
  };
  const auto [bf16, output] = run("fsdp_bf16", " --training.mixed_precision_on_cpu true");
  EXPECT_NE(output.find("all-gather in BFloat16, reduce-scatter in Float"), std::string::npos)
      << output;
  const auto fp32 = run("fsdp_fp32", "").first;
  ASSERT_EQ(bf16.size(), 3u);
  ASSERT_EQ(fp32.size(), 3u);
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_NEAR(bf16[i], fp32[i], 0.02 * fp32[i]) << "step " << i + 1;
  }
  EXPECT_NE(bf16, fp32) << "the bfloat16 run computed in float32";
}

LOOM_TEST(DistributedTraining, TwoLaunchersWithTwoNodesFormOneJob) {
  const std::string folder = fresh_temp_dir("ddp_nodes");
  const std::string port = std::to_string(loom::testing::free_port());
  const std::string common = std::string(LOOM_BINARY) +
                             " launch --nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 "
                             "--master-port " +
                             port;
  const std::string job = job_args(folder, 20) + " --parallelism.data_parallel_replicate_degree 2";
  // Node 1 in the background, node 0 in the foreground; both must succeed.
  auto result = run_command("(" + common + " --node-rank 1 -- " + job + " > " + folder +
                            "/node1.log 2>&1; echo $? > " + folder + "/node1.rc) & " + common +
                            " --node-rank 0 -- " + job + "; rc=$?; wait; exit $rc");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(loom::testing::read_text(folder + "/node1.rc"), "0\n")
      << loom::testing::read_text(folder + "/node1.log");
  EXPECT_NE(loom::testing::read_text(folder + "/node1.log").find("rank 1 of 2 joined"),
            std::string::npos);
  expect_same_losses(single_rank_losses("ddp_nodes"), losses(folder));
}

// Seconds since midnight of the launcher's first log line containing `text`
// ("[2026-12-07 06:15:04.009] [launch node0] ..."), or -1.
double launcher_clock(const std::string& log, const std::string& text) {
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("[20", 0) != 0 || line.find("[launch") == std::string::npos ||
        line.find(text) == std::string::npos) {
      continue;
    }
    int h = 0, m = 0;
    double sec = 0;
    if (std::sscanf(line.c_str() + 12, "%d:%d:%lf", &h, &m, &sec) == 3)
      return h * 3600 + m * 60 + sec;
  }
  return -1;
}

LOOM_TEST(DistributedTraining, KilledWorkerStopsTheJobAndIsNamed) {
  const std::string folder = fresh_temp_dir("ddp_kill");
  // Kill global rank 1 once training is under way (its metrics line for step 2 was printed).
  const std::string killer =
      "for i in $(seq 1 600); do grep -q 'step:     2' " + folder +
      "/launch.log 2>/dev/null && break; sleep 0.1; done; "
      "for p in $(pgrep -f '" +
      folder +
      "'); do "
      "tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1 && kill -9 $p; done";
  const auto start = std::chrono::steady_clock::now();
  auto result = run_command(
      "(" + killer + ") & " + std::string(LOOM_BINARY) +
      " launch --nproc-per-node 2 --master-port " + std::to_string(loom::testing::free_port()) +
      " -- " + job_args(folder, 400) + " --parallelism.data_parallel_replicate_degree 2 > " +
      folder + "/launch.log 2>&1; rc=$?; wait; cat " + folder + "/launch.log; exit $rc");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("rank 1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("SIGKILL"), std::string::npos) << result.output;
  EXPECT_LT(seconds, 120) << "the launcher did not stop the surviving rank promptly";
  // The survivor's failed all-reduce dumps its flight recorder and waits up to 10 s for the
  // other ranks' dumps; the launcher's SIGTERM ends that wait, so the job ends right after the
  // kill was seen, not when the launcher's 10 s grace period runs out.
  const double seen = launcher_clock(result.output, "killed by signal SIGKILL");
  const double ended = launcher_clock(result.output, "error: job failed");
  ASSERT_GE(seen, 0) << result.output;
  ASSERT_GE(ended, 0) << result.output;
  EXPECT_LT(ended - seen, 5.0) << "the surviving rank outlived the kill by " << ended - seen
                               << " s\n"
                               << result.output;
}

}  // namespace

namespace {

// The same 2-rank job started by other launchers: PyTorch's torchrun (whose agent hosts the
// TCPStore) and SLURM's srun (simulated: each task gets SLURM_* variables and no RANK).
LOOM_TEST(DistributedTraining, RunsUnderTorchrun) {
  const std::string folder = fresh_temp_dir("ddp_torchrun");
  const std::string torchrun = std::string(LOOM_PYTHON_BIN_DIR) + "/torchrun";
  auto result =
      run_command(torchrun + " --nproc-per-node 2 --master-port " +
                  std::to_string(loom::testing::free_port()) + " --no-python " + LOOM_BINARY + " " +
                  job_args(folder, 3) + " --parallelism.data_parallel_replicate_degree 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("rank 1 of 2 joined"), std::string::npos) << result.output;
  EXPECT_EQ(losses(folder).size(), 3u);
}

LOOM_TEST(DistributedTraining, RunsUnderSlurmEnvironment) {
  const std::string folder = fresh_temp_dir("ddp_slurm");
  const std::string port = std::to_string(loom::testing::free_port());
  auto task = [&](int id) {
    return "env -u RANK -u WORLD_SIZE -u LOCAL_RANK SLURM_PROCID=" + std::to_string(id) +
           " SLURM_NTASKS=2 SLURM_LOCALID=" + std::to_string(id) +
           " SLURM_NODEID=0 SLURM_TASKS_PER_NODE=2 SLURM_JOB_NODELIST=localhost SLURM_JOB_ID=42"
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
           port + " " + LOOM_BINARY + " " + job_args(folder, 3) +
           " --parallelism.data_parallel_replicate_degree 2";
  };
  auto result = run_command("(" + task(1) + " > " + folder + "/task1.log 2>&1) & " + task(0) +
                            "; rc=$?; wait; cat " + folder + "/task1.log; exit $rc");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("slurm launch"), std::string::npos) << result.output;
  EXPECT_EQ(losses(folder).size(), 3u);
}

}  // namespace
