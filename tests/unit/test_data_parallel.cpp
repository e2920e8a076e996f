// DataParallel on thread ranks over Gloo: reduced gradients equal the single-process gradient of
// the whole batch, buckets are launched during backward, accumulation syncs once, unused
// parameters get zeros, and parameters start equal on every rank.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "loom/parallel/data_parallel.h"

namespace loom {
namespace {

using distributed::ProcessGroups;
using parallel::DataParallel;
using parallel::DataParallelOptions;

// A three-layer MLP with one parameter that the loss never uses.
struct Mlp {
  std::vector<std::pair<std::string, at::Tensor>> params;
  explicit Mlp(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto make = [&](const std::string& name, std::vector<int64_t> shape) {
      params.emplace_back(name, at::randn(shape, gen).mul_(0.3).set_requires_grad(true));
    };
    make("w1", {8, 16});
    make("w2", {16, 16});
    make("w3", {16, 4});
    make("unused", {5});
  }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = at::tanh(x.mm(params[0].second));
    h = at::tanh(h.mm(params[1].second));
    return h.mm(params[2].second).pow(2).sum();
  }
  std::vector<std::pair<std::string, at::Tensor>> named() const { return params; }
};

at::Tensor batch(int64_t rows, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn({rows, 8}, gen);
}

// The reference: one process, the whole batch, summed loss.
std::vector<at::Tensor> reference_grads(const at::Tensor& x) {
  Mlp model(1);
  model.loss(x).backward();
  std::vector<at::Tensor> grads;
  for (auto& [name, p] : model.params) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  }
  return grads;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!at::allclose(got, want, 1e-5, 1e-6)) {
    LOOM_THROW(InternalError, what, " differs: max abs diff ",
               (got - want).abs().max().item<double>());
  }
}

TEST(DataParallel, ReducedGradientsEqualTheWholeBatchGradient) {
  const int world = 2;
  const at::Tensor x = batch(8, 7);
  const auto want = reference_grads(x);
  auto errors = testing::run_ranks(world, [&](ProcessGroups& groups) {
    const int r = groups.rank();
    // Different seeds per rank: the initial broadcast must make them equal to rank 0's.
    Mlp model(r == 0 ? 1 : 99);
    DataParallelOptions options;
    options.bucket_cap_mb = 200.0 / (1024 * 1024);  // 200 bytes: three buckets
    DataParallel ddp(model.named(), groups.world_ptr(), options);
    LOOM_CHECK(ddp.num_buckets() >= 3, "expected several buckets, got ", ddp.num_buckets());
    model.loss(x.narrow(0, 4 * r, 4)).backward();
    ddp.finish_gradient_sync();
    for (size_t i = 0; i < want.size(); ++i) {
      expect_close(model.params[i].second.grad(), want[i], "gradient of " + model.params[i].first);
    }
    // Every bucket with a used parameter went out during backward; the one holding only the
    // unused parameter waited for finish.
    LOOM_CHECK(
        ddp.stats().buckets_launched_in_backward == static_cast<int64_t>(ddp.num_buckets()) - 1,
        "buckets launched in backward: ", ddp.stats().buckets_launched_in_backward, " of ",
        ddp.num_buckets());
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

TEST(DataParallel, AccumulationSyncsOnlyTheLastMicrobatch) {
  const at::Tensor x = batch(16, 11);
  const auto want = reference_grads(x);
  auto errors = testing::run_ranks(2, [&](ProcessGroups& groups) {
    const int r = groups.rank();
    Mlp model(1);
    DataParallel ddp(model.named(), groups.world_ptr());
    const uint64_t calls_before =
        groups.world().counters()[distributed::Collective::kAllReduce].calls;
    // Rank r owns rows [8r, 8r + 8) as two microbatches of 4.
    for (int micro = 0; micro < 2; ++micro) {
      ddp.set_requires_gradient_sync(micro == 1);
      model.loss(x.narrow(0, 8 * r + 4 * micro, 4)).backward();
    }
    ddp.finish_gradient_sync();
    const uint64_t calls =
        groups.world().counters()[distributed::Collective::kAllReduce].calls - calls_before;
    LOOM_CHECK(calls == ddp.num_buckets(), "one all-reduce per bucket per step, got ", calls);
    for (size_t i = 0; i < want.size(); ++i) {
      expect_close(model.params[i].second.grad(), want[i], "gradient of " + model.params[i].first);
    }
    // A second step reuses the buckets.
    for (auto& [name, p] : model.params) p.mutable_grad() = at::Tensor();
    model.loss(x.narrow(0, 8 * r, 8)).backward();
    ddp.finish_gradient_sync();
    expect_close(model.params[0].second.grad(), want[0], "second step gradient of w1");
    LOOM_CHECK(ddp.stats().steps_synced == 2, "steps synced");
  });
  LOOM_EXPECT_RANKS_OK(errors);
}

}  // namespace
}  // namespace loom
