// kernels::residual_rms_norm against what it replaces: the residual add, the fused RMSNorm, and
// autograd summing the two gradients of the residual stream. Both must agree bit for bit, so
// that training losses do not move.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "loom/models/kernels/rms_norm.h"

namespace kernels = loom::models::kernels;

namespace {

struct ResidualResult {
  at::Tensor sum, normed, grad_x, grad_delta, grad_w;
};

// (x + delta, rms_norm(x + delta)) with gradients g_sum and g_normed reaching the two outputs
// (an undefined one: that output unused), fused or composed. No delta: (x, rms_norm(x)).
ResidualResult run_residual(const at::Tensor& x0, const at::Tensor& delta0, const at::Tensor& w0,
                            const at::Tensor& g_sum, const at::Tensor& g_normed, bool fused) {
  at::Tensor x = x0.detach().clone().set_requires_grad(true);
  at::Tensor delta =
      delta0.defined() ? delta0.detach().clone().set_requires_grad(true) : at::Tensor();
  at::Tensor w = w0.detach().clone().set_requires_grad(true);
  at::Tensor sum, normed;
  if (fused) {
    EXPECT_TRUE(kernels::residual_rms_norm_is_fused(x, delta, w));
    std::tie(sum, normed) = kernels::residual_rms_norm(x, delta, w, 1e-5);
  } else {
    sum = delta.defined() ? x + delta : x;
    normed = kernels::rms_norm(sum, w, 1e-5);
  }
  std::vector<at::Tensor> outputs, grads;
  if (g_sum.defined()) {
    // The residual path, as the block uses it: a further add whose gradient reaches the sum.
    outputs.push_back(sum * 1.0);
    grads.push_back(g_sum);
  }
  if (g_normed.defined()) {
    outputs.push_back(normed);
    grads.push_back(g_normed);
  }
  torch::autograd::backward(outputs, grads);
  return {sum.detach(), normed.detach(), x.grad(), delta.defined() ? delta.grad() : at::Tensor(),
          w.grad()};
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (want.defined()) {
    EXPECT_TRUE(at::equal(got, want)) << what;
  }
}

void expect_same(const ResidualResult& fused, const ResidualResult& composed) {
  expect_same(fused.sum, composed.sum, "sum");
  expect_same(fused.normed, composed.normed, "normed");
  expect_same(fused.grad_x, composed.grad_x, "grad x");
  expect_same(fused.grad_delta, composed.grad_delta, "grad delta");
  expect_same(fused.grad_w, composed.grad_w, "grad weight");
}

// Widths: tail only (13), vector loop and tail (100), a model width (256); row counts below and
// above a grad_weight block (64 rows) and across several intra-op tasks.
const std::vector<std::vector<int64_t>> kShapes = {{1, 13}, {3, 100}, {8, 37, 256}, {700, 256}};

}  // namespace

TEST(ResidualNorm, AddAndNormEqualTheComposedOpsBitForBit) {
  at::manual_seed(11);
  for (const auto& shape : kShapes) {
    at::Tensor x = at::randn(shape) * 2, delta = at::randn(shape), w = at::randn({shape.back()});
    at::Tensor g_sum = at::randn(shape), g_normed = at::randn(shape);
    expect_same(run_residual(x, delta, w, g_sum, g_normed, true),
                run_residual(x, delta, w, g_sum, g_normed, false));
  }
}

TEST(ResidualNorm, PassThroughEqualsTheNormAndTheResidualBitForBit) {
  at::manual_seed(12);
  for (const auto& shape : kShapes) {
    at::Tensor x = at::randn(shape) * 2, w = at::randn({shape.back()});
    at::Tensor g_sum = at::randn(shape), g_normed = at::randn(shape);
    const ResidualResult fused = run_residual(x, at::Tensor(), w, g_sum, g_normed, true);
    expect_same(fused, run_residual(x, at::Tensor(), w, g_sum, g_normed, false));
    EXPECT_TRUE(at::equal(fused.sum, x));  // the residual path is x itself
  }
}

TEST(ResidualNorm, OneOutputUnused) {
  at::manual_seed(13);
  at::Tensor x = at::randn({70, 100}), delta = at::randn({70, 100}), w = at::randn({100});
  at::Tensor g = at::randn({70, 100});
  for (const at::Tensor& d : {delta, at::Tensor()}) {
    // Only the norm reaches the loss (the last block's stream), or only the sum.
    expect_same(run_residual(x, d, w, at::Tensor(), g, true),
                run_residual(x, d, w, at::Tensor(), g, false));
    expect_same(run_residual(x, d, w, g, at::Tensor(), true),
                run_residual(x, d, w, g, at::Tensor(), false));
  }
}

TEST(ResidualNorm, FallsBackForInputsTheKernelDoesNotTake) {
  at::Tensor x = at::randn({6, 8}, at::kDouble), delta = at::randn({6, 8}, at::kDouble);
  at::Tensor w = at::randn({8}, at::kDouble);
  EXPECT_FALSE(kernels::residual_rms_norm_is_fused(x, delta, w));
  EXPECT_FALSE(kernels::residual_rms_norm_is_fused(
      x.to(at::kFloat), delta.to(at::kFloat).t().contiguous().t(), w.to(at::kFloat)));
  auto [sum, normed] = kernels::residual_rms_norm(x, delta, w, 1e-6);
  EXPECT_TRUE(at::equal(sum, x + delta));
  EXPECT_TRUE(at::allclose(normed, at::rms_norm(x + delta, {8}, w, 1e-6)));
}
