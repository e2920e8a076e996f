// The math of loom's CUDA kernels, on the CPU: src/models/kernels/cuda/replay.h runs each kernel's
// threads through the kernels' own phase functions and reduction trees; these tests compare the
// replays with ATen (float64 references) in float32 and bfloat16. The kernels themselves are
// tested on a GPU by tests/unit/test_cuda_kernels.cpp (label cuda).
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "loom/models/kernels/cuda.h"
#include "loom/quantize/float8.h"
#include "models/kernels/cuda/replay.h"
#include "quantize/cuda/cast_replay.h"

namespace loom::models::kernels::cuda_math {
template <>
struct Scalar<c10::BFloat16> {
  static float load(c10::BFloat16 v) { return static_cast<float>(v); }
  static c10::BFloat16 store(float v) { return c10::BFloat16(v); }  // round to nearest even
};
}  // namespace loom::models::kernels::cuda_math

namespace {
namespace test_cuda_kernel_math {

namespace replay = loom::models::kernels::cuda_replay;
using BF16 = c10::BFloat16;

template <typename T>
at::ScalarType dtype_of() {
  return std::is_same_v<T, float> ? at::kFloat : at::kBFloat16;
}

// A tensor of T's dtype (values already representable in it), contiguous, on the CPU.
template <typename T>
at::Tensor random(std::vector<int64_t> shape, double scale = 1.0) {
  return (at::randn(shape, at::kDouble) * scale).to(dtype_of<T>()).contiguous();
}

template <typename T>
const T* data(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}
template <typename T>
T* data(at::Tensor& t) {
  return reinterpret_cast<T*>(t.mutable_data_ptr());
}
template <typename T>
const T* data_ptr_of(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}

// |actual - expected| <= atol + rtol |expected| element-wise, atol relative to the largest
// expected magnitude (one rounding of T at the output, plus float32 arithmetic).
void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                  const char* what) {
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  ASSERT_EQ(a.sizes(), e.sizes()) << what;
  const double scale = e.abs().max().item<double>();
  const double atol = rtol * std::max(scale, 1e-30);
  const double worst = ((a - e).abs() - rtol * e.abs()).max().item<double>();
  EXPECT_LE(worst, atol) << what << ": largest excess " << worst << " over a scale of " << scale;
}

// float32 outputs: float arithmetic; bfloat16: the output's rounding (2^-8) dominates.
template <typename T>
double rtol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-2;
}

template <typename T>
void check_rms_norm(int64_t rows, int64_t dim, bool with_delta) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " dim " << dim << " delta " << with_delta
                                  << " dtype " << dtype_of<T>());
  const double eps = 1e-5;
  at::Tensor x = random<T>({rows, dim}), delta = random<T>({rows, dim});
  at::Tensor weight = (1.0 + 0.1 * at::randn({dim}, at::kDouble)).to(at::kFloat);
  at::Tensor sum = at::empty_like(x), y = at::empty_like(x);
  at::Tensor rstd = at::empty({rows}, at::kFloat);
  replay::rms_norm_forward(data<T>(x), with_delta ? data<T>(delta) : nullptr,
                           weight.const_data_ptr<float>(), data<T>(sum), data<T>(y),
                           rstd.mutable_data_ptr<float>(), rows, dim, static_cast<float>(eps));
  // The reference norms the sum rounded to T, as the kernel (and the unfused ops) do.
  at::Tensor s = with_delta ? (x.to(at::kDouble) + delta.to(at::kDouble)).to(dtype_of<T>()) : x;
  if (with_delta) {
    EXPECT_TRUE(at::equal(sum, s)) << "x + delta, rounded once";
  }
  at::Tensor s64 = s.to(at::kDouble).requires_grad_(true);
  at::Tensor w64 = weight.to(at::kDouble).requires_grad_(true);
  at::Tensor r64 = (s64.pow(2).mean(-1, true) + eps).rsqrt();
  at::Tensor y64 = s64 * r64 * w64;
  expect_close(y, y64.detach(), rtol<T>(), "y");
  expect_close(rstd, r64.detach().squeeze(-1), 2e-6, "rstd");

  at::Tensor grad = random<T>({rows, dim}), residual = random<T>({rows, dim});
  y64.backward(grad.to(at::kDouble));
  at::Tensor grad_s = at::empty_like(x), grad_w = at::empty({dim}, at::kFloat);
  replay::rms_norm_backward(data<T>(grad), data<T>(s), weight.const_data_ptr<float>(),
                            rstd.const_data_ptr<float>(), data<T>(residual), data<T>(grad_s),
                            grad_w.mutable_data_ptr<float>(), rows, dim);
  expect_close(grad_s, s64.grad() + residual.to(at::kDouble), rtol<T>(), "grad of the sum");
  expect_close(grad_w, w64.grad(), std::is_same_v<T, float> ? 2e-5 : 2e-3, "grad of the weight");
}

