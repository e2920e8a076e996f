// `loom launch` end to end: the env contract, console filtering, log files, failure handling,
// restarts, signal forwarding and a two-node job simulated on one machine. Workers are small
// shell commands (--no-python); every launcher runs under `timeout` so a bug cannot hang ctest.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include "support/process.h"

using loom::testing::CommandResult;
using loom::testing::fresh_temp_dir;
using loom::testing::read_text;
using loom::testing::run_command;

namespace {

using loom::testing::contains;

// A port nobody listens on right now (each test takes its own).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The command line of `loom launch <options> --no-python -- sh -c <script>`, under a timeout
// unless timeout_s is 0.
std::string launch_line(const std::string& options, const std::string& script, int timeout_s = 60) {
  const std::string timeout =
      timeout_s > 0 ? "timeout -s KILL " + std::to_string(timeout_s) + " " : "";
  return timeout + "'" + LOOM_BINARY + "' launch " + options + " --no-python -- sh -c " +
         quoted(script);
}

// Runs a shell script (which starts a launcher in the background and signals it) under a timeout,
// with all of its output captured.
CommandResult run_script(const std::string& script) {
  return run_command("timeout -s KILL 60 sh -c " + quoted("{ " + script + "; } 2>&1"));
}

CommandResult launch(const std::string& options, const std::string& script) {
  return run_command(launch_line(options, script));
}

const char* kPrintEnv =
    "echo \"RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "
    "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR "
    "MASTER_PORT=$MASTER_PORT TORCHELASTIC_RESTART_COUNT=$TORCHELASTIC_RESTART_COUNT "
    "OMP_NUM_THREADS=$OMP_NUM_THREADS\"";

std::string env_line(int rank, int local_rank, int world, int local_world, int group, int port,
                     const std::string& omp) {
  return "[rank" + std::to_string(rank) + "]: RANK=" + std::to_string(rank) +
         " LOCAL_RANK=" + std::to_string(local_rank) + " WORLD_SIZE=" + std::to_string(world) +
         " LOCAL_WORLD_SIZE=" + std::to_string(local_world) +
         " GROUP_RANK=" + std::to_string(group) +
         " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
         " TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=" + omp + "\n";
}

// Running (a zombie waiting for a parent that never reaps counts as dead).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

}  // namespace

TEST(Launch, WorkersGetTheTorchrunEnvironment) {
  const int port = free_port();
  // ctest sets OMP_NUM_THREADS=1; unset it to see the launcher's own default.
  auto result = run_command(
      "env -u OMP_NUM_THREADS " +
      launch_line("--nproc-per-node 2 --master-port " + std::to_string(port), kPrintEnv));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // Each of the 2 workers gets half the CPUs this process may use (at least 1).
  cpu_set_t cpus;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const std::string share = std::to_string(std::max(1, CPU_COUNT(&cpus) / 2));
  EXPECT_TRUE(contains(result.output, env_line(0, 0, 2, 2, 0, port, share))) << result.output;
  EXPECT_TRUE(contains(result.output, env_line(1, 1, 2, 2, 0, port, share))) << result.output;
  EXPECT_TRUE(contains(result.output, "OMP_NUM_THREADS is not set: setting it to " + share))
      << result.output;

  // A value the user set is kept.
  auto kept = run_command(
      "OMP_NUM_THREADS=3 " +
      launch_line("--nproc-per-node 2 --master-port " + std::to_string(port), kPrintEnv));
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  EXPECT_TRUE(contains(kept.output, env_line(1, 1, 2, 2, 0, port, "3"))) << kept.output;
}

TEST(Launch, RdzvEndpointSetsMasterAddressAndPort) {
  const int port = free_port();
  auto result =
      launch("--nproc_per_node=1 --rdzv-endpoint 127.0.0.1:" + std::to_string(port), kPrintEnv);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, env_line(0, 0, 1, 1, 0, port, "1"))) << result.output;
}

