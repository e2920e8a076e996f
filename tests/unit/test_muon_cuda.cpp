// Muon on the GPU (label "cuda"): one rank of the debug Llama steps like the same rank on the
// host (CudaStepSync in test_step_memory_cuda.cpp shows its steps never wait for the GPU).
// The distributed paths (gathers onto owner ranks,
// expert stacks, QK-clip) are checked on the host over Gloo; what only a GPU shows is the device
// arithmetic of Newton-Schulz and the lack of host syncs.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "step_memory_util.h"

namespace loom {
namespace {

config::JobConfig muon_job(const std::string& ns_dtype) {
  const testing::Layout layout{"one rank"};
  config::JobConfig config = testing::step_memory_job(layout);
  config.optimizer.name = "Muon";
  config.optimizer.muon_ns_dtype = ns_dtype;
  return config;
}

// The GPU trainer starts from the host trainer's weights (each device's generator would
// initialize them differently).
void copy_weights(testing::RankTrainer& from, testing::RankTrainer& to) {
  at::NoGradGuard no_grad;
  const auto source = from.model.tensors();
  const auto target = to.model.tensors();
  ASSERT_EQ(source.size(), target.size());
  for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
}

// Largest |gpu - cpu| over the largest |cpu| of each parameter.
double worst_relative_difference(testing::RankTrainer& cpu, testing::RankTrainer& gpu) {
  const auto a = cpu.model.tensors();
  const auto b = gpu.model.tensors();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = a[i].abs().max().item<double>();
    const double diff = (b[i].cpu() - a[i]).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(scale, 1e-12));
  }
  return worst;
}

// Five steps with float32 Newton-Schulz: every parameter within 1e-4 of the host's (LibTorch
// keeps TF32 off for float32 matmuls). In bfloat16 the iteration rounds differently on each
// device's GEMMs, so it is held to 1e-2: still far below a wrong coefficient or transpose.
TEST(CudaMuon, OneRankStepsLikeTheHost) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  const at::Device device(at::kCUDA, 0);
  for (const auto& [dtype, bound] : {std::pair<std::string, double>{"float32", 1e-4},
                                     std::pair<std::string, double>{"bfloat16", 1e-2}}) {
    SCOPED_TRACE("Newton-Schulz in " + dtype);
    const auto config = muon_job(dtype);
    testing::RankTrainer cpu(config, 0, 1, 0);
    testing::RankTrainer gpu(config, 0, 1, 0, device);
    copy_weights(cpu, gpu);
    const at::Tensor rows =
        at::randint(0, testing::kVocab, {testing::kRows, testing::kSeq + 1}, at::kLong);
    const at::Tensor rows_on_gpu = rows.to(device);
    for (int s = 0; s < 5; ++s) {
      cpu.step(rows);
      gpu.step(rows_on_gpu);
    }
    EXPECT_LE(worst_relative_difference(cpu, gpu), bound);
  }
}

}  // namespace
}  // namespace loom
