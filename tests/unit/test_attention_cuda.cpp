// Packed documents and sliding windows on a GPU (label "cuda"): FlashAttention's
// variable-length path (varlen_attention.h) is taken, passed its self-check, and equals the
// dense-mask reference in float32 on problems the self-check does not try (more documents, a
// one-token document, windows of 1 and of a whole document, grouped heads, float16).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <iostream>
#include <string>

#include "loom/protocols/attention_backend.h"
#include "loom/protocols/sdpa_choice.h"
#include "loom/protocols/varlen_attention.h"

namespace loom {
namespace {

double relative_difference(const at::Tensor& got, const at::Tensor& want) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  return (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>() / scale;
}

TEST(CudaAttention, PackedDocumentsTakeTheVarlenKernelsAndEqualTheDenseMask) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  const at::Device device(at::kCUDA, 0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(23);
  const int64_t b = 3, h = 8, hk = 2, s = 200, d = 128;
  // Row 0: documents of 1, 60 and 139 tokens; row 1: one document; row 2: ten of 20.
  at::Tensor documents = at::zeros({b, s}, at::kLong);
  documents[0].slice(0, 1, 61).fill_(1);
  documents[0].slice(0, 61, s).fill_(2);
  documents[2].copy_(at::arange(s, at::kLong).div(20, "floor"));
  const at::Tensor slots = at::arange(s, at::kLong);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t window : {0, 1, 17, 139}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + ", window " + std::to_string(window));
      auto random = [&](at::IntArrayRef shape) {
        return at::randn(shape, generator, at::kFloat).to(device);
      };
      const at::Tensor q32 = random({b, h, s, d}), k32 = random({b, hk, s, d});
      const at::Tensor v32 = random({b, hk, s, d}), dout = random({b, h, s, d});
      const at::Tensor q = q32.to(dtype).requires_grad_(true);
      const at::Tensor k = k32.to(dtype).requires_grad_(true);
      const at::Tensor v = v32.to(dtype).requires_grad_(true);
      models::TokenLayout layout;
      layout.documents = documents;
      models::LayerAttention layer;
      layer.window = window;
      ASSERT_TRUE(models::varlen_attention_applies(q, k, v, layout, layer))
          << "the device's self-check did not trust the kernels (see the warning above)";
      const at::Tensor out = models::local_attention(q, k, v, 0.088, layout, layer);
      const auto grads = torch::autograd::grad({out}, {q, k, v}, {dout.to(dtype)});
      const at::Tensor rq = q32.clone().requires_grad_(true);
      const at::Tensor rk = k32.clone().requires_grad_(true);
      const at::Tensor rv = v32.clone().requires_grad_(true);
      const at::Tensor want =
          models::masked_attention(rq, models::expand_heads(rk, h), models::expand_heads(rv, h),
                                   0.088, {slots, slots, documents, documents, window});
      const auto wants = torch::autograd::grad({want}, {rq, rk, rv}, {dout});
      EXPECT_LE(relative_difference(out, want), 3e-2);
      for (int i = 0; i < 3; ++i) EXPECT_LE(relative_difference(grads[i], wants[i]), 3e-2) << i;
    }
  }
}

