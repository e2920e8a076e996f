// loom's CUDA kernels (label "cuda": a GPU machine only) against the ATen compositions they
// replace, forward and backward, in float32 and bfloat16, through the seam the models call. Their
// math is also replayed on the CPU by test_cuda_kernel_math.cpp in the default suite.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <vector>

#include "loom/core/cuda_support.h"
#include "loom/models/kernels/cross_entropy.h"
#include "loom/models/kernels/cuda.h"
#include "loom/models/kernels/rms_norm.h"
#include "loom/models/kernels/rotary.h"
#include "loom/models/kernels/squared_norm.h"
#include "loom/models/kernels/swiglu.h"
#include "loom/models/loss.h"
#include "loom/protocols/repeated_backward.h"
#include "loom/quantize/float8.h"
#include "loom/quantize/float8_cuda.h"
#include "loom/quantize/float8_grouped.h"

namespace {
namespace test_cuda_kernels {

namespace kernels = loom::models::kernels;

// Enables loom's kernels for one scope.
class KernelsOn {
 public:
  explicit KernelsOn(bool on) { kernels::set_cuda_kernels_enabled(on); }
  ~KernelsOn() { kernels::set_cuda_kernels_enabled(false); }
};

at::Tensor cuda_randn(std::vector<int64_t> shape, at::ScalarType dtype, double scale = 1.0) {
  return (at::randn(shape, at::TensorOptions().device(at::kCUDA)) * scale).to(dtype);
}

// Within one rounding of the dtype (bfloat16: 2^-8) relative to the reference's scale, plus
// float32 arithmetic in a different order.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype,
                  const char* what) {
  const at::Tensor a = actual.to(at::kDouble).cpu(), e = expected.to(at::kDouble).cpu();
  const double scale = std::max(e.abs().max().item<double>(), 1e-30);
  const double tol = dtype == at::kBFloat16 ? 1.6e-2 : 2e-5;
  const double worst = ((a - e).abs() / scale).max().item<double>();
  EXPECT_LE(worst, tol) << what << " (" << dtype << "): largest difference " << worst
                        << " of the scale " << scale;
}

std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : inputs) out.push_back(t.detach().clone().requires_grad_(true));
  return out;
}

TEST(CudaKernels, TheLibraryHasThemAndTheSwitchSelectsThem) {
  ASSERT_NE(kernels::cuda_kernels(), nullptr) << kernels::cuda_kernels_status();
  // This GPU's architecture is among the build's (LOOM_CUDA_ARCHITECTURES): the probe says so.
  EXPECT_EQ(kernels::cuda_kernels()->device_support(0), "");
  EXPECT_TRUE(kernels::kernels_run_on(0));
  at::Tensor x = cuda_randn({4, 64}, at::kBFloat16);
  at::Tensor w = at::ones({64}, at::TensorOptions().device(at::kCUDA));
  EXPECT_FALSE(kernels::rms_norm_is_fused(x, w)) << "off by default (training.cuda_kernels)";
  KernelsOn on(true);
  EXPECT_TRUE(kernels::rms_norm_is_fused(x, w));
  EXPECT_TRUE(kernels::swiglu_is_fused(x, x));
  EXPECT_NE(kernels::cuda_kernels_status().find("loom's CUDA kernels"), std::string::npos);
}

TEST(CudaKernels, RmsNormAndTheResidualNormEqualATen) {
  at::manual_seed(1);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // 16384: 1024 threads a row (__launch_bounds__).
    for (int64_t dim : {40, 1000, 4096, 16384}) {
      const at::Tensor x = cuda_randn({3, 50, dim}, dtype), delta = cuda_randn({3, 50, dim}, dtype);
      const at::Tensor w =
          (1.0 + 0.1 * at::randn({dim}, at::TensorOptions().device(at::kCUDA))).to(dtype);
      const at::Tensor g1 = cuda_randn({3, 50, dim}, dtype), g2 = cuda_randn({3, 50, dim}, dtype);
      std::vector<std::vector<at::Tensor>> results;
      for (bool on : {false, true}) {
        KernelsOn scope(on);
        auto in = leaves({x, delta, w});
        auto [sum, y] = kernels::residual_rms_norm(in[0], in[1], in[2], 1e-5);
        EXPECT_EQ(kernels::residual_rms_norm_is_fused(in[0], in[1], in[2]), on);
        at::Tensor y_alone = kernels::rms_norm(in[0], in[2], 1e-5);
        ((sum * g1).sum() + (y * g2).sum() + (y_alone * g2).sum()).backward();
        results.push_back(
            {sum.detach(), y.detach(), y_alone.detach(), in[0].grad(), in[1].grad(), in[2].grad()});
      }
      const char* names[] = {"sum", "y", "y alone", "grad x", "grad delta", "grad weight"};
      for (size_t i = 0; i < results[0].size(); ++i) {
        expect_close(results[1][i], results[0][i], dtype, names[i]);
      }
    }
  }
}