TEST(CudaKernelMath, RmsNormWithAndWithoutTheResidualAddEqualsTheReference) {
  at::manual_seed(1);
  for (bool with_delta : {false, true}) {
    // 40: two warps with idle lanes; 1000: 256 threads; 150 rows: three weight-gradient chunks.
    check_rms_norm<float>(150, 40, with_delta);
    check_rms_norm<float>(3, 1000, with_delta);
    check_rms_norm<BF16>(150, 40, with_delta);
    check_rms_norm<BF16>(3, 1000, with_delta);
  }
  check_rms_norm<float>(2, 16384, true);  // 1024 threads a row
  check_rms_norm<BF16>(2, 16384, false);
}

template <typename T>
void check_swiglu(int64_t n) {
  at::Tensor a = random<T>({n}, 3.0), b = random<T>({n}), g = random<T>({n});
  at::Tensor out = at::empty_like(a), da = at::empty_like(a), db = at::empty_like(b);
  replay::swiglu_forward(data<T>(a), data<T>(b), data<T>(out), n);
  replay::swiglu_backward(data<T>(g), data<T>(a), data<T>(b), data<T>(da), data<T>(db), n);
  at::Tensor a64 = a.to(at::kDouble).requires_grad_(true);
  at::Tensor b64 = b.to(at::kDouble).requires_grad_(true);
  at::Tensor out64 = at::silu(a64) * b64;
  out64.backward(g.to(at::kDouble));
  expect_close(out, out64.detach(), rtol<T>(), "silu(a) * b");
  expect_close(da, a64.grad(), rtol<T>(), "grad a");
  expect_close(db, b64.grad(), rtol<T>(), "grad b");
}

TEST(CudaKernelMath, SwigluEqualsTheReference) {
  at::manual_seed(2);
  check_swiglu<float>(4099);
  check_swiglu<BF16>(4099);
}

// Rotates x [bs, seq, heads, head_dim] in float64: pairs read per `halves_in`, the result in the
// interleaved layout; the reference the kernel's forward must equal.
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& angles, bool halves_in) {
  const int64_t head_dim = x.size(-1), half = head_dim / 2;
  at::Tensor first = halves_in ? x.narrow(-1, 0, half) : x.slice(-1, 0, head_dim, 2);
  at::Tensor second = halves_in ? x.narrow(-1, half, half) : x.slice(-1, 1, head_dim, 2);
  const at::Tensor c = angles.cos().view({1, x.size(1), 1, half});
  const at::Tensor s = angles.sin().view({1, x.size(1), 1, half});
  return at::stack({first * c - second * s, first * s + second * c}, -1).flatten(-2);
}

