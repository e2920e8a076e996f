// Two jobs on one host never join each other: with a job training on a port, a second `loom
// launch` on that port, a stray rank of another run (torchrun's environment, another
// TORCHELASTIC_RUN_ID, the same LOOM_JOB_SECRET: users who export one secret for all their jobs)
// and a stranger without the secret each fail within 5 s with one line and no C++ stack trace,
// and the first job trains exactly like an undisturbed one; two --standalone jobs side by side
// both train.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "support/metrics_log.h"
#include "support/process.h"

using loom::testing::fresh_temp_dir;
using loom::testing::read_text;
using loom::testing::run_command;

namespace {

constexpr int kSteps = 12;

// The debug model, small and quick; the same on every job so their losses compare exactly.
std::string job_args(const std::string& folder) {
  return "train --config " LOOM_SOURCE_DIR "/configs/llama3_debug.toml --training.steps " +
         std::to_string(kSteps) +
         " --training.seq_len 32 --training.local_batch_size 4 --validation.enable false"
         " --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 7"
         " --comm.init_timeout_seconds 60"
         " --comm.train_timeout_seconds 60 --job.dump_folder " +
         folder;
}

std::string loom_line(const std::string& args, int timeout_s) {
  return "timeout -s KILL " + std::to_string(timeout_s) + " '" + LOOM_BINARY + "' " + args;
}

using loom::testing::contains;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// The lines starting with "error:" (main's one line for an exception), and no C++ backtrace.
std::vector<std::string> error_lines(const std::string& output) {
  EXPECT_FALSE(contains(output, "Exception raised from")) << output;
  EXPECT_FALSE(contains(output, "frame #")) << output;
  std::vector<std::string> errors;
  for (const std::string& line : lines_of(output)) {
    if (line.rfind("error:", 0) == 0) errors.push_back(line);
  }
  return errors;
}

// `name <exit code> <milliseconds>` as the script below prints it.
struct Outcome {
  int exit_code = -1;
  int ms = -1;
};

Outcome outcome(const std::string& output, const std::string& name) {
  Outcome o;
  for (const std::string& line : lines_of(output)) {
    std::istringstream in(line);
    std::string first_word;
    if (in >> first_word && first_word == name && in >> o.exit_code >> o.ms) return o;
  }
  return Outcome{};
}

// "run <id>," from the launcher's "starting 2 worker(s): ... run <id>, static rendezvous" line.
std::string run_id_in(const std::string& launcher_output) {
  const size_t at = launcher_output.find(", run ");
  if (at == std::string::npos) return "";
  const size_t from = at + 6;
  return launcher_output.substr(from, launcher_output.find(',', from) - from);
}

}  // namespace