TEST(CudaKernels, SwigluEqualsATen) {
  at::manual_seed(2);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor a = cuda_randn({7, 333}, dtype, 3.0), b = cuda_randn({7, 333}, dtype);
    const at::Tensor g = cuda_randn({7, 333}, dtype);
    std::vector<std::vector<at::Tensor>> results;
    for (bool on : {false, true}) {
      KernelsOn scope(on);
      auto in = leaves({a, b});
      at::Tensor out = kernels::swiglu(in[0], in[1]);
      (out * g).sum().backward();
      results.push_back({out.detach(), in[0].grad(), in[1].grad()});
    }
    expect_close(results[1][0], results[0][0], dtype, "silu(a) * b");
    expect_close(results[1][1], results[0][1], dtype, "grad a");
    expect_close(results[1][2], results[0][2], dtype, "grad b");
  }
}

TEST(CudaKernels, RotaryInBothLayoutsEqualsATen) {
  at::manual_seed(3);
  const int64_t bs = 2, seq = 33, q_heads = 8, k_heads = 2, head_dim = 128;
  const at::Tensor angles = at::outer(
      at::arange(seq, at::kFloat),
      at::pow(10000.0, -at::arange(0, head_dim, 2, at::kFloat) / static_cast<float>(head_dim)));
  const at::Tensor freqs = at::polar(at::ones_like(angles), angles).to(at::kCUDA);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (bool halves : {false, true}) {
      const at::Tensor q = cuda_randn({bs, seq, q_heads, head_dim}, dtype);
      const at::Tensor k = cuda_randn({bs, seq, k_heads, head_dim}, dtype);
      const at::Tensor gq = cuda_randn({bs, seq, q_heads, head_dim}, dtype);
      const at::Tensor gk = cuda_randn({bs, seq, k_heads, head_dim}, dtype);
      std::vector<std::vector<at::Tensor>> results;
      for (bool on : {false, true}) {
        KernelsOn scope(on);
        auto in = leaves({q, k});
        auto [rq, rk] = kernels::rotary_qk(in[0], in[1], freqs, halves);
        ((rq * gq).sum() + (rk * gk).sum()).backward();
        results.push_back({rq.detach(), rk.detach(), in[0].grad(), in[1].grad()});
      }
      const char* names[] = {"q", "k", "grad q", "grad k"};
      for (size_t i = 0; i < 4; ++i) expect_close(results[1][i], results[0][i], dtype, names[i]);
    }
  }
}

