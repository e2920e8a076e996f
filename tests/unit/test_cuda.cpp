// Runs only on a machine with a GPU (label "cuda"): the CUDA paths of this build really work.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "loom/core/build_info.h"
#include "loom/core/device.h"
#include "loom/distributed/process_groups.h"
#include "support/process.h"

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

// c10d's NCCL backend through loom's Comm on one GPU (a world of one rank with real backends).
TEST(Cuda, NcclCollectivesThroughComm) {
  if (!loom::build::kWithNccl) GTEST_SKIP() << "built without NCCL (LOOM_WITH_NCCL=OFF)";
  loom::distributed::CommInit init;
  init.master_port = loom::testing::free_port();
  init.with_cuda = true;
  init.backends_for_single_rank = true;
  loom::distributed::ProcessGroups groups(init);
  auto& comm = groups.world();
  at::Tensor t = at::arange(8, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  comm.all_reduce(t, loom::distributed::ReduceOp::kAvg);
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(8, at::kFloat)));
  at::Tensor out = at::zeros_like(t);
  comm.all_gather_into_tensor(out, t);
  comm.reduce_scatter_tensor(t, out);
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(8, at::kFloat)));
  EXPECT_TRUE(comm.capabilities().reduce_scatter_tensor);
  at::Tensor cpu = at::ones({4});
  comm.all_reduce(cpu);  // CPU tensors go through Gloo in the same group
  EXPECT_TRUE(at::equal(cpu, at::ones({4})));
  comm.barrier();
}