// TORCHELASTIC_RUN_ID: the job's identity in the rendezvous store (ranks refuse another run's).
TEST(Launch, WorkersShareTheRunId) {
  const char* print_id = "echo id=$TORCHELASTIC_RUN_ID";
  auto named = launch(
      "--nproc-per-node 2 --rdzv-id job-7 --master-port " + std::to_string(free_port()), print_id);
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_TRUE(contains(named.output, "[rank0]: id=job-7\n")) << named.output;
  EXPECT_TRUE(contains(named.output, "[rank1]: id=job-7\n")) << named.output;
  EXPECT_TRUE(contains(named.output, ", run job-7, static rendezvous")) << named.output;

  // Without --rdzv-id, each launch makes a fresh one that all its workers share.
  auto id_of = [](const std::string& output, int rank) {
    const std::string tag = "[rank" + std::to_string(rank) + "]: id=";
    const size_t at = output.find(tag);
    return at == std::string::npos
               ? std::string()
               : output.substr(at + tag.size(), output.find('\n', at) - at - tag.size());
  };
  auto fresh = launch("--nproc-per-node 2 --master-port " + std::to_string(free_port()), print_id);
  auto again = launch("--nproc-per-node 2 --master-port " + std::to_string(free_port()), print_id);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(id_of(fresh.output, 0).size(), 16u) << fresh.output;
  EXPECT_EQ(id_of(fresh.output, 0), id_of(fresh.output, 1)) << fresh.output;
  EXPECT_NE(id_of(fresh.output, 0), id_of(again.output, 0)) << again.output;
}

TEST(Launch, WithoutNoPythonWorkersRunTheLoomBinary) {
  auto result = run_command("timeout -s KILL 60 '" + std::string(LOOM_BINARY) +
                            "' launch --nproc-per-node 2 --master-port " +
                            std::to_string(free_port()) + " -- --version");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: loom 0.")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: loom 0.")) << result.output;
}

TEST(Launch, LocalRanksFilterShowsOnlyChosenRanks) {
  auto result = launch(
      "--nproc-per-node 3 --local-ranks-filter 0,2 --master-port " + std::to_string(free_port()),
      "echo out of $RANK; echo err of $RANK >&2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int rank : {0, 2}) {
    const std::string r = std::to_string(rank);
    EXPECT_TRUE(contains(result.output, "[rank" + r + "]: out of " + r + "\n")) << result.output;
    EXPECT_TRUE(contains(result.output, "[rank" + r + "]: err of " + r + "\n")) << result.output;
  }
  EXPECT_FALSE(contains(result.output, "[rank1]")) << result.output;
  EXPECT_FALSE(contains(result.output, "out of 1")) << result.output;
  EXPECT_FALSE(contains(result.output, "err of 1")) << result.output;
}

TEST(Launch, LogDirWritesOneFilePerRankAndKeepsPartialLines) {
  const std::string dir = fresh_temp_dir("launch_log_dir");
  auto result = launch("--nproc-per-node 2 --log-dir " + quoted(dir) + " --master-port " +
                           std::to_string(free_port()),
                       "echo line one of $RANK; echo to stderr >&2; printf 'no newline'");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int rank : {0, 1}) {
    const std::string r = std::to_string(rank);
    // stdout and stderr come through separate pipes: their relative order is not kept.
    const std::string log = read_text(dir + "/attempt_0/rank_" + r + ".log");
    EXPECT_EQ(log.size(), std::string("line one of 0\nto stderr\nno newline\n").size()) << log;
    EXPECT_EQ(log.rfind("line one of " + r + "\n", 0), 0u) << log;
    EXPECT_TRUE(contains(log, "\nto stderr\n")) << log;
    EXPECT_TRUE(contains(log, "\nno newline\n")) << log;
    EXPECT_TRUE(contains(result.output, "[rank" + r + "]: no newline\n")) << result.output;
  }
}