// The measured choice among LibTorch's fused kernels: on Hopper FlashAttention and cuDNN both take
// bf16 causal attention of head dim 128; the winner equals LibTorch's own result, forward and
// backward, and the shape is measured once. Each kernel by name gives the same answer.
// gpt-oss's attention on a GPU without FSDP: bf16 q, k, v under autocast with float32 sinks go
// through the dense path, whose backward runs after the autocast region ended. Forward and
// backward equal the CPU's float computation from the same values (the dense path once ran its
// matmuls in bf16 under autocast and then failed in the backward on float32 x bf16).
TEST(CudaAttention, SinksUnderAutocastTrainInFloat) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  const at::Device device(at::kCUDA, 0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(29);
  const int64_t b = 2, h = 4, s = 96, d = 64;
  auto random = [&](at::IntArrayRef shape) {
    return at::randn(shape, generator, at::kFloat).to(at::kBFloat16);
  };
  const at::Tensor q0 = random({b, h, s, d}), k0 = random({b, h, s, d}), v0 = random({b, h, s, d});
  const at::Tensor dout = random({b, h, s, d});
  const at::Tensor sinks0 = at::randn({h}, generator, at::kFloat);
  const at::Tensor slots = at::arange(s, at::kLong);
  auto run = [&](const at::Device& on, bool autocast) {
    at::Tensor q = q0.to(on).requires_grad_(true), k = k0.to(on).requires_grad_(true);
    at::Tensor v = v0.to(on).requires_grad_(true), sinks = sinks0.to(on).requires_grad_(true);
    const models::MaskDescription where{slots, slots, {}, {}, /*window=*/32};
    at::Tensor out;
    if (autocast) {
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      out = models::masked_attention(q, k, v, 0.125, where, sinks);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    } else {
      out = models::masked_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), 0.125,
                                     where, sinks);
    }
    out.backward(dout.to(on).to(out.scalar_type()));
    return std::vector<at::Tensor>{out.cpu(), q.grad().cpu(), k.grad().cpu(), v.grad().cpu(),
                                   sinks.grad().cpu()};
  };
  const auto want = run(at::kCPU, false);
  const auto got = run(device, true);
  const char* names[] = {"out", "dq", "dk", "dv", "dsinks"};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LT(relative_difference(got[i], want[i]), 2e-2) << names[i];
  }
}

TEST(CudaAttention, TheFastestFusedKernelIsMeasuredOnceAndAgreesWithLibTorch) {
  ASSERT_GT(c10::cuda::device_count(), 0) << "no CUDA device";
  const at::Device device(at::kCUDA, 0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(29);
  const int64_t b = 2, h = 16, s = 1024, d = 128;
  auto random = [&] {
    return at::randn({b, h, s, d}, generator, at::kFloat).to(device, at::kBFloat16);
  };
  const at::Tensor q0 = random(), k0 = random(), v0 = random(), dout = random();
  const std::string before = models::sdpa_policy();
  auto attend = [&](const std::string& policy) {
    models::set_sdpa_policy(policy);
    const at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    const at::Tensor v = v0.clone().requires_grad_(true);
    const at::Tensor out = models::causal_fused_attention(q, k, v, 0.088);
    auto grads = torch::autograd::grad({out}, {q, k, v}, {dout});
    grads.insert(grads.begin(), out);
    return grads;
  };
  const auto want = attend("libtorch");
  const int measured_before = models::fused_sdpa_chooser().measurements();
  for (int repeat = 0; repeat < 2; ++repeat) {
    const auto got = attend("fastest");
    for (int i = 0; i < 4; ++i) EXPECT_LE(relative_difference(got[i], want[i]), 3e-2) << i;
  }
  EXPECT_EQ(models::fused_sdpa_chooser().measurements(), measured_before + 1);
  const at::Tensor probe = q0.clone().requires_grad_(true);
  const auto trials = models::fused_sdpa_chooser().trials(probe, k0, v0);
  ASSERT_EQ(trials.size(), 4u);
  int usable = 0;
  for (const auto& trial : trials) {
    usable += trial.usable ? 1 : 0;
    std::cout << trial.name << ": "
              << (trial.usable ? std::to_string(trial.ms) + " ms" : "refused: " + trial.refusal)
              << std::endl;
  }
  EXPECT_GE(usable, 2) << "LibTorch's pick and at least FlashAttention";
  for (const char* kernel : {"flash", "cudnn", "efficient"}) {
    SCOPED_TRACE(kernel);
    try {
      const auto got = attend(kernel);
      for (int i = 0; i < 4; ++i) EXPECT_LE(relative_difference(got[i], want[i]), 3e-2) << i;
    } catch (const std::exception& error) {
      // Only a kernel the measurement refused may refuse by name.
      for (const auto& trial : trials) {
        if (trial.name == kernel) {
          EXPECT_FALSE(trial.usable) << error.what();
        }
      }
    }
  }
  models::set_sdpa_policy(before);
}

}  // namespace
}  // namespace loom