template <typename T>
void check_rotary(bool halves) {
  SCOPED_TRACE(testing::Message() << "halves " << halves << " dtype " << dtype_of<T>());
  const int64_t bs = 2, seq = 5, heads = 3, head_dim = 8;
  at::Tensor x = random<T>({bs, seq, heads, head_dim});
  at::Tensor angles = at::outer(
      at::arange(seq, at::kDouble),
      at::pow(10000.0, -at::arange(0, head_dim, 2, at::kDouble) / static_cast<double>(head_dim)));
  // The kernel's table: [seq, head_dim] floats, (cos, sin) of each pair.
  at::Tensor rotation = at::stack({angles.cos(), angles.sin()}, -1).flatten(-2).to(at::kFloat);
  at::Tensor out = at::empty_like(x);
  replay::rotary(data<T>(x), rotation.const_data_ptr<float>(), data<T>(out), bs, seq, heads,
                 head_dim, halves, false, 1.f);
  at::Tensor x64 = x.to(at::kDouble).requires_grad_(true);
  at::Tensor ref = rope_reference(x64, angles, halves);
  expect_close(out, ref.detach(), rtol<T>(), "rotated");

  // The backward: the inverse rotation, read in pairs and written in the input's layout.
  at::Tensor grad = random<T>({bs, seq, heads, head_dim});
  ref.backward(grad.to(at::kDouble));
  at::Tensor grad_x = at::empty_like(x);
  replay::rotary(data<T>(grad), rotation.const_data_ptr<float>(), data<T>(grad_x), bs, seq, heads,
                 head_dim, false, halves, -1.f);
  expect_close(grad_x, x64.grad(), rtol<T>(), "grad x");
}

TEST(CudaKernelMath, RotaryInBothLayoutsEqualsTheReference) {
  at::manual_seed(3);
  for (bool halves : {false, true}) {
    check_rotary<float>(halves);
    check_rotary<BF16>(halves);
  }
}

template <typename T>
void check_cross_entropy(int64_t rows, int64_t vocab) {
  SCOPED_TRACE(testing::Message() << "vocab " << vocab << " dtype " << dtype_of<T>());
  const int64_t ignore = -100;
  at::Tensor logits = random<T>({rows, vocab}, 4.0);
  at::Tensor labels = at::randint(vocab, {rows}, at::kLong);
  labels[1] = ignore;
  at::Tensor row_loss = at::empty({rows}, at::kFloat), lse = at::empty({rows}, at::kFloat);
  replay::cross_entropy_forward(data<T>(logits), labels.const_data_ptr<int64_t>(), rows, vocab,
                                ignore, row_loss.mutable_data_ptr<float>(),
                                lse.mutable_data_ptr<float>());
  at::Tensor x64 = logits.to(at::kDouble).requires_grad_(true);
  at::Tensor per_row = at::cross_entropy_loss(x64, labels, {}, at::Reduction::None, ignore);
  expect_close(row_loss, per_row.detach(), 2e-6, "row losses");
  EXPECT_EQ(row_loss[1].item<float>(), 0.f) << "an ignored row adds nothing";
  expect_close(lse, at::logsumexp(x64.detach(), -1), 2e-6, "logsumexp");

  const float scale = 0.25f;
  (per_row.sum() * scale).backward();
  at::Tensor grad = at::empty_like(logits);
  replay::cross_entropy_backward(data<T>(logits), labels.const_data_ptr<int64_t>(),
                                 lse.const_data_ptr<float>(), scale, rows, vocab, ignore,
                                 data<T>(grad));
  expect_close(grad, x64.grad(), std::is_same_v<T, float> ? 1e-5 : 1e-2, "grad of the logits");
  EXPECT_EQ(grad[1].abs().max().item<double>(), 0.0) << "an ignored row gets no gradient";
}

TEST(CudaKernelMath, CrossEntropyEqualsTheReference) {
  at::manual_seed(4);
  check_cross_entropy<float>(6, 50);  // two warps, idle lanes
  check_cross_entropy<BF16>(6, 50);
  check_cross_entropy<float>(3, 20000);  // 1024 threads: 32 warps
  check_cross_entropy<BF16>(3, 20000);
}

TEST(CudaKernelMath, CrossEntropyOfALabelOutsideTheVocabularyIsNaN) {
  at::Tensor logits = random<float>({2, 10});
  const std::vector<int64_t> labels = {3, 10};
  float loss[2], lse[2];
  replay::cross_entropy_forward(data<float>(logits), labels.data(), 2, 10, -100, loss, lse);
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1])) << "the loss shows a label the device cannot raise on";
}

