// Fused CPU kernels (src/models/kernels) against the unfused ATen ops they replace: forward
// values and both gradients, on sizes that exercise the vector loop, its tail and several
// intra-op tasks, and the fallback for inputs the kernel does not take.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "loom/models/kernels/swiglu.h"

namespace kernels = loom::models::kernels;

namespace {

struct SwigluResult {
  at::Tensor out, grad_a, grad_b;
};

SwigluResult run_swiglu(const at::Tensor& a0, const at::Tensor& b0, const at::Tensor& grad,
                        bool fused) {
  at::Tensor a = a0.detach().clone().set_requires_grad(true);
  at::Tensor b = b0.detach().clone().set_requires_grad(true);
  at::Tensor out = fused ? kernels::swiglu(a, b) : at::silu(a) * b;
  torch::autograd::backward({out}, {grad});
  return {out.detach(), a.grad(), b.grad()};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LE(diff, 1e-6 * std::max(scale, 1.0)) << what << ": max |diff| " << diff;
}

}  // namespace

TEST(FusedKernels, SwigluMatchesSiluTimesGate) {
  at::manual_seed(0);
  // 1 x 13: tail only; 4 x 257: vector loop + tail; 3 x 70001: several intra-op tasks.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 13}, {4, 257}, {3, 70001}, {2, 8, 768}}) {
    at::Tensor a = at::randn(shape) * 4;  // wide enough for exp to saturate on both ends
    at::Tensor b = at::randn(shape);
    at::Tensor g = at::randn(shape);
    ASSERT_TRUE(kernels::swiglu_is_fused(a, b));
    const SwigluResult fused = run_swiglu(a, b, g, true);
    const SwigluResult eager = run_swiglu(a, b, g, false);
    expect_close(fused.out, eager.out, "forward");
    expect_close(fused.grad_a, eager.grad_a, "grad a");
    expect_close(fused.grad_b, eager.grad_b, "grad b");
  }
}

TEST(FusedKernels, SwigluExtremeInputsStayFinite) {
  at::Tensor a = at::tensor({-200.0f, -88.0f, -20.0f, 0.0f, 20.0f, 88.0f, 200.0f});
  at::Tensor b = at::ones_like(a);
  const SwigluResult fused = run_swiglu(a, b, at::ones_like(a), true);
  const SwigluResult eager = run_swiglu(a, b, at::ones_like(a), false);
  EXPECT_TRUE(at::isfinite(fused.out).all().item<bool>());
  EXPECT_TRUE(at::isfinite(fused.grad_a).all().item<bool>());
  expect_close(fused.out, eager.out, "forward");
  expect_close(fused.grad_a, eager.grad_a, "grad a");
}

TEST(FusedKernels, SwigluGradcheckAgainstFiniteDifferences) {
  // Central differences in float32 on a smooth region: the analytic gradient of the kernel.
  at::manual_seed(1);
  at::Tensor a = at::randn({64});
  at::Tensor b = at::randn({64});
  const SwigluResult fused = run_swiglu(a, b, at::ones_like(a), true);
  const float h = 1e-2f;
  at::Tensor num_a = (at::silu(a + h) * b - at::silu(a - h) * b) / (2 * h);
  at::Tensor num_b = (at::silu(a) * (b + h) - at::silu(a) * (b - h)) / (2 * h);
  EXPECT_LE((fused.grad_a - num_a).abs().max().item<double>(), 2e-3);
  EXPECT_LE((fused.grad_b - num_b).abs().max().item<double>(), 2e-3);
}

TEST(FusedKernels, SwigluSameResultOnOneThreadAndMany) {
  at::manual_seed(2);
  at::Tensor a = at::randn({5, 40000});
  at::Tensor b = at::randn({5, 40000});
  at::Tensor g = at::randn({5, 40000});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const SwigluResult one = run_swiglu(a, b, g, true);
  at::set_num_threads(4);
  const SwigluResult many = run_swiglu(a, b, g, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one.out, many.out));
  EXPECT_TRUE(at::equal(one.grad_a, many.grad_a));
}

TEST(FusedKernels, SwigluFallsBackForInputsTheKernelDoesNotTake) {
  at::Tensor a = at::randn({8, 6});
  at::Tensor b = at::randn({8, 6});
  EXPECT_FALSE(kernels::swiglu_is_fused(a.t(), b.t()));  // not contiguous
  EXPECT_FALSE(kernels::swiglu_is_fused(a.to(at::kDouble), b.to(at::kDouble)));
  EXPECT_FALSE(kernels::swiglu_is_fused(a, b.narrow(1, 0, 3)));  // shapes differ
  at::Tensor ad = a.to(at::kDouble).set_requires_grad(true);
  at::Tensor out = kernels::swiglu(ad.t(), b.to(at::kDouble).t());
  EXPECT_TRUE(at::allclose(out, (at::silu(ad) * b.to(at::kDouble)).t()));
  out.sum().backward();
  EXPECT_TRUE(ad.grad().defined());
  const std::string isa = kernels::kernel_cpu_capability();
  EXPECT_TRUE(isa == "DEFAULT" || isa == "AVX2" || isa == "AVX512") << isa;
}
