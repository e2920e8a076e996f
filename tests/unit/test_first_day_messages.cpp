// First-day messages that must read right (issue 54): what a run says about itself when another
// job shares the host, when a replica group healed it forward, and which family owns a flavor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "loom/core/check.h"
#include "loom/models/model_spec.h"
#include "loom/train/threads.h"
#include "loom/train/trainer.h"

namespace fs = std::filesystem;

namespace {

// A fake /proc entry: an exe link, a cmdline and an environ.
void fake_process(const fs::path& root, int pid, const std::string& exe,
                  const std::string& cmdline, const std::string& environ) {
  const fs::path dir = root / std::to_string(pid);
  fs::create_directories(dir);
  fs::create_symlink(exe, dir / "exe");
  std::ofstream(dir / "cmdline", std::ios::binary) << cmdline;
  std::ofstream(dir / "environ", std::ios::binary) << environ;
}

std::string nul(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& part : parts) out += part + std::string(1, '\0');
  return out;
}

}  // namespace

// Two launches on one host each sized their threads for the whole machine, with no warning.
TEST(FirstDayMessages, OtherJobsTrainingProcessesOnTheHostAreFound) {
  const fs::path root = fs::path(::testing::TempDir()) / "fake_proc";
  fs::remove_all(root);
  const std::string loom = "/opt/loom/bin/loom";
  // A rank of this job, a rank of another job, a lone run, a lighthouse, another program.
  fake_process(root, 10, loom, nul({loom, "train", "--config", "a.toml"}),
               nul({"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}));
  fake_process(root, 11, loom, nul({loom, "train"}),
               nul({"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29600", "OMP_NUM_THREADS=2"}));
  fake_process(root, 12, loom, nul({loom, "train"}), nul({"HOME=/root"}));
  fake_process(root, 13, loom, nul({loom, "lighthouse"}), nul({}));
  fake_process(root, 14, "/usr/bin/python3", nul({"python3", "train"}), nul({}));
  fake_process(root, 15, loom, nul({loom, "train"}), nul({}));  // this process
  const auto others =
      loom::train::other_trainers(root.string(), loom, "127.0.0.1:29500", /*self_pid=*/15, 8);
  ASSERT_EQ(others.size(), 2u);
  int threads = 0;
  for (const auto& other : others) {
    EXPECT_TRUE(other.pid == 11 || other.pid == 12) << other.pid;
    threads += other.intra_op;
  }
  EXPECT_EQ(threads, 2 + 8);  // OMP_NUM_THREADS, or every CPU when unset
  loom::train::ThreadPlan plan;
  plan.intra_op = 2;
  plan.ranks = 1;
  plan.cpus = 2;
  EXPECT_FALSE(plan.oversubscribed());
  plan.others = {{11, 2}};
  EXPECT_TRUE(plan.oversubscribed());
}

// A group that healed to step 10 and trained 11-30 said "steps 1-30".
TEST(FirstDayMessages, AHealedRunCountsTheStepsItTrained) {
  loom::train::TrainResult healed;
  healed.first_step = 11;
  healed.steps_completed = 30;
  EXPECT_EQ(loom::train::describe_steps_run(healed, 0, 30),
            "finished: 20 steps (steps 11-30, healed to step 10 from a replica group) of 30");
  loom::train::TrainResult resumed;
  resumed.first_step = 61;
  resumed.steps_completed = 62;
  EXPECT_EQ(loom::train::describe_steps_run(resumed, 60, 62),
            "finished: 2 steps (steps 61-62, resumed from step 60) of 62");
  loom::train::TrainResult fresh;
  fresh.steps_completed = 5;
  EXPECT_EQ(loom::train::describe_steps_run(fresh, 0, 5), "finished: 5 steps (steps 1-5) of 5");
}

// torchtitan keeps the Qwen3 mixture-of-experts flavors under `qwen3`.
TEST(FirstDayMessages, TorchtitansQwen3MoeNamesFindTheMoeFamily) {
  for (const char* flavor : {"debugmodel_moe", "30B-A3B", "235B-A22B"}) {
    EXPECT_EQ(loom::models::find_model_spec("qwen3", flavor).name, "qwen3_moe") << flavor;
    EXPECT_EQ(loom::models::find_model_spec("qwen3_moe", flavor).name, "qwen3_moe") << flavor;
  }
  EXPECT_EQ(loom::models::find_model_spec("qwen3", "0.6B").name, "qwen3");
  auto message = [](const std::string& name, const std::string& flavor) {
    try {
      loom::models::find_model_spec(name, flavor);
    } catch (const loom::InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // An unknown flavor names the family that has it.
  EXPECT_NE(message("llama3", "30B-A3B")
                .find("'30B-A3B' is not a llama3 flavor; it is a qwen3_moe flavor (set "
                      "model.name = \"qwen3_moe\")"),
            std::string::npos)
      << message("llama3", "30B-A3B");
  EXPECT_NE(message("qwen3_moe", "0.6B").find("it is a qwen3 flavor"), std::string::npos);
  // A flavor no family has lists what the name offers, the MoE flavors under qwen3 included.
  const std::string unknown = message("qwen3", "31B-A3B");
  EXPECT_NE(unknown.find("unknown qwen3 flavor '31B-A3B' (did you mean '30B-A3B'?)"),
            std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("235B-A22B"), std::string::npos) << unknown;
}