template <typename T>
void check_squared_norm_and_clip() {
  SCOPED_TRACE(testing::Message() << "dtype " << dtype_of<T>());
  // One element, a few blocks' worth, and more than the grid covers in one stride.
  std::vector<at::Tensor> tensors = {random<T>({1}), random<T>({10000}), random<T>({300001})};
  std::vector<const T*> pointers;
  std::vector<int64_t> sizes;
  double expected = 0;
  for (const at::Tensor& t : tensors) {
    pointers.push_back(data<T>(t));
    sizes.push_back(t.numel());
    expected += t.to(at::kDouble).pow(2).sum().item<double>();
  }
  const double total = replay::squared_norm(pointers, sizes);
  EXPECT_NEAR(total, expected, 1e-12 * expected);

  at::Tensor g = tensors[2].clone();
  const double max_norm = 0.5 * std::sqrt(total);
  replay::clip(data<T>(g), g.numel(), total, max_norm);
  const double coef = max_norm / (std::sqrt(total) + 1e-6);
  expect_close(g, tensors[2].to(at::kDouble) * coef, rtol<T>(), "clipped");
  at::Tensor unchanged = tensors[2].clone();
  replay::clip(data<T>(unchanged), unchanged.numel(), total, 2.0 * std::sqrt(total));
  EXPECT_TRUE(at::equal(unchanged, tensors[2])) << "a norm under max_norm changes no bit";
  replay::clip(data<T>(unchanged), unchanged.numel(), INFINITY, 1.0);
  replay::clip(data<T>(unchanged), unchanged.numel(), NAN, 1.0);
  EXPECT_TRUE(at::equal(unchanged, tensors[2])) << "a norm that is not finite is left as is";
}

TEST(CudaKernelMath, SquaredNormAndClipEqualTheReference) {
  at::manual_seed(5);
  check_squared_norm_and_clip<float>();
  check_squared_norm_and_clip<BF16>();
}

