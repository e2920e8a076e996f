// Runs only on a machine with a GPU (label "cuda"): the CUDA paths of this build really work.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "loom/core/build_info.h"
#include "loom/core/device.h"

TEST(Cuda, DeviceIsVisibleAndNcclLoads) {
  auto info = loom::device::query_accelerators();
  ASSERT_TRUE(info.cuda_compiled);
  ASSERT_TRUE(info.cuda_available) << "no CUDA device: run the cuda label on a GPU machine only";
  EXPECT_GE(info.device_count, 1);
  EXPECT_FALSE(info.device_names.empty());
  if (loom::build::kWithNccl) {
    EXPECT_FALSE(info.nccl_version.empty());
  }
}

TEST(Cuda, MatmulMatchesCpu) {
  at::manual_seed(0);
  at::Tensor a = at::randn({256, 128});
  at::Tensor b = at::randn({128, 64});
  at::Tensor cpu = at::matmul(a, b);
  at::Tensor gpu = at::matmul(a.cuda(), b.cuda()).cpu();
  EXPECT_TRUE(at::allclose(cpu, gpu, 1e-4, 1e-4));
}
