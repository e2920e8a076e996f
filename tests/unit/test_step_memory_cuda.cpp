// The CUDA side of test_step_memory.cpp: one rank trains the debug Llama on the GPU, and after a
// warm-up the caching allocator's allocated bytes (current and peak) may not grow by more than
// a few MB over 40 steps. One GPU: the multi-rank wrappers are checked on the host (thread ranks
// over Gloo), where the hooks and collectives that could keep memory are the same code.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "step_memory_util.h"

namespace loom {
namespace {

namespace cuda_alloc = c10::cuda::CUDACachingAllocator;

uint64_t allocated_now(int device) {
  return cuda_alloc::getDeviceStats(device).allocated_bytes[0].current;  // 0: all pools
}

uint64_t allocated_peak(int device) {
  return cuda_alloc::getDeviceStats(device).allocated_bytes[0].peak;
}

TEST(CudaStepMemory, OneRankDoesNotGrow) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  const at::Device device(at::kCUDA, 0);
  const testing::Layout layout{"one rank on CUDA"};
  const auto config = testing::step_memory_job(layout);
  testing::RankTrainer trainer(config, 0, 1, 0, device);
  const at::Tensor rows =
      at::randint(0, testing::kVocab, {testing::kRows, testing::kSeq + 1}, at::kLong).to(device);
  for (int s = 0; s < 10; ++s) trainer.step(rows);
  c10::cuda::device_synchronize();
  const uint64_t warm_now = allocated_now(0);
  cuda_alloc::resetPeakStats(0);
  trainer.step(rows);  // the first measured step sets the bar for the peak
  c10::cuda::device_synchronize();
  const uint64_t first_peak = allocated_peak(0);
  for (int s = 1; s < 40; ++s) trainer.step(rows);
  c10::cuda::device_synchronize();
  constexpr uint64_t kFewMiB = 4u << 20;
  EXPECT_LE(allocated_now(0), warm_now + kFewMiB) << "allocated bytes grew over 40 steps";
  EXPECT_LE(allocated_peak(0), first_peak + kFewMiB) << "the step's peak allocation grew";
}

}  // namespace
}  // namespace loom
