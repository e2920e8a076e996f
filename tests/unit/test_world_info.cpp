// WorldInfo from the environment: torchrun's contract, SLURM's, single process, and the errors
// for half-set or inconsistent variables. Each test sets variables through ScopedEnv, which
// clears every variable read_world_info looks at and restores them afterwards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "loom/core/check.h"
#include "loom/launch/world_info.h"
#include "support/process.h"
#include "support/scoped_env.h"

using loom::InputError;
using loom::distributed::read_world_info;
using loom::distributed::slurm_default_port;
using loom::distributed::slurm_first_host;
using loom::distributed::slurm_tasks_on_node;
using loom::distributed::WorldInfo;

namespace {

const char* const kVariables[] = {"RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "GROUP_RANK",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "TORCHELASTIC_RESTART_COUNT",
                                  "TORCHELASTIC_RUN_ID",
                                  "SLURM_PROCID",
                                  "SLURM_NTASKS",
                                  "SLURM_LOCALID",
                                  "SLURM_NODEID",
                                  "SLURM_NTASKS_PER_NODE",
                                  "SLURM_TASKS_PER_NODE",
                                  "SLURM_JOB_NODELIST",
                                  "SLURM_NODELIST",
                                  "SLURM_JOB_ID",
                                  "SLURM_STEP_ID",
                                  "SLURM_RESTART_COUNT"};

// Sets `values` with every variable the runtime reads cleared first.
class ScopedEnv : public loom::testing::ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& values)
      : loom::testing::ScopedEnv(values, {std::begin(kVariables), std::end(kVariables)}) {}
};

const std::map<std::string, std::string> kTorchrun = {{"RANK", "5"},
                                                      {"WORLD_SIZE", "8"},
                                                      {"LOCAL_RANK", "1"},
                                                      {"LOCAL_WORLD_SIZE", "4"},
                                                      {"GROUP_RANK", "1"},
                                                      {"MASTER_ADDR", "10.0.0.7"},
                                                      {"MASTER_PORT", "29511"},
                                                      {"TORCHELASTIC_RESTART_COUNT", "2"}};

std::map<std::string, std::string> with(std::map<std::string, std::string> base,
                                        const std::string& name, const std::string& value) {
  base[name] = value;
  return base;
}

std::map<std::string, std::string> without(std::map<std::string, std::string> base,
                                           const std::string& name) {
  base.erase(name);
  return base;
}

// The InputError message of read_world_info(), failing the test when it does not throw.
std::string error_of(const std::map<std::string, std::string>& values) {
  ScopedEnv env(values);
  try {
    read_world_info();
  } catch (const InputError& error) {
    return error.message();
  }
  ADD_FAILURE() << "read_world_info() did not throw";
  return "";
}

using loom::testing::contains;

}  // namespace

TEST(WorldInfo, SingleProcessWithoutLauncher) {
  ScopedEnv env({});
  WorldInfo info = read_world_info();
  EXPECT_EQ(info.source, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.group_rank, 0);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.restart_count, 0);
  EXPECT_FALSE(info.is_distributed());
}

TEST(WorldInfo, TorchrunContract) {
  ScopedEnv env(kTorchrun);
  WorldInfo info = read_world_info();
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.group_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.7");
  EXPECT_EQ(info.master_port, 29511);
  EXPECT_EQ(info.restart_count, 2);
  EXPECT_TRUE(info.is_distributed());
}

TEST(WorldInfo, TorchrunOptionalVariablesHaveDefaults) {
  auto values = without(without(without(kTorchrun, "LOCAL_WORLD_SIZE"), "GROUP_RANK"),
                        "TORCHELASTIC_RESTART_COUNT");
  ScopedEnv env(values);
  WorldInfo info = read_world_info();
  EXPECT_EQ(info.local_world_size, 8);
  EXPECT_EQ(info.group_rank, 0);
  EXPECT_EQ(info.restart_count, 0);
}