// The first job and an undisturbed one to compare it with run side by side, both --standalone
// (each picks a free port); once the first trains, the others try its port.
TEST(LaunchCollisions, JobsSharingAPortFailAtOnceAndStandaloneJobsTrainUndisturbed) {
  const std::string dir = fresh_temp_dir("launch_collisions");
  const std::string first = dir + "/first", second = dir + "/second", stray = dir + "/stray";
  const std::string reference = dir + "/reference";
  // `timed NAME LOG command...`: runs it with its output in LOG, then prints "NAME <exit> <ms>".
  const std::string timed =
      "timed() { n=$1; f=$2; shift 2; t=$(date +%s%N); \"$@\" > \"$f\" 2>&1; c=$?; "
      "echo \"$n $c $((($(date +%s%N) - t) / 1000000))\"; }; ";
  // The training jobs run niced: the timings measure how fast loom refuses, not this test's
  // own load.
  const std::string secret = "LOOM_JOB_SECRET=" + std::string(64, 'a') + " ";
  const std::string standalone =
      secret + "nice -n 10 " + loom_line("launch --standalone --nproc-per-node 2 -- ", 300);
  const std::string start_both = standalone + job_args(first) + " > " + dir +
                                 "/first.log 2>&1 & A=$!; " + standalone + job_args(reference) +
                                 " > " + dir + "/reference.log 2>&1 & R=$!; ";
  // Rank 0 says it joined: the first job's store is up and its rendezvous over.
  const std::string wait_for_store = "for i in $(seq 1200); do grep -q 'joined at' " + dir +
                                     "/first.log && break; sleep 0.1; done; ";
  const std::string find_port = "P=$(sed -n 's/.*master 127.0.0.1:\\([0-9]*\\),.*/\\1/p' " + dir +
                                "/first.log | head -n 1); echo \"port $P\"; ";
  // What merely starting the binary costs right now (a loaded machine starts it slowly).
  const std::string time_startup =
      "timed startup " + dir + "/startup.log " + loom_line("--version", 60) + "; ";
  const std::string try_second =
      "timed second " + dir + "/second.log " +
      loom_line("launch --nproc-per-node 2 --master-port $P -- " + job_args(second), 60) + "; ";
  // A rank of another run started with this MASTER_PORT by some launcher (its own rank 0 is
  // not there: the first job's store is).
  const std::string rank_env =
      "env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
      "MASTER_PORT=$P TORCHELASTIC_RUN_ID=intruder ";
  const std::string try_stray = "timed stray " + dir + "/stray.log " + rank_env + secret +
                                loom_line(job_args(stray), 60) + "; ";
  // The same without the job's secret: the store's gate refuses it before it reads a key.
  const std::string try_stranger = "timed stranger " + dir + "/stranger.log " + rank_env +
                                   loom_line(job_args(dir + "/stranger"), 60) + "; ";
  // Had the first job ended already, the others would have found no store (and fail below).
  const std::string finish = "grep -q 'finished successfully' " + dir +
                             "/first.log && echo first ended early; "
                             "wait $A; echo \"first $? 0\"; wait $R; echo \"reference $? 0\"";
  const std::string script = timed + start_both + wait_for_store + find_port + time_startup +
                             try_second + try_stray + try_stranger + finish;
  auto result = run_command(script);
  std::cout << result.output;  // the timings, for the record

  const std::string first_log = read_text(dir + "/first.log");
  ASSERT_EQ(outcome(result.output, "first").exit_code, 0) << result.output << first_log;
  ASSERT_EQ(outcome(result.output, "reference").exit_code, 0)
      << result.output << read_text(dir + "/reference.log");
  ASSERT_FALSE(contains(result.output, "first ended early"))
      << "the first job finished before the others tried its port; raise kSteps\n"
      << result.output;
  // Under 5 s, as asked; on a machine so loaded that starting loom alone takes over 1.7 s,
  // within 3 such starts (no timeout is waited for either way: the original bug took 10 s).
  const int startup_ms = outcome(result.output, "startup").ms;
  ASSERT_GE(startup_ms, 0) << result.output;
  const int limit_ms = std::max(5000, 3 * startup_ms);
  const size_t port_at = result.output.find("port ");
  ASSERT_NE(port_at, std::string::npos) << result.output;
  const std::string port = lines_of(result.output.substr(port_at + 5)).at(0);
  ASSERT_FALSE(port.empty()) << first_log;

  // The second launch: refused by its launcher before any worker started, in one line.
  const std::string second_log = read_text(dir + "/second.log");
  const Outcome second_run = outcome(result.output, "second");
  EXPECT_EQ(second_run.exit_code, 2) << second_log;
  EXPECT_GE(second_run.ms, 0) << result.output;
  EXPECT_LT(second_run.ms, limit_ms) << second_log;
  EXPECT_EQ(lines_of(second_log).size(), 1u) << second_log;
  const auto second_errors = error_lines(second_log);
  ASSERT_EQ(second_errors.size(), 1u) << second_log;
  EXPECT_TRUE(contains(second_errors[0], "port " + port + " on 127.0.0.1 is already in use"))
      << second_log;
  EXPECT_TRUE(contains(second_errors[0], "--standalone")) << second_log;
  EXPECT_TRUE(contains(second_errors[0], "--master-port")) << second_log;

  // The stray rank reached the first job's store and was refused, naming both runs.
  const std::string stray_log = read_text(dir + "/stray.log");
  const Outcome stray_run = outcome(result.output, "stray");
  EXPECT_NE(stray_run.exit_code, 0) << stray_log;
  EXPECT_GE(stray_run.ms, 0) << result.output;
  EXPECT_LT(stray_run.ms, limit_ms) << stray_log;
  const std::string first_id = run_id_in(first_log);
  ASSERT_EQ(first_id.size(), 16u) << first_log;
  const auto stray_errors = error_lines(stray_log);
  ASSERT_EQ(stray_errors.size(), 1u) << stray_log;
  EXPECT_TRUE(contains(stray_errors[0], "the rendezvous store at 127.0.0.1:" + port +
                                            " belongs to run '" + first_id +
                                            "' (this job is run 'intruder')"))
      << stray_log;
  const std::string stranger_log = read_text(dir + "/stranger.log");
  const Outcome stranger_run = outcome(result.output, "stranger");
  EXPECT_NE(stranger_run.exit_code, 0) << stranger_log;
  EXPECT_GE(stranger_run.ms, 0) << result.output;
  EXPECT_LT(stranger_run.ms, limit_ms) << stranger_log;
  const auto stranger_errors = error_lines(stranger_log);
  ASSERT_EQ(stranger_errors.size(), 1u) << stranger_log;
  EXPECT_TRUE(contains(stranger_errors[0], "the rendezvous store at 127.0.0.1:" + port +
                                               " admits only workers holding the job secret"))
      << stranger_log;

  // None disturbed the first job: the losses of the undisturbed run, step by step, bitwise.
  const auto want = loom::testing::logged_losses(reference);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  loom::testing::expect_losses_close(want, loom::testing::logged_losses(first), 0.0,
                                     "first job vs undisturbed run");
  EXPECT_NE(run_id_in(read_text(dir + "/reference.log")), first_id);  // a fresh id per launch
}