TEST(Launch, KilledWorkerStopsTheOthersAndIsNamed) {
  const std::string dir = fresh_temp_dir("launch_killed");
  const auto start = std::chrono::steady_clock::now();
  // Every rank records its background sleep's pid, so the test can check nothing survives.
  auto result = launch("--nproc-per-node 3 --log-dir " + quoted(dir) + " --master-port " +
                           std::to_string(free_port()),
                       "sleep 30 & echo $! > " + quoted(dir) +
                           "/sleep_$RANK; if [ $RANK = 1 ]; then sleep 0.5; kill -9 $$; fi; wait");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 128 + SIGKILL) << result.output;
  EXPECT_LT(seconds, 15.0) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 (local rank 1 on node 0) killed by signal SIGKILL"))
      << result.output;
  EXPECT_TRUE(contains(result.output, dir + "/attempt_0/rank_1.log")) << result.output;
  for (int rank : {0, 1, 2}) {
    const std::string pid_text = read_text(dir + "/sleep_" + std::to_string(rank));
    ASSERT_FALSE(pid_text.empty()) << "rank " << rank << " did not start";
    const pid_t pid = std::stoi(pid_text);
    // Orphans are reaped by init; give it a moment.
    for (int i = 0; i < 50 && process_alive(pid); ++i) ::usleep(100 * 1000);
    EXPECT_FALSE(process_alive(pid)) << "rank " << rank << "'s child survived";
  }
}

TEST(Launch, FailedWorkerExitCodeIsPropagated) {
  auto result = launch("--nproc-per-node 2 --master-port " + std::to_string(free_port()),
                       "if [ $RANK = 0 ]; then exit 3; fi; sleep 30");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_TRUE(contains(result.output,
                       "job failed: rank 0 (local rank 0 on node 0) exited with "
                       "code 3; its output is above, prefixed '[rank0]: '"))
      << result.output;
}

TEST(Launch, MaxRestartsRestartsTheGroup) {
  const std::string dir = fresh_temp_dir("launch_restarts");
  auto result = launch("--nproc-per-node 2 --max-restarts 2 --log-dir " + quoted(dir) +
                           " --master-port " + std::to_string(free_port()),
                       "echo attempt $TORCHELASTIC_RESTART_COUNT; "
                       "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 4; fi; "
                       "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then sleep 30; fi");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 (local rank 1 on node 0) exited with code 4"))
      << result.output;
  EXPECT_TRUE(
      contains(result.output, "restarting the worker group in 1.0 s (1 of at most 2 restarts)"))
      << result.output;
  EXPECT_EQ(read_text(dir + "/attempt_0/rank_1.log"), "attempt 0\n");
  EXPECT_EQ(read_text(dir + "/attempt_1/rank_0.log"), "attempt 1\n");
  EXPECT_EQ(read_text(dir + "/attempt_1/rank_1.log"), "attempt 1\n");
  EXPECT_FALSE(contains(result.output, "restart 2 of")) << result.output;

  auto exhausted =
      launch("--nproc-per-node 1 --max-restarts 1 --master-port " + std::to_string(free_port()),
             "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 5");
  EXPECT_EQ(exhausted.exit_code, 5) << exhausted.output;
  EXPECT_TRUE(contains(exhausted.output, "[rank0]: attempt 1")) << exhausted.output;
  EXPECT_TRUE(contains(exhausted.output, "job failed after 1 restart(s): rank 0"))
      << exhausted.output;

  // Exit 2 (a config or input error) is not retried: it would fail the same way.
  auto input_error =
      launch("--nproc-per-node 1 --max-restarts 3 --master-port " + std::to_string(free_port()),
             "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 2");
  EXPECT_EQ(input_error.exit_code, 2) << input_error.output;
  EXPECT_TRUE(contains(input_error.output, "not restarting: exit 2 is an input error"))
      << input_error.output;
  EXPECT_FALSE(contains(input_error.output, "attempt 1")) << input_error.output;
}

TEST(Launch, SigtermIsForwardedToWorkers) {
  const std::string dir = fresh_temp_dir("launch_sigterm");
  const std::string worker = "trap 'echo got TERM; exit 0' TERM; touch " + quoted(dir) +
                             "/ready_$RANK; while true; do sleep 0.1; done";
  // Start the launcher in the background, wait until both workers are ready, send SIGTERM.
  const std::string script =
      launch_line("--nproc-per-node 2 --master-port " + std::to_string(free_port()), worker, 0) +
      " & P=$!; for i in $(seq 300); do [ -e " + quoted(dir + "/ready_0") + " ] && [ -e " +
      quoted(dir + "/ready_1") + " ] && break; sleep 0.1; done; kill -TERM $P; wait $P; " +
      "echo launcher exit $?";
  auto result = run_script(script);
  EXPECT_TRUE(contains(result.output, "received SIGTERM: forwarding it to the workers"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "[rank0]: got TERM")) << result.output;
  EXPECT_TRUE(contains(result.output, "[rank1]: got TERM")) << result.output;
  EXPECT_TRUE(contains(result.output, "launcher exit 143")) << result.output;
}