// The run id a rank checks the rendezvous store against (store_identity.h).
TEST(WorldInfo, RunIdComesFromTheLauncher) {
  {
    ScopedEnv env(with(kTorchrun, "TORCHELASTIC_RUN_ID", "job-42.a:b"));
    EXPECT_EQ(read_world_info().run_id, "job-42.a:b");
  }
  {
    ScopedEnv env(kTorchrun);  // torchrun's own default when --rdzv-id is not given
    EXPECT_EQ(read_world_info().run_id, "none");
  }
  {
    ScopedEnv env({});
    EXPECT_EQ(read_world_info().run_id, "none");
  }
  // A value that would not read as one word inside an error message is refused.
  const std::string message = error_of(with(kTorchrun, "TORCHELASTIC_RUN_ID", "two words"));
  EXPECT_TRUE(contains(message, "TORCHELASTIC_RUN_ID='two words' is not a run id")) << message;
}

TEST(WorldInfo, TorchrunWinsOverSlurm) {
  auto values = kTorchrun;
  values["SLURM_PROCID"] = "0";
  values["SLURM_NTASKS"] = "1";
  ScopedEnv env(values);
  EXPECT_EQ(read_world_info().source, "torchrun");
}

TEST(WorldInfo, TorchrunErrorsNameTheVariable) {
  EXPECT_TRUE(
      contains(error_of(with(kTorchrun, "RANK", "8")), "RANK=8 must be below WORLD_SIZE=8"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "RANK", "two")), "RANK='two' is not an integer"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "RANK", "-1")), "RANK=-1"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "WORLD_SIZE", "0")), "WORLD_SIZE=0"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "LOCAL_RANK", "4")),
                       "LOCAL_RANK=4 must be below LOCAL_WORLD_SIZE=4"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "LOCAL_WORLD_SIZE", "9")), "LOCAL_WORLD_SIZE=9"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "GROUP_RANK", "2")), "GROUP_RANK=2"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "MASTER_PORT", "70000")), "MASTER_PORT=70000"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "MASTER_PORT", "x")), "MASTER_PORT='x'"));
  EXPECT_TRUE(contains(error_of(with(kTorchrun, "TORCHELASTIC_RESTART_COUNT", "1.5")),
                       "TORCHELASTIC_RESTART_COUNT"));
  for (const char* partner : {"WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    const std::string message = error_of(without(kTorchrun, partner));
    EXPECT_TRUE(contains(message, std::string(partner) + " is not set, but RANK is")) << message;
  }
}

TEST(WorldInfo, HalfATorchrunEnvironmentIsAnError) {
  EXPECT_TRUE(contains(error_of({{"WORLD_SIZE", "2"}}), "WORLD_SIZE is set but RANK is not"));
  EXPECT_TRUE(contains(error_of({{"LOCAL_RANK", "0"}}), "LOCAL_RANK is set but RANK is not"));
}

TEST(WorldInfo, SingleProcessHonoursMasterAddressAndPort) {
  ScopedEnv env({{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}});
  WorldInfo info = read_world_info();
  EXPECT_EQ(info.master_addr, "localhost");
  EXPECT_EQ(info.master_port, 1234);
}

const std::map<std::string, std::string> kSlurm = {{"SLURM_PROCID", "6"},
                                                   {"SLURM_NTASKS", "8"},
                                                   {"SLURM_LOCALID", "2"},
                                                   {"SLURM_NODEID", "1"},
                                                   {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                                   {"SLURM_JOB_NODELIST", "gpu-[07-08]"},
                                                   {"SLURM_JOB_ID", "123456"}};

TEST(WorldInfo, SlurmTasks) {
  ScopedEnv env(kSlurm);
  WorldInfo info = read_world_info();
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.group_rank, 1);
  EXPECT_EQ(info.master_addr, "gpu-07");
  EXPECT_EQ(info.master_port, 20000 + 3456);
}

TEST(WorldInfo, SlurmRunIdIsTheJobAndStep) {
  {
    ScopedEnv env(kSlurm);
    EXPECT_EQ(read_world_info().run_id, "slurm-123456");
  }
  {
    ScopedEnv env(with(kSlurm, "SLURM_STEP_ID", "3"));
    EXPECT_EQ(read_world_info().run_id, "slurm-123456.3");
  }
  {
    ScopedEnv env(with(kSlurm, "TORCHELASTIC_RUN_ID", "named"));
    EXPECT_EQ(read_world_info().run_id, "named");
  }
}

