// training.cuda_graph on a GPU (train/step_graph.h): the debug Llama trains with the step
// recorded as a CUDA graph after 2 eager steps and replayed, and its losses and gradient norms
// follow the eager run's step by step (float32, so the comparison is tight); the graph's work
// synchronizes with the host no more than the eager step's does. The path itself (buffers, lr and
// step counts on the device, resume) is checked bit for bit on CPU in the default suite
// (Training.CudaGraphStepTrainsAsTheEagerStepAndResumesIntoIt).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <cmath>

#include "loom/train/trainer.h"
#include "support/jobs.h"
#include "support/process.h"

namespace loom {
namespace {

TEST(CudaGraphStep, ReplaysFollowTheEagerSteps) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  auto job =
      testing::small_job(testing::fresh_temp_dir("cuda_graph_eager"), {4, 128, 10, 5, 1, 17});
  job.training.device = "cuda";
  job.training.global_batch_size = 8;  // 2 microbatches
  job.training.mixed_precision_param = "float32";
  const auto eager = train::Trainer(job).train();
  job.job.dump_folder = testing::fresh_temp_dir("cuda_graph_replay");
  job.training.cuda_graph = true;
  const auto graphed = train::Trainer(job).train();
  EXPECT_EQ(graphed.graph_replays, 8);  // steps 3 to 10
  ASSERT_EQ(graphed.losses.size(), eager.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-5 * std::abs(eager.losses[i]))
        << "step " << i + 1;
    EXPECT_NEAR(graphed.grad_norms[i], eager.grad_norms[i], 1e-4 * std::abs(eager.grad_norms[i]))
        << "step " << i + 1;
  }
}

}  // namespace
}  // namespace loom
