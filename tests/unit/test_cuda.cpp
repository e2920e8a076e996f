// Runs only on a machine with a GPU (label "cuda"): the CUDA paths of this build really work.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "comm_test_util.h"
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

// Two ranks on one GPU (training.device = "cuda:0" with two local ranks): no NCCL, so every
// collective of CUDA tensors runs on host copies over Gloo and its result lands back on the
// GPU, synchronous or awaited later.
TEST(Cuda, RanksSharingAGpuRunCollectivesThroughTheHost) {
  loom::distributed::CommOptions options;
  options.cuda_through_host = true;
  auto errors = loom::testing::run_ranks(
      2,
      [](loom::distributed::ProcessGroups& groups) {
        auto& comm = groups.world();
        const int rank = groups.rank();
        const auto on_gpu = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
        auto expect = [&](const at::Tensor& got, const at::Tensor& want, const char* what) {
          LOOM_CHECK(got.is_cuda(), what, ": the result left the GPU");
          LOOM_CHECK(at::equal(got.cpu(), want), what, ": ", got.cpu(), " vs ", want);
        };
        at::Tensor t = at::full({4}, rank + 1.0, on_gpu);
        comm.all_reduce(t);
        expect(t, at::full({4}, 3.0), "all_reduce");
        at::Tensor later = at::full({4}, rank + 1.0, on_gpu);
        auto work = comm.all_reduce(later, loom::distributed::ReduceOp::kMax, /*async_op=*/true);
        work.wait();
        expect(later, at::full({4}, 2.0), "async all_reduce");
        at::Tensor gathered = at::empty({8}, on_gpu);
        comm.all_gather_into_tensor(gathered, at::full({4}, rank + 1.0, on_gpu));
        expect(gathered, at::cat({at::full({4}, 1.0), at::full({4}, 2.0)}), "all_gather");
        at::Tensor scattered = at::empty({4}, on_gpu);
        comm.reduce_scatter_tensor(scattered, at::arange(8, on_gpu));
        expect(scattered, at::arange(8, at::kFloat).narrow(0, 4 * rank, 4) * 2, "reduce_scatter");
        at::Tensor root = at::full({3}, rank == 1 ? 7.0 : 0.0, on_gpu);
        comm.broadcast(root, 1);
        expect(root, at::full({3}, 7.0), "broadcast");
        at::Tensor exchanged = at::empty({2}, on_gpu);
        comm.all_to_all_single(exchanged, at::arange(2, on_gpu) + 10 * rank);
        expect(exchanged, at::tensor({static_cast<float>(rank), 10.0f + rank}), "all_to_all");
        at::Tensor message = at::full({5}, rank + 1.0, on_gpu);
        at::Tensor received = at::empty({5}, on_gpu);
        for (auto& w :
             comm.batch_send_recv({{loom::distributed::P2POp::Kind::kSend, message, 1 - rank},
                                   {loom::distributed::P2POp::Kind::kRecv, received, 1 - rank}})) {
          w.wait();
        }
        expect(received, at::full({5}, 2.0 - rank), "send/recv");
      },
      options);
  EXPECT_TRUE(errors.empty()) << loom::testing::joined(errors);
}