TEST(WorldInfo, SlurmPrefersExplicitValues) {
  auto values = kSlurm;
  values["SLURM_NTASKS_PER_NODE"] = "4";
  values["SLURM_TASKS_PER_NODE"] = "garbage ignored";
  values["MASTER_ADDR"] = "head";
  values["MASTER_PORT"] = "29400";
  ScopedEnv env(values);
  WorldInfo info = read_world_info();
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "head");
  EXPECT_EQ(info.master_port, 29400);
}

TEST(WorldInfo, SlurmErrorsNameTheVariable) {
  EXPECT_TRUE(contains(error_of(with(kSlurm, "SLURM_PROCID", "8")),
                       "SLURM_PROCID=8 must be below SLURM_NTASKS=8"));
  EXPECT_TRUE(contains(error_of(without(kSlurm, "SLURM_NTASKS")),
                       "SLURM_NTASKS is not set, but SLURM_PROCID is"));
  EXPECT_TRUE(contains(error_of(without(kSlurm, "SLURM_TASKS_PER_NODE")), "SLURM_TASKS_PER_NODE"));
  EXPECT_TRUE(contains(error_of(with(kSlurm, "SLURM_TASKS_PER_NODE", "4")),
                       "SLURM_TASKS_PER_NODE='4' lists 1 nodes, but SLURM_NODEID=1"));
  EXPECT_TRUE(contains(error_of(with(kSlurm, "SLURM_LOCALID", "4")),
                       "SLURM_LOCALID=4 must be below SLURM_TASKS_PER_NODE=4"));
  EXPECT_TRUE(contains(error_of(with(kSlurm, "SLURM_JOB_NODELIST", "gpu-[07-08")),
                       "SLURM_JOB_NODELIST='gpu-[07-08' is not a SLURM node list"));
  EXPECT_TRUE(contains(error_of(without(kSlurm, "SLURM_JOB_ID")), "SLURM_JOB_ID"));
  EXPECT_TRUE(contains(error_of(without(kSlurm, "SLURM_JOB_NODELIST")), "SLURM_JOB_NODELIST"));
}

TEST(SlurmNodeList, FirstHost) {
  EXPECT_EQ(slurm_first_host("node01", "V"), "node01");
  EXPECT_EQ(slurm_first_host("node01,node02", "V"), "node01");
  EXPECT_EQ(slurm_first_host("node[01-04,07]", "V"), "node01");
  EXPECT_EQ(slurm_first_host("node[07,01-04]", "V"), "node07");
  EXPECT_EQ(slurm_first_host("node[3]", "V"), "node3");
  EXPECT_EQ(slurm_first_host("rack[2-3]-gpu[010-012],cpu1", "V"), "rack2-gpu010");
  EXPECT_EQ(slurm_first_host("a.b.example.org", "V"), "a.b.example.org");
  for (const char* bad : {"", "node[01", "node]", "node[]", "node[x-2]", ",node"}) {
    try {
      slurm_first_host(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& error) {
      EXPECT_TRUE(contains(error.message(), "SLURM_JOB_NODELIST")) << error.message();
    }
  }
}

TEST(SlurmNodeList, TasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("8", 0, "V"), 8);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 0, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 1, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 2, "V"), 3);
  EXPECT_THROW(slurm_tasks_on_node("4(x2),3", 3, "V"), InputError);
  EXPECT_THROW(slurm_tasks_on_node("4(x2", 0, "V"), InputError);
  EXPECT_THROW(slurm_tasks_on_node("four", 0, "V"), InputError);
  EXPECT_THROW(slurm_tasks_on_node("0", 0, "V"), InputError);
}

TEST(SlurmNodeList, DefaultPortStaysInItsRange) {
  EXPECT_EQ(slurm_default_port(0), 20000);
  EXPECT_EQ(slurm_default_port(9999), 29999);
  EXPECT_EQ(slurm_default_port(123456), 23456);
}