// Starts a launcher whose single worker ignores SIGTERM, sends it `signals` (kill arguments, in
// turn), and returns the output with "launcher exit <code> after <ms> ms" at the end.
CommandResult signal_stubborn_worker(const std::string& name, const std::string& grace,
                                     const std::vector<std::string>& signals) {
  const std::string dir = fresh_temp_dir(name);
  const std::string worker = "trap 'echo ignoring TERM' TERM; touch " + quoted(dir) +
                             "/ready_$RANK; while true; do sleep 0.1; done";
  std::string script = launch_line("--nproc-per-node 1 --grace-period " + grace +
                                       " --master-port " + std::to_string(free_port()),
                                   worker, 0) +
                       " & P=$!; for i in $(seq 300); do [ -e " + quoted(dir + "/ready_0") +
                       " ] && break; sleep 0.1; done; T0=$(date +%s%N)";
  for (const std::string& signal : signals) script += "; kill " + signal + " $P; sleep 0.2";
  script += "; wait $P; echo launcher exit $? after $((($(date +%s%N) - T0) / 1000000)) ms";
  return run_script(script);
}

int reported_ms(const std::string& output) {
  const size_t at = output.find(" after ", output.find("launcher exit"));
  return at == std::string::npos ? -1 : std::stoi(output.substr(at + 7));
}

// A repeated SIGTERM (a scheduler signals the launcher again) does not cut the grace period:
// the workers' stop checkpoint needs it.
TEST(Launch, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  auto result = signal_stubborn_worker("launch_grace", "1", {"-TERM", "-TERM"});
  EXPECT_TRUE(contains(result.output, "[rank0]: ignoring TERM")) << result.output;
  EXPECT_TRUE(contains(result.output, "launcher exit 143 after")) << result.output;
  const int ms = reported_ms(result.output);
  EXPECT_GE(ms, 1000) << result.output;
  EXPECT_LT(ms, 10000) << result.output;
}

TEST(Launch, SecondSignalKillsWorkersAtOnce) {
  auto result = signal_stubborn_worker("launch_second_signal", "60", {"-TERM", "-INT"});
  EXPECT_TRUE(contains(result.output, "received SIGINT while stopping the workers"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "launcher exit 143 after")) << result.output;
  const int ms = reported_ms(result.output);
  EXPECT_GE(ms, 0) << result.output;
  EXPECT_LT(ms, 10000) << result.output;
}

TEST(Launch, WorkersDieWithAKilledLauncher) {
  const std::string dir = fresh_temp_dir("launch_killed_launcher");
  const std::string worker = "echo $$ > " + quoted(dir) + "/pid_$RANK.tmp && mv " + quoted(dir) +
                             "/pid_$RANK.tmp " + quoted(dir) + "/pid_$RANK; exec sleep 30";
  const std::string script =
      launch_line("--nproc-per-node 2 --master-port " + std::to_string(free_port()), worker, 0) +
      " & P=$!; for i in $(seq 300); do [ -e " + quoted(dir + "/pid_0") + " ] && [ -e " +
      quoted(dir + "/pid_1") + " ] && break; sleep 0.1; done; kill -KILL $P; wait $P; " +
      "echo launcher exit $?";
  auto result = run_script(script);
  EXPECT_TRUE(contains(result.output, "launcher exit 137")) << result.output;
  for (int rank : {0, 1}) {
    const std::string pid_text = read_text(dir + "/pid_" + std::to_string(rank));
    ASSERT_FALSE(pid_text.empty()) << "rank " << rank << " did not start\n" << result.output;
    const pid_t pid = std::stoi(pid_text);
    for (int i = 0; i < 50 && process_alive(pid); ++i) ::usleep(100 * 1000);
    EXPECT_FALSE(process_alive(pid)) << "rank " << rank << " outlived its launcher";
  }
}

