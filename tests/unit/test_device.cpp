// Training on CUDA needs a GPU per local rank: the rule, and that a distributed runtime applies
// it before its rendezvous (so a misconfigured launch fails at once instead of hanging).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "loom/config/job_config.h"
#include "loom/core/check.h"
#include "loom/core/device.h"
#include "loom/distributed/runtime.h"
#include "loom/launch/world_info.h"
#include "support/process.h"
#include "support/scoped_env.h"

namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in: " << text;
}

std::string failure(const std::string& setting, int local_ranks, int gpus) {
  try {
    loom::device::check_gpu_per_local_rank(setting, local_ranks, gpus);
  } catch (const loom::InputError& e) {
    return e.message();
  }
  return "";
}

TEST(GpuPerLocalRank, EnoughGpusPass) {
  EXPECT_EQ(failure("cuda", 1, 1), "");
  EXPECT_EQ(failure("auto", 2, 2), "");
  EXPECT_EQ(failure("cuda", 4, 8), "");
}

TEST(GpuPerLocalRank, FewerGpusThanLocalRanksFailWithTheCounts) {
  const std::string message = failure("auto", 2, 1);
  EXPECT_TRUE(contains(message, "training.device = 'auto'"));
  EXPECT_TRUE(contains(message, "2 local ranks and sees 1 GPU"));
  EXPECT_TRUE(contains(message, "--nproc-per-node 1"));
  EXPECT_TRUE(contains(failure("cuda", 8, 4), "8 local ranks and sees 4 GPU"));
}

// training.device = "cuda:N" puts every local rank on GPU N (checking a layout on one GPU): the
// check says they share it, so their collectives go through the host; an index the node does
// not have fails at once, naming the range.
TEST(GpuPerLocalRank, AnExplicitIndexPutsEveryLocalRankOnThatGpu) {
  EXPECT_TRUE(loom::device::check_gpu_per_local_rank("cuda:0", 2, 1));
  EXPECT_TRUE(loom::device::check_gpu_per_local_rank("cuda:1", 5, 2));
  EXPECT_FALSE(loom::device::check_gpu_per_local_rank("cuda:0", 1, 1));
  EXPECT_FALSE(loom::device::check_gpu_per_local_rank("cuda", 2, 2));
  EXPECT_TRUE(contains(failure("cuda:1", 2, 1), "names a GPU this node does not have"));
  EXPECT_TRUE(contains(failure("cuda:1", 2, 1), "cuda:0 to cuda:0"));
  EXPECT_TRUE(contains(failure("cuda", 2, 1), "--training.device cuda:0"));
}

TEST(GpuPerLocalRank, NoGpuFailsAsSuch) {
  EXPECT_TRUE(contains(failure("cuda", 1, 0), "no CUDA device is available"));
  EXPECT_TRUE(contains(failure("cuda", 1, 0), "training.device = 'cuda'"));
}

using loom::testing::ScopedEnv;

// One more local rank than this machine has GPUs (any machine): the runtime refuses before it
// joins the rendezvous, which would otherwise wait for ranks that never come.
TEST(GpuPerLocalRank, RuntimeChecksBeforeRendezvous) {
  const int gpus = loom::device::query_accelerators().device_count;
  const std::string ranks = std::to_string(gpus + 1);
  ScopedEnv env({{"RANK", "0"},
                 {"WORLD_SIZE", ranks},
                 {"LOCAL_RANK", "0"},
                 {"LOCAL_WORLD_SIZE", ranks},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", std::to_string(loom::testing::free_port())}});
  loom::config::JobConfig config;
  config.training.device = "cuda";
  config.comm.init_timeout_seconds = 5;  // a missing check fails after 5 s, not 5 min
  try {
    loom::distributed::ParallelRuntime runtime(config, loom::distributed::read_world_info(),
                                               /*with_cuda=*/true);
    FAIL() << "a runtime with " << ranks << " local ranks and " << gpus << " GPU(s) started";
  } catch (const loom::InputError& e) {
    EXPECT_TRUE(contains(e.message(), "training.device = 'cuda'"));
  }
}

}  // namespace