// The fused float8 casts (src/quantize/cuda) give quantize()'s bits: data byte for byte and
// scales exactly, for every scaling, both formats, power-of-two scales on and off, float32 and
// bfloat16 input, and blockwise tiles cut by the tensor's edge (200 rows).
template <typename T>
void check_float8_casts() {
  namespace q = loom::quantize;
  namespace f8 = loom::quantize::cuda_replay;
  using loom::quantize::cuda_math::Float8Kind;
  SCOPED_TRACE(testing::Message() << "dtype " << dtype_of<T>());
  at::Tensor x = random<T>({200, 384}, 3.0);
  x.index_put_({7, 5}, 0);  // zeros and a large outlier
  x.index_put_({9, 200}, 900.0);
  for (q::Float8Format format : {q::Float8Format::kE4M3, q::Float8Format::kE5M2}) {
    const Float8Kind kind =
        format == q::Float8Format::kE4M3 ? Float8Kind::kE4M3 : Float8Kind::kE5M2;
    for (bool pow2 : {false, true}) {
      SCOPED_TRACE(testing::Message() << q::to_string(format) << " pow2 " << pow2);
      auto expect_equal = [&](const q::Float8Tensor& want, const at::Tensor& data,
                              const at::Tensor& scales, const char* what) {
        EXPECT_TRUE(at::equal(data.view(at::kByte), want.data.view(at::kByte))) << what;
        EXPECT_TRUE(at::equal(scales.view(want.scale.sizes()), want.scale)) << what;
      };
      const auto fp8 = q::scalar_type(format);
      // Tensorwise: the amax pass, then the scale and the cast.
      {
        at::Tensor data = at::empty(x.sizes(), fp8);
        float scale = 0;
        const float a = f8::amax(data_ptr_of<T>(x), x.numel());
        if (format == q::Float8Format::kE4M3) {
          scale = f8::cast_tensorwise(data_ptr_of<T>(x), x.numel(), a, kind, pow2,
                                      data.mutable_data_ptr<c10::Float8_e4m3fn>());
        } else {
          scale = f8::cast_tensorwise(data_ptr_of<T>(x), x.numel(), a, kind, pow2,
                                      data.mutable_data_ptr<c10::Float8_e5m2>());
        }
        const q::Float8Tensor want = q::quantize(x, {q::Scaling::kTensorwise, format}, 1, pow2);
        expect_equal(want, data, at::full({}, scale), "tensorwise");
        // The same cast with its transposed copy in one pass (32 x 32 squares; 200 rows cut
        // the last ones).
        at::Tensor both = at::empty(x.sizes(), fp8);
        at::Tensor transposed = at::empty({384, 200}, fp8);
        float scale_t = 0;
        if (format == q::Float8Format::kE4M3) {
          scale_t =
              f8::cast_tensorwise_transposed(data_ptr_of<T>(x), 200, 384, a, kind, pow2,
                                             both.mutable_data_ptr<c10::Float8_e4m3fn>(),
                                             transposed.mutable_data_ptr<c10::Float8_e4m3fn>());
        } else {
          scale_t = f8::cast_tensorwise_transposed(data_ptr_of<T>(x), 200, 384, a, kind, pow2,
                                                   both.mutable_data_ptr<c10::Float8_e5m2>(),
                                                   transposed.mutable_data_ptr<c10::Float8_e5m2>());
        }
        expect_equal(want, both, at::full({}, scale_t), "tensorwise with its transpose");
        EXPECT_TRUE(
            at::equal(transposed.view(at::kByte), want.data.t().contiguous().view(at::kByte)))
            << "the transposed copy";
      }
      // Row-wise along either dimension, and each blockwise tile.
      struct Case {
        q::CastSpec spec;
        int64_t dim, tile_rows, tile_cols;
        const char* what;
      };
      const Case cases[] = {
          {{q::Scaling::kAxiswise, format}, 1, 1, 384, "per row"},
          {{q::Scaling::kAxiswise, format}, 0, 200, 1, "per column"},
          {{q::Scaling::kBlockwise, format, 1}, 1, 1, 128, "1 x 128 tiles"},
          {{q::Scaling::kBlockwise, format, 1}, 0, 128, 1, "128 x 1 tiles"},
          {{q::Scaling::kBlockwise, format, 128}, 1, 128, 128, "128 x 128 blocks"},
      };
      for (const Case& c : cases) {
        at::Tensor data = at::empty(x.sizes(), fp8);
        at::Tensor scales = at::empty(
            {(200 + c.tile_rows - 1) / c.tile_rows, (384 + c.tile_cols - 1) / c.tile_cols});
        if (format == q::Float8Format::kE4M3) {
          f8::cast_tiles(data_ptr_of<T>(x), 200, 384, c.tile_rows, c.tile_cols, kind, pow2,
                         data.mutable_data_ptr<c10::Float8_e4m3fn>(),
                         scales.mutable_data_ptr<float>());
        } else {
          f8::cast_tiles(data_ptr_of<T>(x), 200, 384, c.tile_rows, c.tile_cols, kind, pow2,
                         data.mutable_data_ptr<c10::Float8_e5m2>(),
                         scales.mutable_data_ptr<float>());
        }
        expect_equal(q::quantize(x, c.spec, c.dim, pow2), data, scales, c.what);
      }
    }
  }
}

TEST(CudaKernelMath, Float8CastsGiveQuantizesBits) {
  at::manual_seed(6);
  check_float8_casts<float>();
  check_float8_casts<BF16>();
}

// The switch and the status line: off by default; on, the kernels where the library has them
// (a GPU host, even with CUDA_VISIBLE_DEVICES empty) and ATen's compositions where it does not
// (this CPU machine).
TEST(CudaKernelMath, TheSwitchAndTheStatusLineSayWhichPathRuns) {
  namespace kernels = loom::models::kernels;
  EXPECT_FALSE(kernels::cuda_kernels_enabled()) << "opt-in: training.cuda_kernels";
  EXPECT_EQ(kernels::enabled_cuda_kernels(), nullptr);
  kernels::set_cuda_kernels_enabled(true);
  EXPECT_EQ(kernels::enabled_cuda_kernels(), kernels::cuda_kernels());
  const std::string status = kernels::cuda_kernels_status();
  kernels::set_cuda_kernels_enabled(false);
  if (kernels::cuda_kernels() == nullptr) {
    EXPECT_NE(status.find("ATen's compositions"), std::string::npos) << status;
  } else {
    EXPECT_NE(status.find("loom's CUDA kernels"), std::string::npos) << status;
  }
}

}  // namespace test_cuda_kernel_math
}  // namespace
