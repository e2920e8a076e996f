// The CUDA side of test_step_memory.cpp: one rank trains the debug Llama on the GPU, and after a
// warm-up the caching allocator's allocated bytes (current and peak) may not grow by more than
// a few MB over 40 steps. One GPU: the multi-rank wrappers are checked on the host (thread ranks
// over Gloo), where the hooks and collectives that could keep memory are the same code.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "loom/models/kernels/cuda.h"
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

// Restores the CUDA sync debug mode on scope exit.
class SyncDebugMode {
 public:
  explicit SyncDebugMode(c10::cuda::SyncDebugMode mode) {
    c10::cuda::warning_state().set_sync_debug_mode(mode);
  }
  ~SyncDebugMode() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
};

// A step (forward, loss, backward, clip, fused AdamW or Muon) enqueues its work and never waits
// for the GPU: with LibTorch's sync debug mode at "error", any synchronizing call (a host read,
// a copy from pageable memory, a stream synchronize) throws and names itself. With loom's CUDA
// kernels on and off. (The trainer reads the loss and the norm only on logging steps.)
TEST(CudaStepSync, OneRankStepsDoNotSynchronizeWithTheHost) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  const at::Device device(at::kCUDA, 0);
  for (const std::string optimizer : {"AdamW", "Muon"}) {
    for (bool kernels : {false, true}) {
      SCOPED_TRACE(optimizer + (kernels ? ", loom's CUDA kernels" : ", ATen's compositions"));
      models::kernels::set_cuda_kernels_enabled(kernels);
      const testing::Layout layout{"one rank on CUDA"};
      auto config = testing::step_memory_job(layout);
      config.optimizer.name = optimizer;
      testing::RankTrainer trainer(config, 0, 1, 0, device);
      const at::Tensor rows =
          at::randint(0, testing::kVocab, {testing::kRows, testing::kSeq + 1}, at::kLong)
              .to(device);
      for (int s = 0; s < 3; ++s) trainer.step(rows);  // first-use allocations and caches
      c10::cuda::device_synchronize();
      {
        SyncDebugMode error_on_sync(c10::cuda::SyncDebugMode::L_ERROR);
        EXPECT_NO_THROW(for (int s = 0; s < 3; ++s) trainer.step(rows));
      }
      models::kernels::set_cuda_kernels_enabled(false);
    }
  }
}

}  // namespace
}  // namespace loom