TEST(CudaKernels, CrossEntropyEqualsATenAndCanWriteItsGradientOverTheLogits) {
  at::manual_seed(4);
  const int64_t rows = 64, vocab = 50257, ignore = -100;
  at::Tensor labels =
      at::randint(vocab, {rows}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
  labels.index_put_({at::indexing::Slice(0, 5)}, ignore);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor logits = cuda_randn({rows, vocab}, dtype, 3.0);
    at::Tensor reference_loss, reference_grad;
    {
      auto in = leaves({logits});
      reference_loss =
          at::cross_entropy_loss(in[0].to(at::kFloat), labels, {}, at::Reduction::Sum, ignore);
      (reference_loss * 0.5).backward();
      reference_grad = in[0].grad();
    }
    KernelsOn on(true);
    for (bool overwrite : {false, true}) {
      auto in = leaves({logits});
      at::Tensor x = in[0] * 1;  // a non-leaf the backward may overwrite
      ASSERT_TRUE(kernels::cross_entropy_is_fused(x, labels, ignore));
      at::Tensor loss = kernels::cross_entropy_sum(x, labels, ignore, overwrite);
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      (loss * 0.5).backward();
      expect_close(loss.detach(), reference_loss.detach(), at::kFloat, "loss");
      expect_close(in[0].grad(), reference_grad, dtype, "grad of the logits");
      if (overwrite) {
        EXPECT_TRUE(at::equal(x.detach(), in[0].grad())) << "the gradient is written over x";
      }
      // Backward twice through one graph (the zero-bubble schedules' input, then weight pass):
      // after an overwriting first pass the second is refused, never computed from a gradient
      // read as logits; without the overwrite both passes give the gradient.
      auto twice = leaves({logits});
      at::Tensor y = twice[0] * 1;
      at::Tensor loss2 = kernels::cross_entropy_sum(y, labels, ignore, overwrite);
      const auto first = torch::autograd::grad({loss2 * 0.5}, {twice[0]}, {}, true).at(0).clone();
      expect_close(first, reference_grad, dtype, "first of two passes");
      if (overwrite) {
        EXPECT_THROW(torch::autograd::grad({loss2 * 0.5}, {twice[0]}), std::exception);
      } else {
        const auto second = torch::autograd::grad({loss2 * 0.5}, {twice[0]}).at(0);
        EXPECT_TRUE(at::equal(first, second)) << "the same seed, the same gradient";
      }
    }
  }
}

// The training loss (models::cross_entropy_sum) writes its gradient over non-leaf logits, except
// while a RepeatedBackwardScope is alive (the pipeline executor opens one around the forwards
// of a stage whose backward the schedule splits).
TEST(CudaKernels, TheLossKeepsItsLogitsForAGraphBackpropagatedTwice) {
  KernelsOn on(true);
  const at::Tensor labels =
      at::randint(1000, {16}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
  for (const bool repeats : {false, true}) {
    auto in = leaves({cuda_randn({1, 16, 1000}, at::kBFloat16, 2.0)});
    at::Tensor logits = in[0] * 1;
    const at::Tensor before = logits.detach().clone();
    at::Tensor loss;
    {
      std::optional<loom::protocols::RepeatedBackwardScope> scope;
      if (repeats) scope.emplace();
      loss = loom::models::cross_entropy_sum(logits, labels.view({1, 16}));
    }
    loss.backward();
    EXPECT_EQ(at::equal(logits.detach(), before), repeats) << "repeats " << repeats;
  }
}

TEST(CudaKernels, SquaredNormAndClipEqualATenAndRepeatBitForBit) {
  at::manual_seed(5);
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 70; ++i) {  // three launches of 32, and both dtypes
    grads.push_back(cuda_randn({1 + 997 * i}, i % 3 == 0 ? at::kBFloat16 : at::kFloat));
  }
  double expected = 0;
  for (const auto& g : grads) expected += g.to(at::kDouble).pow(2).sum().item<double>();
  KernelsOn on(true);
  const at::Tensor first = kernels::squared_norm(grads);
  const at::Tensor second = kernels::squared_norm(grads);
  EXPECT_EQ(first.scalar_type(), at::kDouble);
  EXPECT_NEAR(first.item<double>(), expected, 1e-12 * expected);
  EXPECT_TRUE(at::equal(first, second)) << "a fixed summation order";

  std::vector<at::Tensor> clipped;
  for (const auto& g : grads) clipped.push_back(g.clone());
  const double max_norm = 0.25 * std::sqrt(expected);
  ASSERT_TRUE(kernels::clip_on_device(clipped, first, max_norm));
  const double coef = max_norm / (std::sqrt(expected) + 1e-6);
  for (size_t i = 0; i < grads.size(); ++i) {
    expect_close(clipped[i], grads[i].to(at::kDouble) * coef, grads[i].scalar_type(), "clipped");
  }
  std::vector<at::Tensor> kept;
  for (const auto& g : grads) kept.push_back(g.clone());
  ASSERT_TRUE(kernels::clip_on_device(kept, first, 4.0 * std::sqrt(expected)));
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(at::equal(kept[i], grads[i]));
}