TEST(Launch, TwoNodesOnOneMachineFormOneWorld) {
  const int port = free_port();
  const std::string dir = fresh_temp_dir("launch_two_nodes");
  std::string script;
  for (int node : {0, 1}) {
    script += launch_line("--nnodes 2 --node-rank " + std::to_string(node) +
                              " --nproc-per-node 2 --master-addr 127.0.0.1 --master-port " +
                              std::to_string(port),
                          kPrintEnv) +
              " > " + quoted(dir + "/node" + std::to_string(node)) + " 2>&1 & ";
  }
  script += "wait";
  auto result = run_command(script);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string node0 = read_text(dir + "/node0");
  const std::string node1 = read_text(dir + "/node1");
  EXPECT_TRUE(contains(node0, env_line(0, 0, 4, 2, 0, port, "1"))) << node0;
  EXPECT_TRUE(contains(node0, env_line(1, 1, 4, 2, 0, port, "1"))) << node0;
  EXPECT_TRUE(contains(node1, env_line(2, 0, 4, 2, 1, port, "1"))) << node1;
  EXPECT_TRUE(contains(node1, env_line(3, 1, 4, 2, 1, port, "1"))) << node1;
  EXPECT_TRUE(contains(node1, "ranks 2-3 of world size 4 (node 1 of 2)")) << node1;
}

TEST(Launch, BadFlagsAreUsageErrors) {
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"--nproc-per-node 0 -- train", "--nproc-per-node must be a positive integer"},
      {"--nproc-per-node two -- train", "--nproc-per-node must be a positive integer"},
      {"--nnodes 2 --node-rank 2 -- train", "--node-rank must be in [0, --nnodes=2)"},
      {"--nnodes 4:1 -- train", "MIN:MAX with 1 <= MIN <= MAX"},
      {"--nnodes 1:2 --rdzv-conf join_timeout=x -- train", "--rdzv-conf join_timeout"},
      {"--nnodes 1:2 --rdzv-conf speed=3 -- train", "unknown key 'speed'"},
      {"--rdzv-conf join_timeout=5 -- train", "only applies to an elastic rendezvous"},
      {"--master-port 70000 -- train", "--master-port must be a TCP port"},
      {"--rdzv-id 'two words' -- train", "--rdzv-id must be 1..128 letters"},
      {"--nnodes 2 --master-port 0 -- train", "only works with --nnodes 1"},
      {"--rdzv-endpoint nohostport -- train", "--rdzv-endpoint must be HOST:PORT"},
      {"--rdzv-endpoint host:99999 -- train", "is not a TCP port"},
      {"--max-restarts -1 -- train", "--max-restarts must be >= 0"},
      {"--local-ranks-filter 0,x -- train", "--local-ranks-filter: 'x' is not a local rank"},
      {"--nproc-per-node 2 --local-ranks-filter 2 -- train", "2 is not a local rank"},
      {"--monitor-interval 0 -- train", "--monitor-interval"},
      {"--nproc-per-node 2", "missing the command to run"},
      {"--nproc-per-node 2 --", "missing the command to run"},
      {"--nproc-per-node 2 train --config x.toml", "unexpected --config"},
      {"--nproc-per-nod=2 -- train", "unexpected --nproc-per-nod=2"},
      {"--replan-layout tpu9 -- train", "unknown device profile 'tpu9'"},
      {"--replan-layout cpu --no-python -- sh", "--replan-layout plans the layout of a loom"},
  };
  for (const Case& c : cases) {
    auto result =
        run_command("timeout -s KILL 60 '" + std::string(LOOM_BINARY) + "' launch " + c.args);
    EXPECT_EQ(result.exit_code, 2) << c.args << "\n" << result.output;
    EXPECT_TRUE(contains(result.output, c.message)) << c.args << "\n" << result.output;
  }
}

TEST(Launch, MissingProgramFailsWithAClearMessage) {
  auto result = launch("--nproc-per-node 1 --master-port " + std::to_string(free_port()),
                       "exec /nonexistent/program");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 0 (local rank 0 on node 0) exited with code"))
      << result.output;
}
