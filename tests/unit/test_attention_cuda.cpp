// Packed documents and sliding windows on a GPU (label "cuda"): FlashAttention's
// variable-length path (varlen_attention.h) is taken, passed its self-check, and equals the
// dense-mask reference in float32 on problems the self-check does not try (more documents, a
// one-token document, windows of 1 and of a whole document, grouped heads, float16).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

#include "loom/protocols/attention_backend.h"
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

}  // namespace
}  // namespace loom