// The fused float8 casts give ATen's quantize() bits on the GPU too: every scaling, both formats,
// power-of-two scales on and off, float32 and bfloat16, edge tiles.
TEST(CudaKernels, Float8CastsGiveQuantizesBits) {
  namespace q = loom::quantize;
  at::manual_seed(6);
  KernelsOn on(true);
  const q::Float8CudaCasts* casts = q::float8_cuda_casts();
  ASSERT_NE(casts, nullptr) << kernels::cuda_kernels_status();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = cuda_randn({200, 384}, dtype, 3.0);
    for (q::Float8Format format : {q::Float8Format::kE4M3, q::Float8Format::kE5M2}) {
      for (bool pow2 : {false, true}) {
        const std::pair<q::CastSpec, int64_t> cases[] = {
            {{q::Scaling::kTensorwise, format}, 1},   {{q::Scaling::kAxiswise, format}, 1},
            {{q::Scaling::kAxiswise, format}, 0},     {{q::Scaling::kBlockwise, format, 1}, 1},
            {{q::Scaling::kBlockwise, format, 1}, 0}, {{q::Scaling::kBlockwise, format, 128}, 1},
        };
        for (const auto& [spec, dim] : cases) {
          const q::Float8Tensor want = q::quantize(x, spec, dim, pow2);
          const q::Float8Tensor got = q::fused_quantize(*casts, x, spec, dim, pow2, nullptr);
          EXPECT_TRUE(at::equal(got.data.view(at::kByte), want.data.view(at::kByte)))
              << dtype << " " << q::to_string(format) << " pow2 " << pow2 << " dim " << dim;
          EXPECT_TRUE(at::equal(got.scale, want.scale));
          EXPECT_EQ(got.tile_rows, want.tile_rows);
          if (spec.scaling != q::Scaling::kTensorwise) continue;
          // With the transposed copy from the same pass: the GEMM of the transpose reads it.
          const q::Float8Tensor both = q::fused_quantize(*casts, x, spec, dim, pow2, nullptr, true);
          ASSERT_TRUE(both.transposed.defined());
          EXPECT_TRUE(at::equal(both.data.view(at::kByte), want.data.view(at::kByte)));
          EXPECT_TRUE(at::equal(both.transposed.view(at::kByte),
                                want.data.t().contiguous().view(at::kByte)));
          EXPECT_TRUE(both.t().data.is_contiguous()) << "the transpose is the row-major copy";
        }
      }
    }
  }
}

// On Hopper the experts' forward and grad_x GEMMs run as one at::_scaled_grouped_mm (uneven
// groups, an empty one included): output and both gradients equal the emulation of the same
// bf16 values on the CPU within bf16's rounding (the kernel accumulates in another order, and
// the forward with fast accumulation).
TEST(CudaKernels, Float8GroupedExpertsTakeTheGroupedKernelAndMatchTheEmulation) {
  namespace q = loom::quantize;
  const auto properties = loom::device::cuda_support()->properties(0);
  if (!properties || properties->major != 9) {
    GTEST_SKIP() << "at::_scaled_grouped_mm's float8 kernels are sm90's";
  }
  const at::Device gpu(at::kCUDA, 0);
  ASSERT_TRUE(q::float8_grouped_kernel_trusted(gpu)) << "the self-check refused the kernel";
  at::manual_seed(11);
  const at::Tensor x = cuda_randn({64, 128}, at::kBFloat16);
  const at::Tensor w = cuda_randn({4, 128, 96}, at::kBFloat16, 0.1);
  const at::Tensor grad = cuda_randn({64, 96}, at::kBFloat16);
  const at::Tensor counts = at::tensor(std::vector<int64_t>{7, 0, 25, 32});
  auto on_gpu = leaves({x, w});
  const at::Tensor y = q::float8_grouped_mm(on_gpu[0], on_gpu[1], counts.to(gpu));
  y.backward(grad);
  auto on_cpu = leaves({x.cpu(), w.cpu()});  // the emulation, of the same bf16 values
  const at::Tensor want = q::float8_grouped_mm(on_cpu[0], on_cpu[1], counts);
  want.backward(grad.cpu());
  expect_close(y, want, at::kBFloat16, "grouped output");
  expect_close(on_gpu[0].grad(), on_cpu[0].grad(), at::kBFloat16, "grad x");
  expect_close(on_gpu[1].grad(), on_cpu[1].grad(), at::kBFloat16, "grad w");
}

}  // namespace test_cuda_kernels
}  // namespace
